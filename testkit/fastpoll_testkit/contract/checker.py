"""The checker: verifies a run's history against the rules of docs/api.md, "The contract, as
checked". Pure functions of the history (no processes), so it is unit-tested on hand-made ones
(tests/test_contract_checker.py) and can be re-run on a saved history:
`python -m fastpoll_testkit.contract --check run/contract-*/history.jsonl`.

The model: one writer per user, so its writes are sequential and state i (the poll answer after
its i-th write) is known exactly; state 0 is the empty answer of a user with nothing stored.
User 0 is the room (run.ROOM): its writes are the room's publishes, its polls' bodies the room's
part of composed answers (docs/channels.md), so every rule judges it as a user.
"""

from __future__ import annotations

import bisect
import json
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from fastpoll_testkit.contract.history import (
    ANNOUNCE,
    APP,
    APP_PATH,
    APPS_DOWN,
    CACHE,
    CACHE_DELAY,
    CACHE_DOWN,
    CACHE_SLOW,
    CH_OVER_MAX,
    DB,
    DB_READ_ONLY,
    OBSERVED,
    POLLER,
    ROOM_USER,
    USER_LOCK,
    Fault,
    History,
    Op,
)

WRITES = ("publish", "read")
POLLS = ("poll", "cond", "held", "hostile", "final-nginx", "final-app", "stream")
NGINX_POLLS = ("poll", "cond", "held", "hostile", "final-nginx")
RULES = {
    "1-no-stale": "no poll sent after a write returned shows an older state",
    "2-nothing-lost": "after recovery every answer (nginx and app) is the model's final state",
    "3-held-bound": "held polls answered within the bound of a write (path healthy)",
    "4-5xx": "5xx only where the docs say",
    "5-nginx-poller": "nginx marks no poller failed outside a poller/cache fault",
    "6-hostile": "refused or ignored requests get the documented answer",
    "7-bad-input": "bad input to the API is refused with a well-formed 4xx",
    "8-held-stall": "held polls answered within the bound while cache reads are slow or stalled",
    "9-isolation": "a user's held order or hung cache node slows no other user",
    "10-no-skip": "a history read lists every acknowledged unread message after its id, no other",
    "11-stream": "a stream's events never go back, and a returned write reaches an open stream "
    "within the held bound (path healthy)",
    "12-payload": "a message an answer lists has the text and data its publish sent",
}


@dataclass
class Params:
    # Rule 3: a held poll is answered this long after the write that changed its answer
    # returned (plus twice the cache read delay injected then).
    held_bound_s: float = 0.25
    # A cache read delay counts for a held poll until this long after its fault ends, plus the
    # delay itself: answers the proxy received before the end still arrive up to the delay
    # late, and the ones behind them on the same connection wait for them.
    delay_margin_s: float = 0.05
    # After a fault on the announcement path ends: the subscriber's detection and reconnection
    # (docs/api.md: reconnect with a backoff up to 5 s) and the re-check when it resubscribes.
    announce_settle_s: float = 8.0
    # After a cache fault ends: the poll servers read replicas for recovery_ms (5 s) while the
    # outbox repairs; answers may come from the re-check meanwhile.
    cache_settle_s: float = 6.0
    # Rule 8: a held poll is answered this long after the write that changed its answer
    # returned while the cache's reads are slow or stalled (api.md: 300 ms + 5 x timeout_ms
    # from the announcement, 10 x with replicas; 1.3 s at 100 ms, and a margin).
    held_stall_bound_s: float = 2.0
    # Rule 9: how long another user's call or poll may take while one user's order is held.
    isolation_bound_s: float = 2.0
    # Around every fault window: scheduling slack of the clients and the nemesis.
    pad_s: float = 0.5
    # The period of the poll servers' timed-out get counts (History.cache_timeouts): a sample
    # at t counts gets that timed out in the period before it.
    timeout_sample_s: float = 0.25
    # After PostgreSQL is back: the app's pool replaces its dead connections.
    db_grace_s: float = 3.0
    # The outbox's rewrite of a key after the app's path to the cache heals (design.md: "within
    # about 1 s, 3 s at most").
    outbox_s: float = 3.0
    # The app's memcached client skips a node that timed out for 1 s (cache.py retry_timeout)
    # and fails fast while operations still hang on a suspect node: a write started this long
    # after an app-path fault ended may still return pending because of it.
    app_cache_skip_s: float = 1.0
    # The app's wait for a user's order before it answers 503 (api.md, "503, Retry-After").
    order_wait_s: float = 3.0
    # nginx's shed 503 is documented during a cache fault and this long after (misses refill).
    shed_grace_s: float = 3.0
    # nginx skips an app that failed for fastpoll_app_fail_timeout (the template's 2 s): one
    # restarted is back for nginx this long after it answers again.
    app_fail_s: float = 2.0
    # nginx logs in whole seconds, and a read timeout (5 s) is logged after the request.
    log_pad_s: float = 7.0


@dataclass
class Violation:
    rule: str
    what: str
    ops: list[Op] = field(default_factory=list)
    faults: list[Fault] = field(default_factory=list)


@dataclass
class RuleResult:
    checked: int = 0
    excluded: int = 0
    violations: list[Violation] = field(default_factory=list)


@dataclass
class Report:
    seed: int
    config: str
    rules: dict[str, RuleResult]
    t0: float
    # Faults the nemesis could not inject or heal (their "error"): the run did not test what
    # its schedule says, and what followed (a node never restarted, say) is the harness's, so
    # its verdict is void whatever the rules found.
    void: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.void and not any(r.violations for r in self.rules.values())


def _overlapping(
    faults: Iterable[Fault], lo: float, hi: float, before: float, after: float
) -> list[Fault]:
    """Faults whose window, widened by `before` and `after`, meets [lo, hi]."""
    return [f for f in faults if f.start - before <= hi and f.end + after >= lo]


def _touches(f: Fault, paths: Iterable[str]) -> bool:
    return any(p == q or (q.endswith(":") and p.startswith(q)) for p in f.paths for q in paths)


class _Model:
    def __init__(self, h: History) -> None:
        self.writes: dict[int, list[Op]] = {}
        self.unknown_from: dict[int, float] = {}  # a write with no definite answer: from then on
        for op in sorted((o for o in h.ops if o.kind in WRITES), key=lambda o: o.index):
            if op.index < 0:
                prev = self.unknown_from.get(op.user, op.start)
                self.unknown_from[op.user] = min(prev, op.start)
                continue
            self.writes.setdefault(op.user, []).append(op)
        # Per user, computed once: a 30-minute run judges about 10^5 polls against about 10^3
        # writes per user, which scanning the writes for every poll made take an hour.
        self._bodies = {u: [""] + [w.body or "" for w in ws] for u, ws in self.writes.items()}
        self._ends = {u: sorted(w.end for w in ws) for u, ws in self.writes.items()}
        self._starts = {u: sorted(w.start for w in ws) for u, ws in self.writes.items()}

    def bodies(self, user: int) -> list[str]:
        """The states S0, S1, ... of the user (do not modify: shared)."""
        return self._bodies.get(user, [""])

    def known(self, user: int, t: float) -> int:
        """How many writes of the user had returned by t (the state index a poll sent at t must
        show at least)."""
        return bisect.bisect_left(self._ends.get(user, []), t)

    def invoked(self, user: int, t: float) -> int:
        """How many writes had been invoked by t (no answer can show a later one)."""
        return bisect.bisect_left(self._starts.get(user, []), t)

    def certain(self, user: int, t: float) -> bool:
        return t < self.unknown_from.get(user, float("inf"))


def canonical(body: str | None) -> str | None:
    """The state an answer shows, as the model writes it: a user's unread count and newest
    message, a room's messages. Other fields (derived from these: a list of the newest unread,
    the id before the listed ones) are not compared; a body that is neither stays as it is."""
    if not body or body[0] != "{":
        return body
    try:
        doc = json.loads(body)
    except ValueError:
        return body
    if not isinstance(doc, dict):
        return body
    if "unread" in doc and "newest" in doc:
        doc = {"unread": doc["unread"], "newest": doc["newest"]}
    elif "messages" in doc and "error" not in doc:
        doc = {"messages": doc["messages"]}
    else:
        return body
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=False)


def _canonical_history(h: History) -> History:
    ops = [
        o
        if o.kind == "history"
        else replace(o, body=canonical(o.body), inm_body=canonical(o.inm_body))
        for o in h.ops
    ]
    return replace(h, ops=ops)


def check(h: History, p: Params | None = None) -> Report:
    p = p or Params()
    rules = {name: RuleResult() for name in RULES}
    _rule12(h, rules["12-payload"])  # on the answers as they came: canonical() drops the lists
    h = _canonical_history(h)
    t0 = min((o.start for o in h.ops), default=0.0)
    model = _Model(h)
    _rule1(h, model, p, rules["1-no-stale"])
    _rule2(h, model, rules["2-nothing-lost"])
    _rule3(h, model, p, rules["3-held-bound"])
    _rule4(h, p, rules["4-5xx"])
    _rule5(h, p, rules["5-nginx-poller"])
    _rule6(h, p, rules["6-hostile"])
    _rule7(h, rules["7-bad-input"])
    _rule8(h, model, p, rules["8-held-stall"])
    _rule9(h, p, rules["9-isolation"])
    _rule10(h, model, rules["10-no-skip"])
    _rule11(h, model, p, rules["11-stream"])
    void = [
        f"{f.kind} on {f.target or f.params.get('node', '?')} at {f.start - t0:.3f} s: "
        f"{f.params['error']}"
        for f in h.faults
        if "error" in f.params
    ]
    return Report(h.seed, h.config, rules, t0, void)


def _related(model: _Model, user: int, lo: int, hi: int) -> list[Op]:
    ws = model.writes.get(user, [])
    return ws[max(0, lo - 1) : hi + 1]


def _rule1(h: History, model: _Model, p: Params, r: RuleResult) -> None:
    for op in h.ops:
        if op.kind not in POLLS or op.status not in (200, 304) or op.body is None:
            continue
        if not model.certain(op.user, op.end):
            r.excluded += 1
            continue
        r.checked += 1
        bodies = model.bodies(op.user)
        m = model.known(op.user, op.start)
        hi = model.invoked(op.user, op.end)
        if op.body in bodies[m : hi + 1]:
            continue
        older = [j for j in range(m) if bodies[j] == op.body]
        if older and _app_path_exception(h, model, p, op, older[-1], m):
            r.excluded += 1
            continue
        what = (
            f"user {op.user}: {op.kind} shows state {older[-1]}, sent after write {m} returned"
            if older
            else f"user {op.user}: {op.kind} shows an answer no write made ({op.body!r})"
        )
        if m and model.writes[op.user][m - 1].headers.get("x-cache-publish") == "pending":
            what += " (that write returned X-Cache-Publish: pending)"
        # The evidence: the faults from the missed write's start (and recently ended ones).
        since = model.writes[op.user][m - 1].start if m else op.start
        around = _overlapping(h.faults, since, op.end, p.pad_s, p.cache_settle_s)
        related = [*_related(model, op.user, m, hi), op]
        r.violations.append(Violation("1-no-stale", what, related, around))


def _app_path_exception(h: History, model: _Model, p: Params, op: Op, j: int, m: int) -> bool:
    """design.md, "Where the rule holds, and where not": when only the app's path to a cache node
    fails (no poll server sees a failure), or a Redis cache hangs and resumes, "the older answer
    is served until the outbox rewrites the key (within about 1 s, 3 s at most)". So a poll may
    show state j, older than state m, if every write j+1..m returned X-Cache-Publish: pending and
    such a fault was in effect after write j+1 started (its end widened by pad_s, and by
    app_cache_skip_s: the app's client still skips the node, or fails fast behind operations
    that hang on it) and ended at most outbox_s before the poll was sent."""
    missed = model.writes[op.user][j:m]
    if any(w.headers.get("x-cache-publish") != "pending" for w in missed):
        return False
    return any(
        (_touches(f, [APP_PATH]) or _unseen_hang(h, f, op))
        and f.start - p.pad_s <= op.start  # in effect before the poll: a later one excuses nothing
        and f.end + p.pad_s + p.app_cache_skip_s >= missed[0].start
        and f.end + p.outbox_s >= op.start
        for f in h.faults
    )


def _unseen_hang(h: History, f: Fault, op: Op) -> bool:
    """design.md, the same list: "on a poll server started after the node came back (it saw no
    failure)". A node hung (f) and a poll server restarted between the hang's start and the
    poll: the restarted one may read the node at once, before the outbox rewrote the key."""
    return _touches(f, [CACHE_DOWN]) and any(
        g.kind == "poller-restart" and g.end >= f.start and g.start <= op.start for g in h.faults
    )


def _rule2(h: History, model: _Model, r: RuleResult) -> None:
    for op in h.ops:
        if op.kind == "drain":
            r.checked += 1
            if op.status != 200:
                r.violations.append(Violation("2-nothing-lost", op.note, [op]))
            continue
        if op.kind not in ("final-nginx", "final-app"):
            continue
        if not model.certain(op.user, op.end):
            r.excluded += 1
            continue
        r.checked += 1
        final = model.bodies(op.user)[-1]
        if op.status != 200 or op.body != final:
            n = len(model.bodies(op.user)) - 1
            what = f"user {op.user}: after recovery {op.kind} answers {op.status} {op.body!r}, "
            what += f"the model's state {n} is {final!r}"
            r.violations.append(
                Violation("2-nothing-lost", what, [*_related(model, op.user, n, n), op])
            )


def _blocking(faults: list[Fault], lo: float, hi: float, p: Params) -> list[Fault]:
    """Faults that excuse a late held poll in [lo, hi]: on the announcement path or the cache
    (held, hung, killed, or judged so by a poll server; each with its settle time after it
    ends), or a poll server restart."""
    settles = (
        (ANNOUNCE, p.announce_settle_s),
        (CACHE, p.cache_settle_s),
        (CACHE_SLOW, p.cache_settle_s),
        (OBSERVED, p.cache_settle_s),
        (POLLER, p.pad_s),
    )
    return [
        f
        for f in faults
        for path, settle in settles
        if _touches(f, [path]) and f.start - p.pad_s <= hi and f.end + settle >= lo
    ]


def _read_delay(faults: list[Fault], lo: float, hi: float, p: Params) -> float:
    """The largest cache read delay injected in [lo, hi]: of the cache-delay faults whose window,
    widened by pad_s before and by their own delay and delay_margin_s after, meets it."""
    return max(
        (
            f.delay_s
            for f in faults
            if CACHE_DELAY in f.paths
            and f.start - p.pad_s <= hi
            and f.end + f.delay_s + p.delay_margin_s >= lo
        ),
        default=0.0,
    )


def _hit_latency(hits: list[Op], lo: float, hi: float) -> float:
    """The longest time a plain or conditional poll through nginx took to be answered from the
    cache while it overlapped [lo, hi]: what the machine itself needed then for a request that
    waits on nothing (a stalled box answers hits in hundreds of ms; rule 3's bound is not about
    that). `hits` is sorted by start."""
    longest = 0.0
    for o in hits:
        if o.start >= hi:
            break
        if o.end > lo:
            longest = max(longest, o.end - o.start)
    return longest


@dataclass
class _Machine:
    """What the machine itself needed while a poll waited, by two measures: the longest cache
    hit overlapping the window (`_hit_latency`), and the client's own pauses then (History.
    stalls: the checker's process did not run, so an answer that came meanwhile was recorded
    that much later; with no request in flight across a pause, no hit shows it). For a poll the
    app answered (a room over the item size misses), also the longest plain or conditional poll
    the app answered then: the app's own time to compose that answer."""

    hits: list[Op]
    stalls: list[tuple[float, float]]
    app_polls: list[Op]

    def latency(self, lo: float, hi: float, app: bool = False) -> float:
        paused = sum(e - s for s, e in self.stalls if s < hi and e > lo)
        by_app = _hit_latency(self.app_polls, lo, hi) if app else 0.0
        return max(_hit_latency(self.hits, lo, hi), paused, by_app)


def _polls_from(h: History, source: str) -> list[Op]:
    """Plain and conditional polls through nginx answered 200 or 304 by source, by start."""
    return sorted(
        (
            o
            for o in h.ops
            if o.kind in ("poll", "cond") and o.status in (200, 304) and o.source == source
        ),
        key=lambda o: o.start,
    )


def _machine(h: History) -> _Machine:
    """Plain and conditional polls through nginx answered from the cache, the client's pauses,
    and the polls the app answered."""
    return _Machine(_polls_from(h, "cache"), sorted(h.stalls), _polls_from(h, "app"))


def _held_change(
    h: History, model: _Model, p: Params, op: Op, bound: float, delayed: bool, strict: bool
) -> tuple[int, float, float] | None:
    """For a held poll: the first write k (from the state known when the poll was sent) whose
    answer differs from the tag's, returned at t_k (or the poll's send time, if state k was
    already known then), and the deadline t_k + bound (+ twice an injected cache read delay if
    `delayed`, `_read_delay`; + outbox_s if W_k returned X-Cache-Publish: pending: the outbox
    writes and announces it), such that (`strict`, rule 3) no later write was invoked before the
    deadline (state k alone was current throughout), or (rule 8) no write invoked before the
    deadline made the tag's answer again (from t_k on the tag was never current). None if there
    is no such write before the wait's end."""
    bodies = model.bodies(op.user)
    ws = model.writes.get(op.user, [])
    m = model.known(op.user, op.start)
    for k in range(m, len(bodies)):
        if bodies[k] == op.inm_body:
            continue
        t_k = max(op.start, ws[k - 1].end) if k else op.start
        if t_k > op.start + op.wait - 1.0:
            return None  # the wait ends about then anyway
        deadline = t_k + bound
        if delayed:
            hi = t_k + bound + 0.2
            deadline += 2 * _read_delay(h.faults, op.start, hi, p)
        if k and ws[k - 1].headers.get("x-cache-publish") == "pending":
            # Not in the cache, not announced: the outbox's rewrite announces it (api.md:
            # within about 1 s, 3 s at most).
            deadline += p.outbox_s
        if strict:
            if k < len(ws) and ws[k].start <= deadline:
                continue  # the next write may have made the tag current again
        else:
            later = [j for j in range(k + 1, len(bodies)) if ws[j - 1].start <= deadline]
            if any(bodies[j] == op.inm_body for j in later):
                continue  # a later write may have made the tag current again
        return k, t_k, deadline
    return None


def _held_polls(h: History, model: _Model, r: RuleResult) -> Iterable[Op]:
    for op in h.ops:
        if op.kind != "held" or op.status not in (200, 304) or op.inm_body is None:
            continue
        if not model.certain(op.user, op.end):
            r.excluded += 1
            continue
        yield op


def _late(machine: _Machine, op: Op, t_k: float, deadline: float) -> float | None:
    """The deadline (plus the machine's own stall while the poll waited: the longest cache hit,
    the client's pauses, for one the app answered the longest poll the app answered) if the held
    poll was answered after it, else None."""
    if op.end <= deadline:
        return None
    deadline += machine.latency(t_k, op.end, op.source == "app")
    return deadline if op.end > deadline else None


def _rule3(h: History, model: _Model, p: Params, r: RuleResult) -> None:
    """A held poll whose tag stopped being current (`_held_change`) must be answered by the
    deadline, plus the machine's own stall then (`_Machine`: the longest cache hit, the client's
    pauses), unless a fault touched the announcement path, the cache (held, hung, killed, reads
    failing) or a poll server (`blocking`). Those with slow or stalled cache reads only are
    rule 8's."""
    machine = _machine(h)
    for op in _held_polls(h, model, r):
        found = _held_change(h, model, p, op, p.held_bound_s, True, True)
        if found is None:
            continue
        k, t_k, deadline = found
        r.checked += 1
        late = _late(machine, op, t_k, deadline)
        if late is None:
            continue
        wait = _order_wait(h, op, late, p)
        if op.end <= late + wait:
            continue
        late += wait
        if _blocking(h.faults, op.start, late, p) or _app_answered_in_restart(h, op, late, p):
            r.excluded += 1
            continue
        what = (
            f"user {op.user}: held poll (wait={op.wait}) answered {op.status} "
            f"{(op.end - t_k) * 1000:.0f} ms after write {k} returned "
            f"(bound {(late - t_k) * 1000:.0f} ms)"
        )
        window = _overlapping(h.faults, op.start, t_k + p.held_bound_s + 0.2, p.pad_s, p.pad_s)
        r.violations.append(
            Violation("3-held-bound", what, [*_related(model, op.user, k, k + 1), op], window)
        )


def _order_wait(h: History, op: Op, late: float, p: Params) -> float:
    """For a held poll the app answered: order_wait_s if the order of one of its users (a room
    poll's user too, `_op_users`) was held from outside (USER_LOCK) between its send and its
    deadline, else 0. The app's fill waits that long for the order, then answers without it
    (api.md, "503, Retry-After": the user's own requests wait for its held order)."""
    if op.source != "app":
        return 0.0
    users = _op_users(op)
    held = any(
        f.lock_users() & users and f.start - p.pad_s <= late and f.end + p.pad_s >= op.start
        for f in h.faults
    )
    return p.order_wait_s if held else 0.0


def _app_answered_in_restart(h: History, op: Op, late: float, p: Params) -> bool:
    """A held poll the app answered (its key missed: a room over the item size; or a cache get
    timed out on a loaded machine) went through nginx to an app process; one that was being
    restarted between the poll and its deadline (plus pad_s) may hold that request until its
    worker closes, and nginx then asks the other; one whose database was down or refusing
    writes then, or less than db_grace_s before, waits for its pool to replace the dead
    connections: the poll server's bound is not about the app's restart or its database."""
    if op.source != "app":
        return False
    return any(
        _touches(f, [APP, APPS_DOWN])
        and f.start - p.pad_s <= late
        and f.end + p.pad_s >= op.start
        or _touches(f, [DB, DB_READ_ONLY])
        and f.start - p.pad_s <= late
        and f.end + p.pad_s + p.db_grace_s >= op.start
        for f in h.faults
    )


def _rule8(h: History, model: _Model, p: Params, r: RuleResult) -> None:
    """Held polls while the cache's reads are slow (answers later than timeout_ms) or a node is
    stalled (SIGSTOP, under a second): a held poll whose tag stopped being current while such a
    fault met [s, t_k + bound] is answered within held_stall_bound_s of the write's return (as
    `_held_change`, outbox_s more for a pending write; plus the longest cache hit then), as a
    plain poll would be by the app. Not judged if another fault (not a slow or stalled read, nor
    the trouble the poll servers logged about it) touched the announcement path, the cache or a
    poll server then."""
    machine = _machine(h)
    slow = [f for f in h.faults if CACHE_SLOW in f.paths]
    others = [f for f in h.faults if CACHE_SLOW not in f.paths and OBSERVED not in f.paths]
    for op in _held_polls(h, model, r):
        found = _held_change(h, model, p, op, p.held_stall_bound_s, False, False)
        if found is None:
            continue
        k, t_k, deadline = found
        during = _overlapping(slow, op.start, t_k + p.held_bound_s + 0.2, p.pad_s, p.pad_s)
        if not during:
            continue
        r.checked += 1
        late = _late(machine, op, t_k, deadline)
        if late is None:
            continue
        if _blocking(others, op.start, late, p):
            r.checked -= 1
            r.excluded += 1
            continue
        what = (
            f"user {op.user}: held poll (wait={op.wait}) answered {op.status} "
            f"{(op.end - t_k) * 1000:.0f} ms after write {k} returned, cache reads slow or "
            f"stalled (bound {(late - t_k) * 1000:.0f} ms)"
        )
        r.violations.append(
            Violation("8-held-stall", what, [*_related(model, op.user, k, k + 1), op], during)
        )


def _lock_victims(f: Fault) -> set[int]:
    return f.lock_users()


def _op_users(op: Op) -> set[int]:
    """The users an operation waits for: its own, a batch's owners, and a room poll's user (its
    URL's own key: a miss composes both at the app)."""
    batch = op.kind == "api" and op.note.startswith("batch")
    room_poll = op.kind in POLLS and op.note.startswith("room poll")
    return {op.user, *(op.ids if batch or room_poll else [])}


ISOLATED = ("api", "poll", "cond", "bad-api")


def _rule9(h: History, p: Params, r: RuleResult) -> None:
    """While one user's order is held from outside (USER_LOCK), every other user's API call
    (publish, mark-read, batch without that user, poll URL, refusal) and plain or conditional
    poll through nginx sent during it is answered, 2xx-4xx, within isolation_bound_s. Not judged
    if any other fault met it (widened by pad_s, and db_grace_s after a database fault, the
    poll servers' logged cache trouble included): only users whose order and nodes are healthy
    are promised this."""
    for op in h.ops:
        # After each user-lock and after the drain, no idle session holds an order (a failed
        # write or batch let go of what it took): a leaked one slows its users' writes from
        # every other connection.
        if op.kind == "idle-orders":
            r.checked += 1
            if op.status != 200:
                r.violations.append(Violation("9-isolation", f"after the run: {op.note}", [op]))
    locks = [f for f in h.faults if USER_LOCK in f.paths]
    batches = [o for o in h.ops if o.kind == "api" and o.note.startswith("batch")]
    others = [f for f in h.faults if USER_LOCK not in f.paths]
    for op in h.ops:
        if op.kind not in ISOLATED:
            continue
        held = [f for f in locks if f.start <= op.start <= f.end]
        if not held or any(_lock_victims(f) & _op_users(op) for f in held):
            continue
        victims = set().union(*map(_lock_victims, held))
        # A batch naming the held user holds its other owners' orders while it waits for it
        # (api.md, rule 9: not promised): their calls then are not judged.
        if any(
            b.start <= op.end and b.end >= op.start and victims & set(b.ids) and op.user in b.ids
            for b in batches
        ):
            r.excluded += 1
            continue
        why = f"user {sorted(set().union(*map(_lock_victims, held)))}'s order was held"
        _judge_isolated(p, r, op, held, others, why)
    _node_isolation(h, p, r)


def _judge_isolated(
    p: Params, r: RuleResult, op: Op, met: list[Fault], others: list[Fault], why: str
) -> None:
    """Rule 9's verdict on an operation of a user the faults `met` do not concern: answered
    below 500 within isolation_bound_s, unless another fault met it (widened by pad_s, and
    db_grace_s after a database fault)."""
    near = _overlapping(others, op.start, op.end, p.pad_s, p.pad_s)
    db = _overlapping(others, op.start, op.end, p.pad_s, p.pad_s + p.db_grace_s)
    if near or any(_touches(f, [DB]) for f in db):
        r.excluded += 1
        return
    r.checked += 1
    took = op.end - op.start
    if op.status and op.status < 500 and took <= p.isolation_bound_s:
        return
    what = (
        f"user {op.user}: {op.kind} {op.note} answered {op.status or 'nothing'} in "
        f"{took:.2f} s while {why} (bound {p.isolation_bound_s:g} s)"
    )
    r.violations.append(Violation("9-isolation", what, [op], met))


# The faults of one cache node (hung, stalled or killed): with several nodes, they slow only the
# users with a copy of their key on it.
NODE_FAULTS = ("cache-hang", "cache-stall", "cache-kill")


def _op_nodes(h: History, op: Op) -> set[str]:
    """The cache nodes an operation may wait for: its users' keys' (and the room's, for a room
    poll or a batch with the room); None known: every node."""
    owners = _op_users(op) | ({ROOM_USER} if "room" in op.note else set())
    if any(str(o) not in h.placement for o in owners):
        return _all_nodes(h)
    return {n for o in owners for n in h.placement[str(o)]}


def _node_isolation(h: History, p: Params, r: RuleResult) -> None:
    """Rule 9 for the cache's nodes (with several): while one node is hung, stalled or killed,
    a user with no copy of its key there (nor of the room's, for a room poll) is answered as
    while a user's order is held: 2xx-4xx within isolation_bound_s. Not judged if any other
    fault met it (widened by pad_s, db_grace_s after a database fault)."""
    if not h.placement:
        return
    down = [f for f in h.faults if f.kind in NODE_FAULTS and f.target in _all_nodes(h)]
    for op in h.ops:
        if op.kind not in ISOLATED:
            continue
        met = [f for f in down if f.start <= op.start <= f.end]
        if not met or any(f.target in _op_nodes(h, op) for f in met):
            continue
        others = [f for f in h.faults if f not in met]
        why = (
            f"{', '.join(f.target for f in met)} (none of its nodes) was "
            f"{'/'.join(f.kind for f in met)}"
        )
        _judge_isolated(p, r, op, met, others, why)


def _all_nodes(h: History) -> set[str]:
    return {n for nodes in h.placement.values() for n in nodes}


def _states(model: _Model, op: Op) -> list[int]:
    """The model's states an answer can be: those with its body, invoked by its end."""
    bodies = model.bodies(op.user)
    hi = model.invoked(op.user, op.end)
    return [j for j in range(min(hi, len(bodies) - 1) + 1) if bodies[j] == op.body]


def _rule11(h: History, model: _Model, p: Params, r: RuleResult) -> None:
    """docs/api.md, "Event streams": rule 1 judges each event as a poll sent when its stream's
    connection was (the first event is no older than a write returned before it). Here: (a) a
    streaming client's events, in the order they came (across its reconnects), never show an
    older state than the one before; (b) a write that returned while one of its connections was
    open (from before the write returned to the bound after) is in an event by then, plus the
    longest cache hit then and twice an injected cache read delay (`_read_delay`), unless a
    fault touched the announcement path, the cache or a poll server (`_blocking`), or the write
    returned X-Cache-Publish: pending."""
    machine = _machine(h)
    events: dict[tuple[int, str], list[Op]] = {}
    conns: dict[tuple[int, str], list[Op]] = {}
    for op in h.ops:
        if op.kind in ("stream", "stream-conn"):
            client = (op.user, op.note.split(", connection")[0])
            (events if op.kind == "stream" else conns).setdefault(client, []).append(op)
    for evs in events.values():
        evs.sort(key=lambda o: o.end)
        prev: Op | None = None
        for op in evs:
            if not model.certain(op.user, op.end):
                r.excluded += 1
                continue
            states = _states(model, op)
            if prev is not None and states:
                r.checked += 1
                before = _states(model, prev)
                if (
                    before
                    and max(states) < min(before)
                    and _app_path_exception(h, model, p, op, max(states), min(before))
                ):
                    # The app answered the newer state (its cache write pending), the poll
                    # server the older one until the outbox rewrote it: rule 1's exception.
                    r.excluded += 1
                elif before and max(states) < min(before):
                    what = (
                        f"user {op.user}: {op.note}: an event shows state {max(states)} after "
                        f"one that showed state {min(before)}"
                    )
                    r.violations.append(Violation("11-stream", what, [prev, op]))
            prev = op
    for client, cs in conns.items():
        user = client[0]
        evs = events.get(client, [])
        for k, w in enumerate(model.writes.get(user, []), start=1):
            t_k = w.end
            bound = t_k + p.held_bound_s
            if w.index < 0 or not model.certain(user, bound):
                continue
            if not any(
                c.start <= t_k - 0.05
                and c.end >= bound + 0.5
                and c.status == 200
                and c.source == "cache"
                for c in cs
            ):
                continue
            # An event is a watch's read of the key, as a held poll's answer is: an injected
            # read delay counts twice here too (rule 3, `_held_change`).
            deadline = bound + machine.latency(t_k, bound + 1.0)
            deadline += 2 * _read_delay(h.faults, w.start, bound + 0.2, p)
            # The last event by then shows state k or a later one (an unchanged answer sends
            # no event: the last one may be from before the write).
            shown = [e for e in evs if e.end <= deadline]
            bodies = model.bodies(user)
            if shown and shown[-1].body in bodies[k : model.invoked(user, deadline) + 1]:
                r.checked += 1
                continue
            if w.headers.get("x-cache-publish") == "pending" or _blocking(
                h.faults, w.start, deadline, p
            ):
                r.excluded += 1
                continue
            r.checked += 1
            got = [e for e in evs if e.end > t_k]
            when = f"{(got[0].end - t_k) * 1000:.0f} ms after" if got else "never after"
            what = (
                f"user {user}: {client[1]}: write {k} reached the open stream {when} it returned "
                f"(bound {(deadline - t_k) * 1000:.0f} ms)"
            )
            window = _overlapping(h.faults, w.start, deadline, p.pad_s, p.pad_s)
            r.violations.append(
                Violation("11-stream", what, [*_related(model, user, k, k + 1), *got[:1]], window)
            )


def _history_list(op: Op) -> tuple[list[tuple[int, str]], bool] | None:
    """A history read's answer: its (id, text) list and `more`; None if malformed."""
    try:
        doc = json.loads(op.body or "")
        listed = [(int(m["id"]), str(m["text"])) for m in doc["messages"]]
        return listed, bool(doc["more"])
    except (ValueError, TypeError, KeyError):
        return None


def _up_to(op: Op) -> int:
    """A mark-read's up_to_id (its note: "up_to N ...")."""
    parts = op.note.split()
    return int(parts[1]) if len(parts) > 1 and parts[0] == "up_to" else -1


def _rule10(h: History, model: _Model, r: RuleResult) -> None:
    """A history read (after=A, sent at s, answered at e) lists, ascending, messages of the user
    with id > A that a publish made (its id and text; a publish without a definite answer, by its
    text), none marked read by a mark-read that returned before s; and every message whose
    publish returned before s with id > A, unless a mark-read up to it was sent before e, up to
    the last one listed when `more` says the list was cut."""
    pubs: dict[int, list[Op]] = {}
    reads: dict[int, list[Op]] = {}
    for o in h.ops:
        if o.kind == "publish":
            pubs.setdefault(o.user, []).append(o)
        elif o.kind == "read":
            reads.setdefault(o.user, []).append(o)
    for op in h.ops:
        if op.kind != "history" or op.status != 200:
            continue  # a failed read is rule 4's
        if not model.certain(op.user, op.end):
            r.excluded += 1
            continue
        r.checked += 1
        got = _history_list(op)
        if got is None:
            r.violations.append(Violation("10-no-skip", f"user {op.user}: malformed answer", [op]))
            continue
        listed, more = got
        after = op.ids[0] if op.ids else 0
        mine = pubs.get(op.user, [])
        by_id = {o.ids[0]: o for o in mine if o.ids}
        texts = {o.text for o in mine if not o.ids and o.start < op.end}
        read_before = max(
            (_up_to(o) for o in reads.get(op.user, []) if o.status == 200 and o.end < op.start),
            default=-1,
        )
        maybe_read = max(
            (_up_to(o) for o in reads.get(op.user, []) if o.start < op.end), default=-1
        )
        ids = [i for i, _ in listed]
        problems: list[str] = []
        if ids != sorted(set(ids)):
            problems.append(f"ids not ascending: {ids}")
        for i, text in listed:
            made = by_id.get(i)
            if i <= after:
                problems.append(f"lists {i}, not after {after}")
            elif made is not None and (made.text != text or made.start >= op.end):
                problems.append(f"lists {i} {text!r}, which its publish did not make then")
            elif made is None and text not in texts:
                problems.append(f"lists {i} {text!r}, which no publish made")
            elif i <= read_before:
                problems.append(f"lists {i}, marked read (up to {read_before}) before the read")
        last = ids[-1] if more and ids else float("inf")
        skipped = [
            o
            for o in mine
            if o.ids
            and o.status == 201
            and o.end < op.start
            and after < o.ids[0] <= last
            and o.ids[0] > maybe_read
            and o.ids[0] not in ids
        ]
        problems += [f"skips {o.ids[0]} (its publish returned before the read)" for o in skipped]
        if problems:
            what = f"user {op.user}: history read {op.note}: " + "; ".join(problems[:3])
            r.violations.append(Violation("10-no-skip", what, [*skipped[:3], op]))


def _listed_messages(doc: object) -> list[dict[str, object]]:
    """Every message an answer lists: a user's newest and listed ones, a room's, a composed
    answer's parts', a history read's."""
    if not isinstance(doc, dict):
        return []
    found = [m for m in doc.get("messages") or [] if isinstance(m, dict)]
    if isinstance(doc.get("newest"), dict):
        found.append(doc["newest"])
    parts = [doc.get("user"), *(doc.get("channels") or {}).values()] if "channels" in doc else []
    return found + [m for part in parts for m in _listed_messages(part)]


def _same_payload(listed: dict[str, object], made: Op) -> bool:
    """The listed message's text and data are the publish's: the same JSON (true is not 1),
    and "data" only when it sent data."""
    return (
        listed.get("text") == made.text
        and ("data" in listed) == (made.data is not None)
        and json.dumps(listed.get("data")) == json.dumps(made.data)
    )


def _rule12(h: History, r: RuleResult) -> None:
    """Whenever an answer (a poll's, a stream event's, a history read's) lists a message id
    that an acknowledged publish made, the listed text and data are exactly that publish's (no
    "data" when it sent none). Ids no acknowledged publish made are rules 1 and 10's."""
    sent = {o.ids[0]: o for o in h.ops if o.kind == "publish" and o.ids}
    for op in h.ops:
        if op.kind not in (*POLLS, "history") or op.status not in (200, 304) or not op.body:
            continue
        try:
            listed = _listed_messages(json.loads(op.body))
        except ValueError:
            continue  # not an answer: rules 1 and 10 judge it
        problems = []
        for m in listed:
            mid = m.get("id")
            made = sent.get(mid) if isinstance(mid, int) else None
            if made is None:
                continue
            r.checked += 1
            if not _same_payload(m, made):
                problems.append(
                    f"lists {made.ids[0]} with text {m.get('text')!r} data {m.get('data')!r}, "
                    f"its publish sent {made.text!r} data {made.data!r}"
                )
        if problems:
            what = f"user {op.user}: {op.kind} {op.note}: " + "; ".join(problems[:3])
            r.violations.append(Violation("12-payload", what, [op]))


def _cached_at(h: History) -> dict[int, list[float]]:
    """Per user, the times its key was known to be in the cache: a poll through nginx answered
    from it (X-Poll-Source: cache), or the end of a write answered X-Cache-Publish: ok. Not
    the room's writes: a room answer over the node's item size is replaced there by a marker that
    poll servers read as a miss, and the write is still ok (its polls go to the app)."""
    seen: dict[int, list[float]] = {}
    for op in h.ops:
        if op.kind in NGINX_POLLS and op.status in (200, 304) and op.source == "cache":
            seen.setdefault(op.user, []).append(op.start)
        elif (
            op.kind in WRITES and op.user != ROOM_USER and op.headers.get("x-cache-publish") == "ok"
        ):
            seen.setdefault(op.user, []).append(op.end)
    return seen


def _needed_the_app(h: History, p: Params, op: Op, seen: dict[int, list[float]]) -> bool:
    """A poll through nginx reaches the app only on a miss or a cache failure (operations.md,
    "The app is down": hits are still served). So it may have needed the app if a cache fault
    (any, a read delay included) met it or ended less than cache_settle_s before it was sent, or
    if its key was not seen in the cache since the last cache node hang or kill (the run's start
    if none) before it was sent, or if a poll server counted a cache get as timed out while it
    ran (History.cache_timeouts: the machine's load, no fault)."""
    paths = [CACHE, CACHE_DOWN, CACHE_DELAY, CACHE_SLOW, OBSERVED]
    near = _overlapping(h.faults, op.start, op.end, p.pad_s, p.pad_s + p.cache_settle_s)
    if any(_touches(f, paths) for f in near):
        return True
    # A poll server counted a cache get as timed out meanwhile: it may have been this poll's.
    if any(
        op.start - p.pad_s <= s["t"] and s["t"] - p.timeout_sample_s <= op.end + p.pad_s
        for s in h.cache_timeouts
    ):
        return True
    lost = max(
        (f.end for f in h.faults if _touches(f, [CACHE_DOWN]) and f.start <= op.start),
        default=float("-inf"),
    )
    if op.user == ROOM_USER:  # any room write may have made its answer too large to cache
        room = [o.start for o in h.ops if o.kind in WRITES and o.user == ROOM_USER]
        lost = max([lost, *(t for t in room if t <= op.start)])
    return not any(lost < t < op.start for t in seen.get(op.user, []))


def _no_app_live(h: History, p: Params, op: Op) -> bool:
    """With several app processes, each was restarting during the operation or less than
    app_fail_s before it (then nginx still skipped it): no app was live for nginx."""
    return h.apps > 1 and all(
        any(
            _touches(f, [APP + str(i)])
            and f.start - p.pad_s <= op.end
            and f.end + p.app_fail_s + p.pad_s >= op.start
            for f in h.faults
        )
        for i in range(h.apps)
    )


def _rule4(h: History, p: Params, r: RuleResult) -> None:
    """Each fault window is widened by pad_s on both sides, and by a grace after where the doc
    gives one."""
    seen = _cached_at(h)
    for op in h.ops:
        if op.kind in NGINX_POLLS or op.kind == "history":
            r.checked += 1
            if op.status and op.status < 500:
                continue
            around = _overlapping(h.faults, op.start, op.end, p.pad_s, p.pad_s)
            db = _overlapping(h.faults, op.start, op.end, p.pad_s, p.pad_s + p.db_grace_s)
            app_cannot = (
                any(_touches(f, [APPS_DOWN]) for f in around)
                or any(_touches(f, [DB]) for f in db)
                or _no_app_live(h, p, op)
            )
            # A history read always needs the app (nginx sends it there), and so does a URL
            # signed for more rooms than the poll servers hold (their 404 sends it there).
            only_app = op.kind == "history" or op.kind == "hostile" and CH_OVER_MAX in op.note
            if app_cannot and (only_app or _needed_the_app(h, p, op, seen)):
                continue
            shed = _overlapping(h.faults, op.start, op.end, p.pad_s, p.pad_s + p.shed_grace_s)
            # Every poll of a node whose reads fail goes to the app: shed beyond its share.
            shedding = [CACHE, CACHE_SLOW]
            if (
                op.status == 503
                and op.source == "shed"
                and any(_touches(f, shedding) for f in shed)
            ):
                continue
            what = f"user {op.user}: {op.kind} through nginx answered {op.status or 'nothing'}"
            if app_cannot:
                what += " (no app could answer, but its key was in the cache and no cache fault)"
            r.violations.append(Violation("4-5xx", what, [op], [*db, *shed]))
        elif op.kind in ("api", "bad-api"):
            r.checked += 1
            if op.status and op.status < 500:
                continue
            around = _overlapping(h.faults, op.start, op.end, p.pad_s, p.pad_s)
            db = _overlapping(h.faults, op.start, op.end, p.pad_s, p.pad_s + p.db_grace_s)
            if op.status == 503 and any(_touches(f, [DB]) for f in db):
                continue
            # api.md: 503 when the user's order stayed taken 3 s (a write stuck on the cache).
            stuck = _overlapping(h.faults, op.start, op.end, p.pad_s, p.pad_s + p.order_wait_s)
            if op.status == 503 and any(_touches(f, [CACHE, CACHE_DOWN]) for f in stuck):
                continue
            # The user's order held from outside: its writes (a batch's with it) wait, then 503.
            if op.status == 503 and any(_lock_victims(f) & _op_users(op) for f in stuck):
                continue
            # Writes refused by a read-only database: 503 with Retry-After (api.md), never 500.
            if (
                op.status == 503
                and "retry-after" in op.headers
                and any(_touches(f, [DB_READ_ONLY]) for f in db)
            ):
                continue
            if op.status == 0 and any(_touches(f, [APPS_DOWN, APP + op.target]) for f in around):
                continue
            what = f"user {op.user}: API {op.target and 'app' + op.target} {op.note} answered "
            what += f"{op.status or 'nothing'}"
            r.violations.append(Violation("4-5xx", what, [op], [*db, *stuck]))


def _rule5(h: History, p: Params, r: RuleResult) -> None:
    for line in h.nginx_errors:
        r.checked += 1
        t = float(str(line["t"]))
        poller = int(str(line.get("poller", -1)))
        paths = [CACHE_DOWN, POLLER + str(poller) if poller >= 0 else POLLER]
        around = _overlapping(h.faults, t, t, p.log_pad_s, p.log_pad_s)
        if any(_touches(f, paths) for f in around):
            r.excluded += 1
            continue
        near = [
            o
            for o in h.ops
            if o.kind == "hostile" and o.start - p.log_pad_s <= t <= o.end + p.log_pad_s
        ]
        r.violations.append(Violation("5-nginx-poller", f"nginx: {line['msg']}", near, around))


def _rule6(h: History, p: Params, r: RuleResult) -> None:
    """Hostile requests: a documented status, within the bound (op.wait). One the app answers
    (source "app": the poll server sends it there) while an app process was being restarted or
    its database was faulty (`_app_answered_in_restart`) may take longer: its status is judged,
    not its time."""
    for op in h.ops:
        if op.kind != "hostile" or op.status == 0 or op.status >= 500:
            continue  # rule 4 judges those
        r.checked += 1
        if op.status in op.expect and (op.wait <= 0 or op.end - op.start <= op.wait):
            continue
        if op.status in op.expect and _app_answered_in_restart(h, op, op.start + op.wait, p):
            r.checked -= 1
            r.excluded += 1
            continue
        what = f"{op.note}: answered {op.status or 'nothing'} in {op.end - op.start:.2f} s, "
        what += f"documented: {op.expect}" + (f" within {op.wait} s" if op.wait > 0 else "")
        r.violations.append(Violation("6-hostile", what, [op]))


def _rule7(h: History, r: RuleResult) -> None:
    """Bad input to the private API: one of the documented statuses, within the bound (op.wait),
    with a JSON object {"error": "<what is wrong>"} as its body. 5xx and no answer: rule 4. That
    nothing was stored is rules 1 and 2's: each request names a real user of the model."""
    for op in h.ops:
        if op.kind != "bad-api" or op.status == 0 or op.status >= 500:
            continue
        r.checked += 1
        try:
            doc = json.loads(op.body or "")
            well_formed = isinstance(doc, dict) and isinstance(doc.get("error"), str)
        except ValueError:
            well_formed = False
        took = op.end - op.start
        if op.status in op.expect and well_formed and took <= op.wait:
            continue
        what = f"{op.note}: answered {op.status} in {took:.2f} s with {op.body!r}, documented: "
        what += f'{op.expect} with {{"error": ...}} within {op.wait} s'
        r.violations.append(Violation("7-bad-input", what, [op]))


def _fmt_op(op: Op, t0: float) -> str:
    body = op.body if op.body is None or len(op.body) < 90 else op.body[:87] + "..."
    head = {
        k: v for k, v in op.headers.items() if k in ("x-poll-source", "etag", "x-cache-publish")
    }
    return (
        f"    {op.kind:<11} user {op.user:<4} {op.start - t0:8.3f}-{op.end - t0:8.3f} s "
        f"status {op.status} {op.target and 'via ' + op.target} index {op.index} "
        f"wait {op.wait} body {body!r} inm_body {op.inm_body!r} {head} {op.note}"
    )


def render(rep: Report, limit: int = 5) -> str:
    out = [f"contract check: config {rep.config}, seed {rep.seed}", ""]
    out.append(f"  {'rule':<16} {'checked':>8} {'excluded':>9} {'violations':>11}  meaning")
    for name, res in rep.rules.items():
        out.append(
            f"  {name:<16} {res.checked:>8} {res.excluded:>9} {len(res.violations):>11}  "
            f"{RULES[name]}"
        )
    for what in rep.void:
        out.append(f"\nVOID (seed {rep.seed}, config {rep.config}): the nemesis failed: {what}")
    if rep.void:
        out.append("  the run's verdict is void: it did not test what its schedule says")
    for name, res in rep.rules.items():
        for v in res.violations[:limit]:
            out.append(f"\nVIOLATION {name} (seed {rep.seed}, config {rep.config}): {v.what}")
            out.extend(_fmt_op(op, rep.t0) for op in v.ops)
            for f in v.faults:
                out.append(
                    f"    fault {f.kind} on {f.target} {f.start - rep.t0:8.3f}-"
                    f"{f.end - rep.t0:8.3f} s {f.params}"
                )
            if not v.faults:
                out.append("    (no fault active)")
        if len(res.violations) > limit:
            out.append(f"\n  ... and {len(res.violations) - limit} more {name} violations")
    return "\n".join(out)
