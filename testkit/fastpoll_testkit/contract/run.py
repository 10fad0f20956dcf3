"""One run of the contract checker on one configuration: a real stack (fastpoll_testkit.stack) with
fault proxies in its cache and announcement paths, the clients, the nemesis, the final recovery,
then the checker on the history.

Everything random (the users' operations and pauses, the kind of each poll, the hostile requests,
the fault schedule and each fault's parameters) is drawn from random.Random generators seeded from
the run's seed, so a seed replays the same schedule and the same choices; the interleaving with the
real processes is the operating system's, so a replay is likely, not certain, to show a violation
again.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import signal
import threading
import time
import urllib.request
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psycopg

from fastpoll_app import channels, keys
from fastpoll_app.cache import Placement
from fastpoll_app.store import PG_ORDER_CLASS, order_slot
from fastpoll_testkit import rawhttp
from fastpoll_testkit.contract import history as hist
from fastpoll_testkit.contract.checker import Params, Report, check
from fastpoll_testkit.contract.history import CH_OVER_MAX, ROOM_USER, Fault, History, Op
from fastpoll_testkit.contract.proxy import ProxyControl
from fastpoll_testkit.procs import free_port, freeze
from fastpoll_testkit.releases import PREVIOUS, PREVIOUS_HAS, extract
from fastpoll_testkit.sse import Event, EventStreamClient
from fastpoll_testkit.stack import PG_DB, PG_USER, Stack, memcached_stats


@dataclass(frozen=True)
class Config:
    name: str
    backend: str
    n_memcached: int
    db: str
    apps: int


CONFIGS = {
    c.name: c
    for c in (
        # make up's default: one memcached node without replicas, Redis for announcements.
        Config("mc1-sqlite", "memcached", 1, "sqlite", 1),
        # Three nodes, so every key has a replica; two app processes on one database.
        Config("mc3-pg", "memcached", 3, "postgresql", 2),
        Config("redis-pg", "redis", 0, "postgresql", 1),
    )
}

# The hostile client's requests (docs/api.md, "`wait`: long polls" and "If-None-Match"): what is
# appended to a valid signed poll URL, the If-None-Match sent, the documented statuses and the
# longest the answer may take (s). A refused request is 400 from nginx's poller and the app alike.
# Last, whether the app answers it (the poll server sends it there): its time is then the app's,
# recorded as source "app" (the app's refusals carry no X-Poll-Source) and judged as such.
HOSTILE: list[tuple[str, str | None, list[int], float, bool]] = [
    ("&WAIT=0&wait=30", "*", [400], 4.0, False),  # wait twice, any case: refused
    ("&wait=5&wait=5", None, [400], 4.0, False),
    ("&Wait=2&WAIT=3", "*", [400], 4.0, False),
    ("&wait=", None, [400], 4.0, False),
    ("&wait", "*", [400], 4.0, False),
    ("&wait=%31", None, [400], 4.0, False),  # never percent-decoded: not digits
    ("&wait=1234567", None, [400], 4.0, False),  # more than 6 digits
    ("&wait=-1", None, [400], 4.0, False),
    ("&w%61it=5", "*", [304], 4.0, False),  # not `wait`: an ordinary poll; `*` matches
    ("&WAIT=1", "*", [304], 5.0, False),  # case-insensitive: held 1 s, then 304
    ("", '"\x01abc"', [200], 4.0, False),  # a control byte: If-None-Match ignored, full answer
    ("", '"ab\x7fc"', [200], 4.0, False),
    ("", 'W/ "x"', [200], 4.0, False),  # malformed: ignored
    # Channels (docs/channels.md): a plain URL's signature covers no room; a bad ch is refused
    # (400 from the app; the poll server may refuse it as unsigned first: 403).
    ("&ch=room.c", None, [403], 4.0, False),
    ("&ch=room.d,room.c", None, [400, 403], 4.0, True),
    ("&ch=room.c&CH=room.d", "*", [400, 403], 4.0, True),
    ("&ch=", None, [400, 403], 4.0, True),
    # A URL validly signed for more rooms than the poll server's [channels] max (16): not the
    # poll server's to refuse as unsigned (403) but a 404 there, so nginx asks the app: 400.
    # (CH_OVER_MAX is the marker: over_max_url's URL, not a suffix.)
    (CH_OVER_MAX, None, [400], 4.0, True),
]


# Bad input to the private API (docs/api.md, "API", "Limits"; docs/channels.md, the batch): the
# path, the Content-Type, the body (from a real user's id: a request wrongly taken would change
# that user's answer, which rules 1 and 2 then see), the documented statuses. Each answer must be
# one of them with a JSON {"error": ...} body, and nothing stored.
def _bad_inputs(uid: int) -> list[tuple[str, str, bytes, list[int]]]:
    j = "application/json"
    item = f'{{"user_id":{uid},"text":"bad batch item"}}'
    return [
        ("/api/messages", j, b'{"user_id": %d, "text": ' % uid, [400]),  # truncated JSON
        ("/api/messages", j, b'{"user_id": "%d", "text": "x"}' % uid, [400]),  # a string id
        ("/api/messages", j, b'{"user_id": true, "text": "x"}', [400]),
        ("/api/messages", j, b'{"user_id": %d.0, "text": "x"}' % uid, [400]),
        ("/api/messages", j, b'{"user_id": 9223372036854775808, "text": "x"}', [400]),
        ("/api/messages", j, b'{"user_id": -1, "text": "x"}', [400]),
        ("/api/messages", j, b'{"user_id": %d, "text": "%s"}' % (uid, b"y" * 2001), [400]),
        ("/api/messages", j, b'{"user_id": %d, "text": "  "}' % uid, [400]),
        ("/api/messages", j, b'{"user_id": %d, "text": "a\\u0000b"}' % uid, [400]),
        ("/api/messages", j, b'{"user_id": %d, "text": "a", "text": "b"}' % uid, [400]),
        ("/api/messages", j, b'{"user_id": %d, "text": "a", "extra": 1}' % uid, [400]),
        ("/api/messages", j, b"[1, 2]", [400]),
        ("/api/messages", j, b"\xff\xfe", [400]),
        ("/api/messages", "text/plain", b'{"user_id": %d, "text": "x"}' % uid, [415]),
        ("/api/messages", j, b'{"user_id": %d, "text": "%s"}' % (uid, b"z" * 70000), [413]),
        ("/api/messages/read", j, b'{"user_id": %d}' % uid, [400]),
        ("/api/messages/read", j, b'{"user_id": %d, "up_to_id": "5"}' % uid, [400]),
        ("/api/messages/read", j, b'{"user_id": %d, "up_to_id": -5}' % uid, [400]),
        ("/api/poll-url", j, b'{"user_id": "x"}', [400]),
        ("/api/messages/batch", j, b'{"items": []}', [400]),
        ("/api/messages/batch", j, f'{{"items": [{",".join([item] * 1001)}]}}'.encode(), [400]),
        (  # one bad item refuses the whole batch: the good one is not stored either
            "/api/messages/batch",
            j,
            f'{{"items": [{item}, {{"user_id": {uid}, "text": "{"w" * 2001}"}}]}}'.encode(),
            [400],
        ),
        (
            "/api/messages/batch",
            j,
            b'{"items": [{"user_id": %d, "channel": "room.c", "text": "x"}]}' % uid,
            [400],
        ),
        ("/api/messages/batch", j, b'{"items": [{"channel": "bad name!", "text": "x"}]}', [400]),
        ("/api/messages/batch", j, b'{"items": {"user_id": %d}}' % uid, [400]),
    ]


BAD_INPUT_BOUND_S = 5.0  # the longest a refusal may take (it is decided before the database)

# The room (docs/channels.md): one writer publishes to it; some users' pollers poll their own key
# and the room on one URL. In the history and the model it is "user" ROOM_USER: its writes are
# the room's publishes, its polls' bodies the room's part of each composed answer.
ROOM = "room.c"
ROOM_HISTORY = 5  # [channels] history of the run's stack: the room's answer keeps 5 messages
# [app] answer_messages of the run's stack: a user's answer lists the newest 3 unread, so the
# users' answers carry "before" whenever more are unread.
USER_LISTED = 3
ROOM_POLLERS = (1, 2)  # users whose room pollers run (held, and plain/conditional)
_ROOM_MARK = f',"channels":{{"{ROOM}":'
# What a fault takes beyond its length (the nemesis waits for a restarted process to answer).
# After a user-lock, the wait before the idle-orders probe, and the time between its two looks
# (an order one idle session holds in both is a leaked one: a request holds one for milliseconds).
ORDER_PROBE_S = 1.0
# The faults whose reads are slow or stalled (rule 8's), and how long each other kind keeps the
# checker from judging a held poll after it ends (checker.Params: the cache's and the
# announcement path's settle times, a poll server's restart padding).
SLOW_READS = ("cache-slow-reads", "cache-read-stall")
_P = Params()
SETTLE_S = {
    "cache-hold-writes": _P.cache_settle_s,
    "cache-hang": _P.cache_settle_s,
    "cache-stall": _P.cache_settle_s,
    "cache-kill": _P.cache_settle_s,
    "redis-stop": max(_P.cache_settle_s, _P.announce_settle_s),
    "announce-cut": _P.announce_settle_s,
    "poller-restart": _P.pad_s,
}
# The longest a slow or stalled read fault waits for a held poll to exist before it begins.
HELD_AWAIT_S = 3.0
# The pulse thread (History.stalls): it sleeps PULSE_S at a time; a wake more than STALL_S late
# is a pause of this process, recorded.
PULSE_S = 0.01
STALL_S = 0.05
IDLE_HOLD_S = 1.0
# The longest a user-lock waits for the batch writer to send the batch naming the held users.
LOCK_BATCH_AWAIT_S = 5.0
OVERHEAD_S = {
    "app-restart": 2.0,
    "app-previous-release": 4.0,
    "pg-restart": 2.0,
    "cache-kill": 0.5,
    "poller-restart": 0.5,
    "user-lock": ORDER_PROBE_S + IDLE_HOLD_S,
}
ROOM_ITEM_SIZE = "16k"  # memcached -I on the memcached configurations
LONG_TEXT = "☃" * 2000  # the longest text (2,000 characters, 6,000 bytes): a third of the room's
ROOM_WRITERS = 2  # threads publishing to the room, besides the batches' room items
# Of a plain poller's turns, the share that is a history read (docs/api.md, "The history read"),
# and the limits it asks for (None: the default); a small one cuts the list, `more` says so.
HISTORY_SHARE = 0.15
# Users with an event stream (docs/api.md, "Event streams") beside their pollers, and the room
# stream's user (its URL with the room).
STREAM_USERS = (1, 2)
ROOM_STREAMERS = (1,)
HISTORY_LIMITS = (1, 2, None)
HELD_WAITS = (2, 3, 5)  # a held poll's `wait`
BATCH_USERS = 3  # users written by batches only


@dataclass
class Settings:
    seed: int
    seconds: float
    users: int = 6
    params: Params = field(default_factory=Params)
    # Fault kinds the schedule draws once more per deck (each time listed): the shapes of the
    # defects the checker must find (a slow first cache read of a held poll, a held cache write).
    priority: tuple[str, ...] = (
        "cache-delay-reads",
        "cache-delay-reads",
        "cache-hold-writes",
        "cache-read-stall",
    )


# A message of the model: its id, text and data (None: none).
Msg = tuple[int, str, object]
# Of the publishes (users', pairs', the room's, batch items), the share that carries data
# (docs/api.md, "Data"), chosen by the text's CRC so that no random draw of the run changes.
DATA_EVERY = 3


def payload_data(text: str) -> object:
    """The data a publish of `text` sends beside it (None: none): a marker and tags."""
    crc = zlib.crc32(text.encode())
    if crc % DATA_EVERY:
        return None
    return {"n": crc, "tags": [text.split()[0], "☃" * (crc % 3)]}


def _payload(text: str, data: object) -> dict[str, object]:
    """A request's (or a listed message's) text and, when it has one, data."""
    return {"text": text} if data is None else {"text": text, "data": data}


def _msg_doc(m: Msg) -> dict[str, object]:
    return {"id": m[0], **_payload(m[1], m[2])}


def _listed(msgs: list[Msg], bound: int) -> dict[str, object]:
    """The newest `bound` of msgs as an answer lists them (ascending), and "before": the id of
    the newest one older than those, when there is one."""
    ordered = sorted(msgs, key=lambda m: m[0])
    doc: dict[str, object] = {"messages": [_msg_doc(m) for m in ordered[-bound:]]}
    if len(ordered) > bound:
        doc["before"] = ordered[-bound - 1][0]
    return doc


def _user_body(unread: list[Msg], bound: int = USER_LISTED) -> str:
    """The poll answer of a user with these unread messages (docs/api.md, "The poll answer"): their
    count, the newest, the newest `bound` listed and "before"; empty when nothing is unread."""
    if not unread:
        return ""
    newest = _msg_doc(max(unread, key=lambda m: m[0]))
    doc = {"unread": len(unread), "newest": newest, **_listed(unread, bound)}
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=False)


def _room_body(msgs: list[Msg]) -> str:
    """The room's cached value after its writes: its newest ROOM_HISTORY messages and "before"."""
    if not msgs:
        return ""
    return json.dumps(_listed(msgs, ROOM_HISTORY), separators=(",", ":"), ensure_ascii=False)


def room_part(body: str) -> str:
    """The room's part of a composed answer ("" for null); the whole body if it is not one."""
    at = body.rfind(_ROOM_MARK)
    if at < 0 or not body.endswith("}}"):
        return body
    part = body[at + len(_ROOM_MARK) : -2]
    return "" if part == "null" else part


class Run:
    def __init__(self, config: Config, settings: Settings, run_dir: Path) -> None:
        self.config = config
        self.s = settings
        self.run_dir = run_dir
        self.history = History(seed=settings.seed, config=config.name, apps=config.apps)
        self.stop = threading.Event()  # the clients' end
        # Set as a cache-hold-writes fault releases its writes: the first room writer publishes
        # at once, a long text, while the held writes still go out (a connection every 10 ms):
        # a write the node refuses for size, then an older fill's held `add` landing after it.
        self.released = threading.Event()
        self.nemesis_stop = threading.Event()
        self.nemesis_thread: threading.Thread | None = None
        self.sampling_stop = threading.Event()  # after the final reads
        self.finishing = threading.Event()  # writers: one last publish and mark-read, then end
        # Users written by batches only (POST /api/messages/batch), after the single writers'.
        self.batch_users = list(range(settings.users + 1, settings.users + 1 + BATCH_USERS))
        self.batch_index = dict.fromkeys(self.batch_users, 0)  # their writes so far
        # Set by a user-lock once it holds its orders: the batch writer's next batch names every
        # batch user, the held one among them (its slots below the held one are taken first).
        self.lock_batch = threading.Event()
        self.lock_batch_sent = threading.Event()  # set by the batch writer as it sends that batch
        # The writers (the users', the batches', the room's) and finish().
        self.ready = threading.Barrier(settings.users + 1 + ROOM_WRITERS + 1, timeout=60)
        self.room_urls: dict[int, str] = {}
        self.final_hold = threading.Event()
        self.held_at: dict[int, float] = {}  # when each user's latest held poll was sent
        self.held_sent = threading.Condition()
        self.lock = threading.Lock()
        # The fault proxies (a process of their own): "memcached-0".., "redis", "announce".
        self.proxy: ProxyControl | None = None
        self.proxy_names: list[str] = []
        self.app_up = [threading.Event() for _ in range(config.apps)]
        for e in self.app_up:
            e.set()
        self.stack = Stack(
            run_dir=run_dir,
            backend=config.backend,
            n_memcached=max(1, config.n_memcached),
            n_pollers=2,
            db=config.db,
            apps=config.apps,
            # memcached's items at most 16 KiB (-I), under what the app's config allows a room
            # ([cache] item_max_bytes, 1 MiB by default): three long messages make the room's
            # answer too large to cache, and its polls must then go to the app.
            memcached_args=["-I", ROOM_ITEM_SIZE, "-o", "slab_chunk_max=8192"]
            if config.backend == "memcached"
            else [],
        )

    # ---- the stack, with proxies in its paths ------------------------------------------------

    def start(self) -> None:
        st = self.stack
        st.run_dir.mkdir(parents=True, exist_ok=True)
        st.memcached_ports = [free_port() for _ in range(st.n_memcached)]
        st.redis_port = free_port()
        ini: dict[str, dict[str, str]] = {}
        spec: dict[str, list[object]] = {}
        if self.config.backend == "memcached":
            for i, port in enumerate(st.memcached_ports):
                spec[f"memcached-{i}"] = [free_port(), port, "memcached"]
            servers = [f"127.0.0.1:{v[0]}" for v in spec.values()]
            ini["memcached"] = {"servers": " ".join(servers)}
        else:
            spec["redis"] = [free_port(), st.redis_port, "redis"]
            ini["redis"] = {"server": f"127.0.0.1:{spec['redis'][0]}"}
        spec["announce"] = [free_port(), st.redis_port, "none"]
        ini["announce"] = {
            "server": f"127.0.0.1:{spec['announce'][0]}",
            "password_file": str(st.run_dir / "redis.pass"),
        }
        self.proxy_names = list(spec)
        self.proxy = ProxyControl(spec, str(st.run_dir / "proxy.log"))
        ini["channels"] = {"history": str(ROOM_HISTORY)}
        ini["app"] = {"answer_messages": str(USER_LISTED)}
        for section, values in ini.items():
            st.extra_ini.setdefault(section, {}).update(values)
        st.start()
        with st.api() as api:  # the room pollers' URLs, as the site's backend gets them
            for uid in ROOM_POLLERS:
                r = api.post("/api/poll-url", json={"user_id": uid, "channels": [ROOM]})
                r.raise_for_status()
                self.room_urls[uid] = str(r.json()["url"])
        self.history.wall_offset = time.time() - time.monotonic()
        if self.config.backend == "memcached" and len(st.memcached_ports) > 1:
            self.history.placement = self._placement(ini["memcached"]["servers"].split())
        self._wait_subscribed(20.0)

    def _placement(self, servers: list[str]) -> dict[str, list[str]]:
        """Each owner's cache nodes by name, from the app's own placement of its key."""
        names = dict(zip(servers, self.proxy_names, strict=False))
        where = Placement(servers, replicas=1)
        try:
            owners = [*range(1, self.s.users + 1), *self.batch_users]
            out = {
                str(uid): [
                    names[n]
                    for n in where.nodes(
                        keys.derive_key(
                            b"/Poll", f"/getMessages?user_id={uid}".encode(), [b"user_id"]
                        )
                    )
                ]
                for uid in owners
            }
            room = channels.channel_key(b"/Poll", ROOM.encode())
            out[str(ROOM_USER)] = [names[n] for n in where.nodes(room)]
            return out
        finally:
            where.close()

    def _metric(self, url: str, name: str) -> float | None:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                text = r.read().decode()
        except OSError:
            return None
        for line in text.splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                return float(line.rsplit(" ", 1)[1])
        return None

    def _wait_subscribed(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for port in self.stack.admin_ports:
            url = f"http://127.0.0.1:{port}/metrics"
            while self._metric(url, "fastpoll_announce_subscribed") != 1.0:
                if time.monotonic() > deadline:
                    self.history.notes.append(f"poller admin {port}: not subscribed at start")
                    break
                time.sleep(0.1)

    def interrupt(self) -> None:
        """SIGINT or SIGTERM: the clients and the nemesis stop (a fault in progress ends first:
        nothing is started again once close() stops the stack)."""
        self.nemesis_stop.set()
        self.stop.set()
        # The signal may come between the thread's creation and its start.
        if self.nemesis_thread is not None and self.nemesis_thread.ident is not None:
            self.nemesis_thread.join(timeout=30)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            for name, proc in list(self.stack.procs.items()):
                with contextlib.suppress(OSError):  # a frozen process cannot take SIGTERM
                    os.kill(proc.pid, signal.SIGCONT)
                del name
        self.stack.stop()
        if self.proxy is not None:
            self.proxy.close()

    # ---- clients --------------------------------------------------------------------------

    def _data(self, text: str) -> object:
        """The data a publish of `text` sends (None: none). None at all in a run whose nemesis
        runs a release without data beside this tree's: a site sends data only once every app
        host is upgraded (docs/deploy.md), as such a release refuses it and answers its misses
        without it."""
        if "app-previous-release" in self.kinds() and "data" not in PREVIOUS_HAS:
            return None
        return payload_data(text)

    def _rng(self, *salt: object) -> random.Random:
        return random.Random(f"{self.s.seed}/{self.config.name}/" + "/".join(map(str, salt)))

    def writer(self, uid: int) -> None:
        """The user's writes, one at a time (or, with two app processes, sometimes two
        publishes at once, one on each: their order is their ids'): one to three publishes,
        then a mark-read up to the newest id shown or, sometimes, the one before it (a message
        stays unread). At the end, once nothing is unread, one publish and one mark-read while
        the cache writes are held (finish())."""
        rng = self._rng("writer", uid)
        clients = [self.stack.api(i, timeout=10) for i in range(self.config.apps)]
        unread: list[Msg] = []
        index = 0
        try:
            last_pair = 0  # writes left once the run is finishing (see finish())
            while not self.stop.is_set():
                if self.finishing.is_set() and last_pair == 0 and not unread:
                    # Nothing unread, the cache written: wait for the final hold (finish()),
                    # then a last publish and mark-read.
                    with contextlib.suppress(threading.BrokenBarrierError):
                        self.ready.wait()
                    self.final_hold.wait(60)
                    last_pair = 2
                publish = (last_pair == 2 or not unread) or (
                    not self.finishing.is_set() and len(unread) < 3 and rng.random() < 0.5
                )
                if publish and last_pair == 0 and self.config.apps > 1 and rng.random() < 0.25:
                    ops = self._publish_pair(uid, clients, rng, index, unread)
                elif publish:
                    app = (index + 1) % self.config.apps
                    text = f"u{uid} n{index + 1} {rng.getrandbits(32):08x}" + rng.choice(["", " ☃"])
                    op = Op("publish", uid, time.monotonic(), target=str(app), note=text, text=text)
                    op.data = self._data(text)
                    ok, got = self._write(
                        clients,
                        app,
                        op,
                        "/api/messages",
                        {"user_id": uid, **_payload(text, op.data)},
                        {"Idempotency-Key": f"k{uid}-{index + 1}"},
                    )
                    if ok:
                        op.ids = [int(got["id"])]
                        unread.append((op.ids[0], text, op.data))
                    ops = [(op, ok)]
                else:
                    app = (index + 1) % self.config.apps
                    partial = len(unread) > 1 and not self.finishing.is_set() and rng.random() < 0.4
                    up_to = unread[-2][0] if partial else unread[-1][0]
                    op = Op("read", uid, time.monotonic(), target=str(app), note=f"up_to {up_to}")
                    req: dict[str, object] = {"user_id": uid, "up_to_id": up_to}
                    ok, got = self._write(clients, app, op, "/api/messages/read", req, {})
                    if ok:
                        marked = [m for m in unread if m[0] <= up_to]
                        unread[:] = [m for m in unread if m[0] > up_to]
                        if got.get("marked_read") != len(marked):
                            op.note += f" marked_read {got.get('marked_read')} of {len(marked)}"
                    ops = [(op, ok)]
                for op, ok in ops:
                    index += 1
                    op.end = op.end or time.monotonic()
                    op.index = index if ok else -1
                    if ok:
                        op.body = _user_body(self._unread_at(unread, op))
                    self.history.add(op)
                if not all(ok for _, ok in ops):
                    return  # the model of this user is no longer exact: stop writing
                if last_pair:
                    last_pair -= 1
                    if last_pair == 0:
                        return
                    continue
                if self.finishing.is_set():
                    continue  # to the barrier: no pause
                # Half the time the next write races the user's next held poll: sent just after
                # that poll (whose first cache read may be slow), else after a pause.
                if rng.random() < 0.5:
                    self._after_next_held(uid, ops[-1][0].end)
                    self.stop.wait(rng.uniform(0.0, 0.01))
                else:
                    self.stop.wait(rng.uniform(0.3, 1.2))
        finally:
            for c in clients:
                c.close()

    @staticmethod
    def _unread_at(unread: list[Msg], op: Op) -> list[Msg]:
        """The unread messages right after op (unread: after the last of the writes just
        made; a publish of a pair made before the other one sees only the lower ids)."""
        if op.kind != "publish" or not op.ids:
            return unread
        return [m for m in unread if m[0] <= op.ids[0]]

    def _publish_pair(
        self,
        uid: int,
        clients: list[httpx.Client],
        rng: random.Random,
        index: int,
        unread: list[Msg],
    ) -> list[tuple[Op, bool]]:
        """Two publishes of the user at once, one on each app process: two app hosts writing one
        user. Both commit in the user's order, so their states follow their ids; the ops are
        returned in that order (a failed one last)."""
        texts = [f"u{uid} n{index + 1 + i} {rng.getrandbits(32):08x} pair" for i in range(2)]
        ops = [Op("publish", uid, 0.0, target=str(i), note=t, text=t) for i, t in enumerate(texts)]
        for op in ops:
            op.data = self._data(op.text)
        res: list[tuple[bool, dict[str, object]]] = [(False, {}), (False, {})]

        def one(i: int, client_list: list[httpx.Client]) -> None:
            ops[i].start = time.monotonic()
            res[i] = self._write(
                client_list,
                i,
                ops[i],
                "/api/messages",
                {"user_id": uid, **_payload(texts[i], ops[i].data)},
                {"Idempotency-Key": f"k{uid}-{index + 1 + i}"},
            )
            ops[i].end = time.monotonic()

        other = threading.Thread(target=one, args=(1, clients))  # httpx clients are thread-safe
        other.start()
        one(0, clients)
        other.join()
        for i in range(2):
            if res[i][0]:
                ops[i].ids = [int(str(res[i][1]["id"]))]
                unread.append((ops[i].ids[0], texts[i], ops[i].data))
        unread.sort(key=lambda m: m[0])
        pairs = [(ops[i], res[i][0]) for i in range(2)]
        pairs.sort(key=lambda p: (not p[1], p[0].ids[0] if p[0].ids else 0))
        return pairs

    def room_writer(self, n: int) -> None:
        """Publishes to the room, one message at a time, with pauses, starting on app process n
        (two such writers, and the batches' room items: several writers on the room); at the end
        one last publish while the cache writes are held (finish()). The first writer also
        publishes a long text as soon as a held-writes fault releases (self.released). The
        room's states follow its messages' ids: numbered once the run is over (renumber_room)."""
        rng = self._rng("room-writer", n)
        clients = [self.stack.api(i, timeout=10) for i in range(self.config.apps)]
        index = 0
        after_release = False
        try:
            while not self.stop.is_set():
                last = self.finishing.is_set()
                if last:
                    with contextlib.suppress(threading.BrokenBarrierError):
                        self.ready.wait()
                    self.final_hold.wait(60)
                index += 1
                app = (index + n) % self.config.apps
                text = f"room w{n} n{index} {rng.getrandbits(32):08x}" + rng.choice(["", " ☃"])
                if rng.random() < 0.35 or after_release:
                    text = (text + " " + LONG_TEXT)[:2000]  # the room may grow past -I
                op = Op("publish", ROOM_USER, time.monotonic(), target=str(app), text=text)
                op.note, op.data = text, self._data(text)
                ok, got = self._write(
                    clients,
                    app,
                    op,
                    f"/api/channels/{ROOM}/messages",
                    _payload(text, op.data),
                    {"Idempotency-Key": f"room-{n}-{index}"},
                )
                if ok:
                    op.ids = [int(got["id"])]
                op.end = time.monotonic()
                op.index = 0 if ok else -1
                self.history.add(op)
                if not ok or last:
                    return
                after_release = False
                if not self.finishing.is_set():
                    pause = rng.uniform(0.4, 2.0)
                    if n == 0:
                        after_release = self.released.wait(pause) and not self.stop.is_set()
                        self.released.clear()
                    else:
                        self.stop.wait(pause)
        finally:
            for c in clients:
                c.close()

    def renumber_room(self) -> None:
        """The room's writes in the order of their messages' ids (several writers: each
        publish commits in the room's order), each with the room's answer after it."""
        ops = sorted(
            (o for o in self.history.ops if o.user == ROOM_USER and o.kind == "publish"),
            key=lambda o: o.ids[0] if o.ids else 0,
        )
        msgs: list[Msg] = []
        for i, op in enumerate(o for o in ops if o.index >= 0):
            msgs.append((op.ids[0], op.text, op.data))
            op.index = i + 1
            op.body = _room_body(msgs)

    def batch_writer(self) -> None:
        """POST /api/messages/batch: each batch publishes to two or three of the batch users
        (and, half the time, the room) in one transaction; each item is a write of its owner in
        the model, as a single publish is, acknowledged by the batch's answer. Between batches,
        mark-reads of the batch users (up to the newest, or the one before). At the end, once
        nothing is unread, one batch of every batch user and the room while the cache writes are
        held, then a mark-read of each (finish())."""
        rng = self._rng("batch-writer")
        clients = [self.stack.api(i, timeout=10) for i in range(self.config.apps)]
        unread: dict[int, list[Msg]] = {u: [] for u in self.batch_users}
        n = 0
        try:
            last = False
            while not self.stop.is_set():
                if self.finishing.is_set() and not last:
                    if any(unread.values()):
                        for u in self.batch_users:
                            if unread[u] and not self._read_batch_user(clients, u, unread, False):
                                return
                    with contextlib.suppress(threading.BrokenBarrierError):
                        self.ready.wait()
                    self.final_hold.wait(60)
                    last = True
                n += 1
                if last:
                    owners: list[int] = list(self.batch_users) + [ROOM_USER]
                elif self.lock_batch.is_set():
                    self.lock_batch.clear()
                    owners = list(self.batch_users)
                    rng.shuffle(owners)
                    self.lock_batch_sent.set()
                else:
                    owners = rng.sample(self.batch_users, rng.choice([2, len(self.batch_users)]))
                    if rng.random() < 0.5:
                        owners.append(ROOM_USER)
                    rng.shuffle(owners)
                if not self._batch(clients, n, owners, rng, unread):
                    return
                if last:
                    # A user the last batch did not store (a definite refusal: the held order's
                    # 503) has nothing unread to mark.
                    for u in self.batch_users:
                        if unread[u] and not self._read_batch_user(clients, u, unread, False):
                            return
                    return
                if not self.finishing.is_set():
                    for u in self.batch_users:
                        if self.lock_batch.is_set():
                            break  # the held order's batch first: this user's read may wait
                        if unread[u] and rng.random() < 0.4:
                            partial = len(unread[u]) > 1 and rng.random() < 0.5
                            if not self._read_batch_user(clients, u, unread, partial):
                                return
                    self.lock_batch.wait(rng.uniform(0.3, 1.2))
        finally:
            for c in clients:
                c.close()

    def _read_batch_user(
        self,
        clients: list[httpx.Client],
        uid: int,
        unread: dict[int, list[Msg]],
        partial: bool,
    ) -> bool:
        up_to = unread[uid][-2][0] if partial else unread[uid][-1][0]
        app = uid % self.config.apps
        op = Op("read", uid, time.monotonic(), target=str(app), note=f"up_to {up_to}")
        ok, _ = self._write(
            clients, app, op, "/api/messages/read", {"user_id": uid, "up_to_id": up_to}, {}
        )
        op.end = time.monotonic()
        self.batch_index[uid] += 1
        op.index = self.batch_index[uid] if ok else -1
        if ok:
            unread[uid] = [m for m in unread[uid] if m[0] > up_to]
            op.body = _user_body(unread[uid])
        self.history.add(op)
        return ok

    def _batch(
        self,
        clients: list[httpx.Client],
        n: int,
        owners: list[int],
        rng: random.Random,
        unread: dict[int, list[Msg]],
    ) -> bool:
        """One batch; its items' writes recorded. A batch has no Idempotency-Key, so it is not
        retried blindly: without a definite answer each owner's answer is read from the app
        (nothing else writes these users) to learn whether the batch was stored. False when
        that cannot be told (the owners' models are no longer exact)."""
        texts = {
            o: f"b{n} {'room' if o == ROOM_USER else 'u' + str(o)} {rng.getrandbits(32):08x}"
            for o in owners
        }
        items: list[dict[str, object]] = [
            {"channel": ROOM} if o == ROOM_USER else {"user_id": o} for o in owners
        ]
        for item, o in zip(items, owners, strict=True):
            item |= _payload(texts[o], self._data(texts[o]))
        app = n % self.config.apps
        start = time.monotonic()
        ops = {
            o: Op("publish", o, start, target=str(app), note=f"{texts[o]} (batch {n})")
            for o in owners
        }
        for o in owners:
            ops[o].text, ops[o].data = texts[o], self._data(texts[o])
        att = Op("api", owners[0], start, target=str(app), note=f"batch {n} {owners}")
        att.ids = list(owners)
        got: dict[str, object] = {}
        try:
            r = clients[app].post("/api/messages/batch", json={"items": items})
            att.status = r.status_code
            att.headers = {
                k: v for k, v in r.headers.items() if k.startswith("x-") or k == "retry-after"
            }
            att.body = r.text[:200]
            if r.status_code == 201:
                got = r.json()
        except httpx.HTTPError as e:
            att.note += f" {type(e).__name__}"
        att.end = time.monotonic()
        self.history.add(att)
        ids: dict[int, int] = {}
        if att.status == 201:
            got_ids = got.get("ids")
            if not isinstance(got_ids, list) or len(got_ids) != len(owners):
                self.history.notes.append(f"batch {n}: answer {att.body!r}")
                return False
            ids = {o: int(i) for o, i in zip(owners, got_ids, strict=True)}
        elif 400 <= att.status < 500:
            self.history.notes.append(f"batch {n} refused {att.status}: {att.body}")
            return True  # nothing stored
        else:
            if att.status == 0:
                time.sleep(3.0)  # an attempt the client gave up on may still be committing
            probed = self._probe_batch(owners, texts)
            if probed is None:
                for o in owners:
                    ops[o].index, ops[o].end = -1, time.monotonic()
                    ops[o].note += " no definite answer"
                    self.history.add(ops[o])
                return False
            if not probed:
                return True  # not stored: the attempt alone is recorded (rule 4)
            if len(probed) != len(owners):
                self.history.notes.append(f"batch {n}: only {sorted(probed)} stored of {owners}")
                for o in owners:
                    ops[o].index, ops[o].end = -1, time.monotonic()
                    self.history.add(ops[o])
                return False
            ids = probed
        end = time.monotonic()
        for o in owners:
            op = ops[o]
            op.end, op.status, op.headers, op.ids = end, 201, att.headers, [ids[o]]
            if o == ROOM_USER:
                op.index = 0  # numbered with the room's other writes (renumber_room)
            else:
                unread[o].append((ids[o], texts[o], op.data))
                self.batch_index[o] += 1
                op.index = self.batch_index[o]
                op.body = _user_body(unread[o])
            self.history.add(op)
        return True

    def _probe_batch(self, owners: list[int], texts: dict[int, str]) -> dict[int, int] | None:
        """After a batch without a definite answer: which owners got its message, and its id,
        read from an app's own listener (its answer comes from the database) until one answers
        (60 s at most). None if no app answered."""
        deadline = time.monotonic() + 60
        with httpx.Client(timeout=5) as client:
            while time.monotonic() < deadline:
                found: dict[int, int] = {}
                try:
                    for o in owners:
                        url = (
                            self.room_urls[ROOM_POLLERS[0]]
                            if o == ROOM_USER
                            else (self.stack.poll_url(o))
                        )
                        app = next((i for i, e in enumerate(self.app_up) if e.is_set()), 0)
                        r = client.get(self.stack.app_url(app) + url)
                        r.raise_for_status()
                        body = r.text
                        doc = json.loads(room_part(body) if o == ROOM_USER else body or "{}")
                        msgs = (
                            doc.get("messages", [])
                            if o == ROOM_USER
                            else ([doc["newest"]] if "newest" in doc else [])
                        )
                        for m in msgs:
                            if m.get("text") == texts[o]:
                                found[o] = int(m["id"])
                    return found
                except (httpx.HTTPError, ValueError, KeyError):
                    time.sleep(0.5)
        return None

    def _after_next_held(self, uid: int, since: float) -> None:
        """Returns once a held poll of the user was sent after `since` (at most 1 s)."""
        with self.held_sent:
            self.held_sent.wait_for(lambda: self.held_at.get(uid, 0.0) > since, 1.0)

    def _write(
        self,
        clients: list[httpx.Client],
        app: int,
        op: Op,
        path: str,
        body: dict[str, object],
        headers: dict[str, str],
    ) -> tuple[bool, dict]:
        """Sends the write until it has a definite answer (the same Idempotency-Key: a retry
        cannot publish twice; a mark-read is idempotent), for up to 60 s; each attempt is an op
        of its own (rule 4)."""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if not self.app_up[app].wait(0.0):
                other = [i for i in range(len(clients)) if self.app_up[i].is_set()]
                if other:
                    app = other[0]
                else:
                    self.app_up[app].wait(5.0)
            att = Op("api", op.user, time.monotonic(), target=str(app), note=op.kind)
            try:
                r = clients[app].post(path, json=body, headers=headers)
                att.status = r.status_code
                att.headers = {
                    k: v for k, v in r.headers.items() if k.startswith("x-") or k == "retry-after"
                }
                att.body = r.text[:200]
            except httpx.HTTPError as e:
                att.note += f" {type(e).__name__}"
            att.end = time.monotonic()
            self.history.add(att)
            if att.status in (200, 201):
                op.status = att.status
                op.headers = att.headers
                op.target = str(app)
                return True, r.json()
            if 400 <= att.status < 500:
                op.note += f" refused {att.status}: {att.body}"
                return False, {}
            if self.stop.is_set() and time.monotonic() > deadline - 30:
                break
            time.sleep(0.2)
            if self.config.apps > 1:
                app = (app + 1) % self.config.apps
        op.note += " no definite answer"
        return False, {}

    def _poll(
        self,
        client: httpx.Client,
        kind: str,
        uid: int,
        url: str,
        etag: str | None,
        body: str | None,
        wait: int,
        part: bool = False,
    ) -> Op:
        """part: a room poll, recorded as ROOM_USER's with the room's part of the answer."""
        op = Op(kind, ROOM_USER if part else uid, time.monotonic(), wait=wait, target="nginx")
        if part:
            op.note, op.ids = f"room poll of user {uid}", [uid]
        headers = {}
        if etag is not None:
            headers["If-None-Match"] = etag
            op.inm_body = body
        try:
            r = client.get(
                url + (f"&wait={wait}" if wait else ""), headers=headers, timeout=wait + 20
            )
            op.status = r.status_code
            op.headers = {k: v for k, v in r.headers.items() if k in ("etag", "x-poll-source")}
            op.source = r.headers.get("x-poll-source", "")
            if r.status_code == 200:
                op.body = r.content.decode("utf-8", "replace")
            elif r.status_code == 304:
                op.body = body
        except httpx.HTTPError as e:
            op.note += " " + type(e).__name__
        op.end = time.monotonic()
        if part:  # the whole answer stays the poller's tag body; the room's part is recorded
            whole = op.body
            op.body = None if whole is None else room_part(whole)
            op.inm_body = None if op.inm_body is None else room_part(op.inm_body)
            self.history.add(op)
            op = Op(**{**op.__dict__, "body": whole})
            return op
        self.history.add(op)
        return op

    def poller(self, uid: int, held: bool, room: bool = False) -> None:
        """held: one held poll after another, each with the ETag of the last answer; else plain
        and conditional polls with short pauses. room: on the user's URL with the room."""
        rng = self._rng("poller", uid, held, *(["room"] if room else []))
        url = self.stack.base_url + (self.room_urls[uid] if room else self.stack.poll_url(uid))
        etag: str | None = None
        body: str | None = None
        refresh = rng.randrange(5, 30)  # polls until the URL is asked for again
        with httpx.Client() as client:
            while not self.stop.is_set():
                refresh -= 1
                if refresh <= 0:
                    # The site's backend hands out a new URL during the run (POST /api/poll-url,
                    # on either app process); the poll goes on with it, its tag kept.
                    refresh = rng.randrange(5, 30)
                    url = self._poll_url(client, uid, room, rng.randrange(self.config.apps)) or url
                if held and etag is not None:
                    if not room:
                        with self.held_sent:
                            self.held_at[uid] = time.monotonic()
                            self.held_sent.notify_all()
                    wait = rng.choice(HELD_WAITS)
                    op = self._poll(client, "held", uid, url, etag, body, wait, room)
                elif not held and not room and body and rng.random() < HISTORY_SHARE:
                    self._history_read(client, uid, url, body, rng)
                    self.stop.wait(rng.uniform(0.05, 0.4))
                    continue
                elif etag is not None and rng.random() < 0.5:
                    op = self._poll(client, "cond", uid, url, etag, body, 0, room)
                else:
                    op = self._poll(client, "poll", uid, url, None, None, 0, room)
                if op.status in (200, 304) and "etag" in op.headers:
                    etag, body = op.headers["etag"], op.body
                else:
                    self.stop.wait(0.2)
                if not held:
                    self.stop.wait(rng.uniform(0.05, 0.4))

    def streamer(self, uid: int, room: bool = False) -> None:
        """An EventSource on the user's poll URL (or its URL with the room) for the whole run:
        each event an Op "stream" whose start is its connection's request, so rule 1 judges a
        stream's events as a poll sent then; rule 11 that they never go back and that a returned
        write reaches an open stream within the held bound. Its connections are "stream-conn"
        ops (status, source), recorded when it stops."""
        url = self.stack.base_url + (self.room_urls[uid] if room else self.stack.poll_url(uid))

        def on_event(e: Event) -> None:
            body = e.answer.decode("utf-8", "replace")
            op = Op(
                "stream",
                ROOM_USER if room else uid,
                e.sent,
                end=e.at,
                status=200,
                body=room_part(body) if room else body,
                source=e.source,
                target="nginx",
                note=f"{'room stream' if room else 'stream'} of user {uid}, connection "
                f"{e.connection}",
                ids=[uid, e.connection],
            )
            self.history.add(op)

        last_id, clients = "", []
        while not self.stop.is_set():
            # A failed stream (a refusal: 403, 503 shed) is opened again, as the browser client
            # does after a poll, from the last id it saw.
            client = EventStreamClient(url, on_event, last_event_id=last_id, max_retry_s=2.0)
            clients.append(client.start())
            while client.alive and not self.stop.wait(0.2):
                pass
            client.stop()
            last_id = client.last_event_id
            if client.error is not None and not self.stop.is_set():
                self.history.add(
                    Op("stream-failed", uid, time.monotonic(), note=repr(client.error), ids=[uid])
                )
                self.stop.wait(1.0)
        for client in clients:
            for conn, sent, ended, status, source in client.log:
                self.history.add(
                    Op(
                        "stream-conn",
                        ROOM_USER if room else uid,
                        sent,
                        end=ended,
                        status=status,
                        source=source,
                        target="nginx",
                        note=f"{'room stream' if room else 'stream'} of user {uid}",
                        ids=[uid, conn],
                    )
                )

    def _history_read(
        self, client: httpx.Client, uid: int, url: str, body: str, rng: random.Random
    ) -> None:
        """The gap a client fills (docs/api.md, "The history read"): the poll URL plus `after`,
        the id of one of the last answer's messages or 0 (every unread message), sometimes with
        a small `limit`; through nginx to the app. ids: [after]; rule 10 judges the list."""
        try:
            listed = [int(m["id"]) for m in json.loads(body).get("messages", [])]
        except (ValueError, TypeError, KeyError, AttributeError):
            listed = []
        after = rng.choice([0, *listed])
        limit = rng.choice(HISTORY_LIMITS)
        query = f"&after={after}" + (f"&limit={limit}" if limit else "")
        op = Op("history", uid, time.monotonic(), target="nginx", ids=[after], note=query)
        try:
            r = client.get(url + query, timeout=20)
            op.status = r.status_code
            op.source = r.headers.get("x-poll-source", "")
            op.body = r.content.decode("utf-8", "replace")
        except httpx.HTTPError as e:
            op.note += " " + type(e).__name__
        op.end = time.monotonic()
        self.history.add(op)

    def _poll_url(self, client: httpx.Client, uid: int, room: bool, app: int) -> str | None:
        """The user's signed poll URL from app process `app` (with the room if `room`), through
        nginx; None without a good answer (the attempt is an api op: rule 4)."""
        req: dict[str, object] = {"user_id": uid, **({"channels": [ROOM]} if room else {})}
        att = Op("api", ROOM_USER if room else uid, time.monotonic(), target=str(app))
        att.note = "poll-url"
        url = None
        try:
            r = client.post(
                self.stack.app_url(app) + "/api/poll-url",
                json=req,
                headers={"Authorization": f"Bearer {self.stack.api_token}"},
                timeout=10,
            )
            att.status = r.status_code
            att.headers = {k: v for k, v in r.headers.items() if k == "retry-after"}
            if r.status_code == 200:
                url = self.stack.base_url + str(r.json()["url"])
            else:
                att.body = r.text[:200]
        except (httpx.HTTPError, ValueError, KeyError) as e:
            att.note += f" {type(e).__name__}"
        att.end = time.monotonic()
        self.history.add(att)
        return url

    def bad_input(self) -> None:
        """Every 1-3 s one bad request to the private API (_bad_inputs), on either app process,
        about a real user (the single writers' or the batches')."""
        rng = self._rng("bad-input")
        users = [*range(1, self.s.users + 1), *self.batch_users]
        clients = [self.stack.api(i, timeout=20) for i in range(self.config.apps)]
        try:
            while not self.stop.wait(rng.uniform(1.0, 3.0)):
                uid = rng.choice(users)
                path, ctype, body, expect = rng.choice(_bad_inputs(uid))
                app = rng.randrange(self.config.apps)
                what = body[:60].decode("utf-8", "replace") + ("..." if len(body) > 60 else "")
                op = Op("bad-api", uid, time.monotonic(), target=str(app), expect=expect)
                op.note, op.wait = f"POST {path} ({ctype}) {what!r}", int(BAD_INPUT_BOUND_S)
                try:
                    r = clients[app].post(path, content=body, headers={"Content-Type": ctype})
                    op.status = r.status_code
                    op.headers = {k: v for k, v in r.headers.items() if k == "retry-after"}
                    op.body = r.text[:300]
                except httpx.HTTPError as e:
                    op.note += f" {type(e).__name__}"
                op.end = time.monotonic()
                self.history.add(op)
        finally:
            for c in clients:
                c.close()

    def over_max_url(self, uid: int, rooms: int = 17) -> str:
        """The user's poll URL with `rooms` rooms, signed as the app signs one (security.md; the
        signature covers the key and the ch value)."""
        from fastpoll_app import channels
        from fastpoll_app.signing import load_secrets, signed_query

        names = ",".join(f"room.m{i:02d}" for i in range(rooms))
        key = channels.signed_key(f"/Poll/getMessages?user_id={uid}".encode(), names.encode())
        secret = load_secrets(self.stack.secret_path)[0]
        sig = signed_query(secret, key, int(time.time()) + 3600).decode()
        return f"/Poll/getMessages?user_id={uid}&ch={names}&{sig}"

    def hostile(self) -> None:
        rng = self._rng("hostile")
        while not self.stop.wait(rng.uniform(1.0, 3.0)):
            uid = rng.randrange(1, self.s.users + 1)
            suffix, inm, expect, bound, by_app = rng.choice(HOSTILE)
            if suffix == CH_OVER_MAX:
                target = self.over_max_url(uid)
            else:
                target = self.stack.poll_url(uid) + suffix
            headers = {"If-None-Match": inm} if inm is not None else {}
            op = Op(
                "hostile",
                uid,
                time.monotonic(),
                target="nginx",
                expect=expect,
                wait=int(bound),
                note=f"GET {suffix or '(no wait)'} If-None-Match {inm!r}",
            )
            try:
                ex = rawhttp.exchange(
                    self.stack.http_port,
                    rawhttp.request("GET", target, headers),
                    timeout=45,
                    expect=1,
                )
            except OSError as e:
                op.note += f" {type(e).__name__}"
                ex = rawhttp.Exchange()
            op.end = time.monotonic()
            if ex.responses:
                resp = ex.responses[0]
                op.status = resp.status
                op.source = resp.header("x-poll-source") or ""
                op.headers = {"x-poll-source": op.source, "etag": resp.header("etag") or ""}
                if by_app and not op.source:
                    op.source = "app"  # its refusals carry no X-Poll-Source
                if resp.status == 200:
                    op.body = resp.body.decode("utf-8", "replace")
            self.history.add(op)

    # ---- the nemesis ------------------------------------------------------------------------

    def kinds(self) -> list[str]:
        kinds = [
            "cache-delay-reads",
            "cache-hold-writes",
            "cache-hang",
            "cache-stall",
            "poller-restart",
            "app-restart",
            "announce-cut",
            "redis-stop",
        ]
        kinds += ["cache-slow-reads", "cache-read-stall"]
        if self.config.backend == "memcached":
            kinds.append("cache-kill")
        if self.config.db == "postgresql":
            kinds += ["pg-restart", "db-read-only", "user-lock"]
        if self.config.apps > 1:
            kinds.append("app-previous-release")
        return kinds

    def schedule(self) -> list[tuple[float, str, dict[str, object]]]:
        """(offset from the start, kind, parameters) for the whole run, from the seed: a first
        deck of every kind once (a short run meets each), then decks of every kind once and each
        priority kind once more per listing, shuffled, with gaps between faults. Each fault's
        slot is its length plus what it takes beyond it (a restart's start-up) and a gap."""
        rng = self._rng("nemesis")
        plan: list[tuple[float, str, dict[str, object]]] = []
        t = rng.uniform(2.0, 3.0)
        deck = self.kinds()
        rng.shuffle(deck)
        # The first deck's slow and stalled reads come first (popped from the end): no fault
        # before them, so that a short run judges them.
        deck.sort(key=lambda k: k in SLOW_READS)
        settled = 0.0  # when a poll held now has no fault before it that rule 8 excuses
        while t < self.s.seconds - 6:
            if not deck:
                deck = self.kinds() + [k for k in self.s.priority if k in self.kinds()]
                rng.shuffle(deck)
            kind = deck.pop()
            params = self._params(kind, rng)
            if kind in SLOW_READS:
                # Rule 8 judges a held poll only on a settled path: no other cache,
                # announcement or poll server fault within its settle time.
                t = max(t, settled)
                if t >= self.s.seconds - 6:
                    break
            plan.append((t, kind, params))
            end = t + float(str(params["length"])) + OVERHEAD_S.get(kind, 0.0)
            if kind in SETTLE_S:
                # A poll held before the fault began (its shape) was sent up to the longest
                # wait before: it must have been sent after the settle time too.
                settled = max(settled, end + SETTLE_S[kind] + max(HELD_WAITS) + _P.pad_s)
            t = end + rng.uniform(0.7, 2.0)
        return plan

    def _params(self, kind: str, rng: random.Random) -> dict[str, object]:
        nodes = [n for n in self.proxy_names if n != "announce"]
        p: dict[str, object] = {"node": rng.choice(nodes)}
        if kind == "cache-delay-reads":
            # Below the poll server's cache timeout (100 ms): slow reads, not failed ones.
            p.update(length=rng.uniform(5.0, 9.0), delay=round(rng.uniform(0.025, 0.06), 3))
        elif kind == "cache-slow-reads":
            # Above the poll servers' cache timeout (100 ms): every read fails, slowly; the
            # polls go to the app, and held polls must too (rule 8).
            p.update(length=rng.uniform(3.0, 5.0), delay=round(rng.uniform(0.15, 0.35), 3))
        elif kind == "cache-read-stall":
            # The poll servers' reads silent for under 500 ms (their line between a stall and a
            # hang) while the app's writes go through: the announcement of a write made then
            # comes while the re-read cannot be answered.
            delay = round(rng.uniform(0.3, 0.48), 3)
            p.update(length=delay, delay=delay)
        elif kind == "cache-hold-writes":
            p.update(length=rng.uniform(2.5, 4.5), reverse=rng.random() < 0.5)
        elif kind == "db-read-only":
            p.update(length=rng.uniform(2.0, 4.0))
        elif kind == "user-lock":
            # Two users at once: a batch user above the lowest (a batch holding lower slots then
            # fails on it: what it took before must be let go) and a single writer's user.
            victims = [rng.choice(self.batch_users[1:]), rng.randint(1, self.s.users)]
            # Longer than the app's 3 s wait for an order: its writes, and batches naming it, fail.
            p.update(length=rng.uniform(3.5, 5.0), users=sorted(victims))
        elif kind in ("cache-hang", "cache-kill", "redis-stop", "pg-restart"):
            p.update(length=rng.uniform(1.0, 2.5))
        elif kind == "cache-stall":
            # Around the poll servers' line between a stall and a hang (500 ms of silence) and
            # under the app's publish write timeout (1 s): a publish waits and lands.
            p.update(length=rng.uniform(0.2, 0.9))
        elif kind == "announce-cut":
            p.update(length=2.0)
        elif kind == "poller-restart":
            p.update(length=0.5, index=rng.randrange(len(self.stack.poller_ports)))
        elif kind == "app-restart":
            p.update(length=0.5, index=rng.randrange(self.config.apps))
        elif kind == "app-previous-release":
            # A rolling upgrade's step: one app host runs the release before this tree beside
            # this tree's, on the schema this tree migrated, and is then upgraded again.
            p.update(length=rng.uniform(4.0, 6.0), index=rng.randrange(self.config.apps))
        return p

    def nemesis(self, t_start: float) -> None:
        for offset, kind, params in self.schedule():
            if self.nemesis_stop.wait(max(0.0, t_start + offset - time.monotonic())):
                return
            fault = Fault(kind, str(params.get("node", "")), time.monotonic(), params=params)
            try:
                self._inject(fault, float(str(params["length"])))
            except Exception as e:  # noqa: BLE001 -- recorded, and the run goes on
                fault.params = {**params, "error": repr(e)}
            fault.end = time.monotonic()
            self.history.add_fault(fault)

    def _node_proc(self, node: str) -> str:
        return node if node.startswith("memcached") else "redis"

    def _ctl(self, proxy: str, op: str, arg: object = None) -> object:
        if self.proxy is None:
            raise RuntimeError("no proxies")
        return self.proxy.send(proxy, op, arg)

    def _inject(self, f: Fault, length: float) -> None:
        st, p = self.stack, f.params
        node = str(p.get("node", ""))
        if f.kind in ("cache-delay-reads", "cache-slow-reads", "cache-read-stall"):
            slow = f.kind != "cache-delay-reads"
            f.paths, f.delay_s = (
                [hist.CACHE_SLOW if slow else hist.CACHE_DELAY],
                float(str(p["delay"])),
            )
            if slow:
                # The proxy holds the answers of every connection that has not written yet: an
                # app's new connection too (its gets before a cas), so its writes may fail.
                f.paths.append(hist.APP_PATH)
                # Its shape is a poll held before the reads failed and a change announced
                # while they fail: not begun while no poll is held (the poll servers are still
                # recovering from the fault before, every poll at the app).
                p["waited"] = round(self._await_held(HELD_AWAIT_S), 2)
                f.start = time.monotonic()
            self._ctl(node, "read_delay", f.delay_s)
            time.sleep(length)
            self._ctl(node, "read_delay", 0.0)
        elif f.kind == "db-read-only":
            f.target, f.paths = "postgres", [hist.DB_READ_ONLY]
            self._read_only(length)
        elif f.kind == "user-lock":
            f.paths = [hist.USER_LOCK]
            users = sorted(f.lock_users())
            f.target = "users " + "+".join(map(str, users))
            self._hold_user_lock(users, length)
            # A batch that failed on one of them must have let go of the orders it took.
            time.sleep(ORDER_PROBE_S)
            self.idle_orders()
        elif f.kind == "cache-hold-writes":
            f.paths = [hist.CACHE, hist.APP_PATH]
            self._ctl(node, "hold", True)
            time.sleep(length)
            p["released"] = self._ctl(node, "release", bool(p["reverse"]))
            self.released.set()
        elif f.kind in ("cache-hang", "cache-stall", "redis-stop"):
            name = "redis" if f.kind == "redis-stop" else self._node_proc(node)
            f.target = name
            f.paths = [hist.ANNOUNCE] if name == "redis" else []
            if name == "redis" and self.config.backend == "redis" or name != "redis":
                f.paths += [hist.CACHE, hist.CACHE_DOWN]
            if name == "redis" and self.config.backend == "redis":
                f.paths.append(hist.APP_PATH)  # no recovery window on the Redis backend
            if f.kind == "cache-stall":
                f.paths.append(hist.CACHE_SLOW)
            pid = st.procs[name].pid
            freeze(pid)
            time.sleep(length)
            os.kill(pid, signal.SIGCONT)
        elif f.kind == "cache-kill":
            f.paths = [hist.CACHE, hist.CACHE_DOWN]
            i = int(node.split("-")[1])
            st.stop_proc(node, signal.SIGKILL)
            self._ctl(node, "reset_all")
            time.sleep(length)
            st.start_memcached(i)
        elif f.kind == "pg-restart":
            f.target, f.paths = "postgres", [hist.DB]
            st.restart_postgres(length)
        elif f.kind == "announce-cut":
            f.target, f.paths = "announce", [hist.ANNOUNCE]
            p["connections"] = self._ctl("announce", "blackhole")
            time.sleep(length)
        elif f.kind == "poller-restart":
            i = int(str(p["index"]))
            f.target, f.paths = f"poller-{i}", [hist.POLLER + str(i)]
            st.stop_proc(f"poller-{i}")
            st.start_poller(i)
        elif f.kind == "app-restart":
            i = int(str(p["index"]))
            f.target = st.app_name(i)
            f.paths = [hist.APP + str(i)] + ([hist.APPS_DOWN] if self.config.apps == 1 else [])
            self._restart_app(i)
        elif f.kind == "app-previous-release":
            # Judged whole: only the two restarts are faults of the app's path (their own).
            i = int(str(p["index"]))
            f.target, p["release"] = st.app_name(i), PREVIOUS
            tree = extract(PREVIOUS, st.run_dir / "releases" / PREVIOUS)
            self._swap_app(i, tree)
            try:
                time.sleep(length)
            finally:
                self._swap_app(i, None)

    def _restart_app(self, i: int) -> None:
        self.app_up[i].clear()
        try:
            self.stack.stop_proc(self.stack.app_name(i))
            self.stack.start_app(i)
        finally:
            self.app_up[i].set()

    def _swap_app(self, i: int, tree: Path | None) -> None:
        """App host i restarted on `tree`'s app (None: this tree's), recorded as an app-restart
        fault. An earlier release that cannot start leaves this tree's running, and raises."""
        fault = Fault(
            "app-restart", self.stack.app_name(i), time.monotonic(), paths=[hist.APP + str(i)]
        )
        try:
            if tree is None:
                self.stack.app_trees.pop(i, None)
            else:
                self.stack.app_trees[i] = tree
            try:
                self._restart_app(i)
            except Exception:
                self.stack.app_trees.pop(i, None)
                self._restart_app(i)
                raise
        finally:
            fault.end = time.monotonic()
            self.history.add_fault(fault)

    def _pg(self, dbname: str) -> psycopg.Connection[tuple[object, ...]]:
        """A connection of the nemesis's own to the run's PostgreSQL (its superuser)."""
        password = (self.stack.run_dir / "pg.pass").read_text().strip()
        return psycopg.connect(
            f"host=127.0.0.1 port={self.stack.pg_port} user={PG_USER} dbname={dbname}",
            password=password,
            autocommit=True,
            connect_timeout=5,
        )

    def _terminate_sessions(self, conn: psycopg.Connection[tuple[object, ...]]) -> None:
        """Ends every session on the app's database (the apps' pooled connections), recorded
        as a fault on the database path at that instant (a request in flight then may fail)."""
        t = time.monotonic()
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = %s AND pid <> pg_backend_pid()",
            (PG_DB,),
        )
        self.history.add_fault(Fault("db-terminate", "postgres", t, time.monotonic(), [hist.DB]))

    def _read_only(self, length: float) -> None:
        """PostgreSQL refuses writes for `length` s, as for maintenance: the database's
        default_transaction_read_only on, and its sessions ended so that new ones take it; then
        off, and the sessions ended again (a session keeps the setting it started with)."""
        with self._pg("postgres") as conn:
            conn.execute(f"ALTER DATABASE {PG_DB} SET default_transaction_read_only = on")
            try:
                self._terminate_sessions(conn)
                time.sleep(length)
            finally:
                conn.execute(f"ALTER DATABASE {PG_DB} SET default_transaction_read_only = off")
                self._terminate_sessions(conn)

    def _await_held(self, limit: float) -> float:
        """Waits, at most limit s, until a poll server holds a poll; the time waited."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < limit and not self.nemesis_stop.is_set():
            for port in self.stack.admin_ports:
                with contextlib.suppress(httpx.HTTPError, ValueError):
                    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=1).text
                    if any(
                        line.startswith("fastpoll_held_requests ") and float(line.split()[-1]) > 0
                        for line in text.splitlines()
                    ):
                        return time.monotonic() - t0
            time.sleep(0.05)
        return time.monotonic() - t0

    def _hold_user_lock(self, uids: list[int], length: float) -> None:
        """The users' orders taken from outside for `length` s: the advisory locks the app takes
        for them (store.py's keys), held by a session of the nemesis (a host that hangs holding
        them). Their writes wait and get 503; every other user's must not notice (rule 9)."""
        with self._pg(PG_DB) as conn:
            for uid in uids:
                conn.execute("SELECT pg_advisory_lock(%s, %s)", (PG_ORDER_CLASS, order_slot(uid)))
            try:
                self.lock_batch_sent.clear()
                self.lock_batch.set()
                # The length counts from the batch naming them (the writer may be in a mark-read
                # of a held user, up to the app's 3 s wait): it then meets the held order for
                # longer than the app waits, and fails there holding the slots below it.
                self.lock_batch_sent.wait(LOCK_BATCH_AWAIT_S)
                time.sleep(length)
            finally:
                conn.execute("SELECT pg_advisory_unlock_all()")

    # ---- the run --------------------------------------------------------------------------

    def finish(self, writers: list[threading.Thread]) -> None:
        """The run's last fault, the shape of a late cache write: once every writer has marked
        its messages read (the cache holds the empty answer), every cache write held while each
        publishes and marks read once more (its last state: nothing unread; the publish
        pending), then released, in order or reversed. A write that lands
        late over the newer answer is then still there after recovery (rule 2)."""
        cache = [n for n in self.proxy_names if n != "announce"]
        reverse = self._rng("finish").random() < 0.5
        paths = [hist.CACHE, hist.APP_PATH]
        fault = Fault("cache-hold-writes", "+".join(cache), time.monotonic(), paths=paths)
        self.finishing.set()
        with contextlib.suppress(threading.BrokenBarrierError):
            self.ready.wait()
        fault.start = time.monotonic()
        for name in cache:
            self._ctl(name, "hold", True)
        self.final_hold.set()
        for t in writers:
            t.join(timeout=90)
        released = [self._ctl(name, "release", reverse) for name in cache]
        fault.params = {"reverse": reverse, "released": released, "final": True}
        fault.end = time.monotonic()
        self.history.add_fault(fault)

    def heal(self) -> None:
        """Ends every fault still in effect: no delay, held writes sent, silent connections
        closed, every process running again. (The database's faults end with their own.)"""
        for name in self.proxy_names:
            self._ctl(name, "read_delay", 0.0)
            self._ctl(name, "release", False)
            self._ctl(name, "close_dead")
        for proc in self.stack.procs.values():
            with contextlib.suppress(OSError):
                os.kill(proc.pid, signal.SIGCONT)

    def drain(self, timeout: float = 40.0) -> None:
        """Waits for the outbox to be empty (fastpoll_app_repair_pending 0 on every app, twice
        in a row 0.5 s apart): rule 2 is checked after it."""
        op = Op("drain", 0, time.monotonic())
        deadline = time.monotonic() + timeout
        zero = 0
        last: list[float | None] = []
        while time.monotonic() < deadline and zero < 2:
            last = [
                self._metric(self.stack.app_url(i) + "/metrics", "fastpoll_app_repair_pending")
                for i in range(self.config.apps)
            ]
            zero = zero + 1 if all(v == 0.0 for v in last) else 0
            time.sleep(0.5)
        op.end = time.monotonic()
        op.status = 200 if zero >= 2 else 0
        op.note = f"outbox backlog {last} after {op.end - op.start:.1f} s"
        self.history.add(op)

    def idle_orders(self) -> None:
        """PostgreSQL, after each user-lock and after the drain: no order (a slot's lock, or a
        user's own in ORDERS_COMPAT) held by the same session, idle, in two looks IDLE_HOLD_S
        apart. A request holds one for milliseconds between its statements; an order a failed
        write or batch did not let go stays on its pooled connection (which goes on serving
        other requests), and every later write of those users from any other connection waits
        for it and gets 503."""
        if self.config.db != "postgresql":
            return
        op = Op("idle-orders", 0, time.monotonic())
        query = (
            "SELECT l.pid, l.classid::bigint, l.objid::bigint, l.objsubid FROM pg_locks l "
            "JOIN pg_stat_activity a ON a.pid = l.pid "
            "WHERE l.locktype = 'advisory' AND l.granted AND l.pid <> pg_backend_pid() "
            "AND ((l.objsubid = 2 AND l.classid = %s::oid) OR l.objsubid = 1) "
            "AND a.state = 'idle'"
        )
        try:
            with self._pg(PG_DB) as conn:
                first = set(conn.execute(query, (PG_ORDER_CLASS,)).fetchall())
                time.sleep(IDLE_HOLD_S)
                rows = sorted(first & set(conn.execute(query, (PG_ORDER_CLASS,)).fetchall()))
        except psycopg.Error as e:
            rows, op.note = [], f"cannot read pg_locks: {e}"
        else:
            op.status = 200 if not rows else 409
            op.note = f"{len(rows)} order(s) held by idle sessions {IDLE_HOLD_S:g} s apart: "
            held = [f"pid {pid} {('user', 'slot')[sub == 2]} {obj}" for pid, _, obj, sub in rows]
            op.note += ", ".join(held[:10]) or "none"
        op.end = time.monotonic()
        self.history.add(op)

    def final_reads(self) -> None:
        # The poll servers read replicas while a node recovers (recovery_ms) and the repairs land.
        time.sleep(self.s.params.cache_settle_s)
        with httpx.Client(timeout=10) as client:
            users = [*range(1, self.s.users + 1), *self.batch_users]
            targets = [(uid, self.stack.poll_url(uid)) for uid in users]
            targets.append((ROOM_USER, self.room_urls[ROOM_POLLERS[0]]))
            for uid, target in targets:
                bases = [("final-nginx", self.stack.base_url)] + [
                    ("final-app", self.stack.app_url(i)) for i in range(self.config.apps)
                ]
                for kind, base in bases:
                    op = Op(kind, uid, time.monotonic(), target=base)
                    try:
                        r = client.get(base + target)
                        op.status = r.status_code
                        op.body = r.content.decode("utf-8", "replace")
                        if uid == ROOM_USER:
                            op.body = room_part(op.body)
                        op.source = r.headers.get("x-poll-source", "")
                        op.headers = {"x-poll-source": op.source}
                    except httpx.HTTPError as e:
                        op.note = type(e).__name__
                    op.end = time.monotonic()
                    self.history.add(op)

    def memcached_connections(self) -> None:
        """Each memcached node's connections, as notes: one that hit its limit (-c) refuses new
        clients ("rejected"), which would look like a cache fault nobody injected."""
        for i, port in enumerate(self.stack.memcached_ports):
            try:
                st = memcached_stats(port)
            except OSError as e:
                self.history.notes.append(f"memcached-{i}: no stats at the end ({e!r})")
                continue
            self.history.notes.append(
                f"memcached-{i}: {st.get('curr_connections', '?')} connections open at the end, "
                f"{st.get('total_connections', '?')} since its start, "
                f"{st.get('rejected_connections', '?')} rejected "
                f"(limit {st.get('max_connections', '?')})"
            )

    def proxy_failures(self) -> None:
        """The connections the fault proxies could not carry (proxy.py _failed), as notes: a
        harness that drops connections shows in the run's report, not only in its log (which
        has the first five of each kind, with their times)."""
        for name in self.proxy.ports if self.proxy is not None else []:
            failures = self._ctl(name, "failures")
            for kind, n in (failures if isinstance(failures, dict) else {}).items():
                self.history.notes.append(f"proxy {name} {kind}: {n} times")

    def nginx_errors(self) -> None:
        """nginx's error log lines that mark a poller failed or time one out (rule 5)."""
        log = self.stack.run_dir / "nginx" / "error.log"
        if not log.exists():
            return
        socks = {str(self.stack.poller_socket(i)): i for i in range(len(self.stack.poller_ports))}
        ports = {f"127.0.0.1:{p}": i for i, p in enumerate(self.stack.poller_ports)}
        pat = re.compile(
            r"^(\d{4}/\d\d/\d\d \d\d:\d\d:\d\d) \[\w+\] .*"
            r"(upstream timed out|temporarily disabled)"
        )
        for line in log.read_text(errors="replace").splitlines():
            m = pat.match(line)
            if not m:
                continue
            wall = time.mktime(time.strptime(m.group(1), "%Y/%m/%d %H:%M:%S"))
            poller = -1
            for key, i in [*socks.items(), *ports.items()]:
                if key in line:
                    poller = i
            if "fastpoll_app" in line or any(f":{p}" in line for p in self.stack.app_ports):
                continue  # the app's upstream, not a poller's
            self.history.nginx_errors.append(
                {"t": wall + 0.5 - self.history.wall_offset, "poller": poller, "msg": line[:400]}
            )

    def poller_events(self) -> None:
        """The poll servers' own judgement of the cache path: a node that did not answer within
        the timeout (or failed) is read through replicas or the app for recovery_ms, and held
        polls are not answered from it meanwhile. Recorded as observed faults (rule 3 excuses
        them as it does the nemesis' cache faults; rule 5 does not)."""
        pat = re.compile(
            # local time, with its UTC offset (poll_server/src/log.c), which mktime reads as local
            r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(\.\d+)(?:[+-]\d\d:\d\d)? "
            r"\[\d+\] warn: (memcached|redis) "
        )
        for i in range(len(self.stack.poller_ports)):
            log = self.stack.run_dir / f"poller-{i}.log"
            if not log.exists():
                continue
            for line in log.read_text(errors="replace").splitlines():
                m = pat.match(line)
                if not m:
                    continue
                wall = time.mktime(time.strptime(m.group(1), "%Y-%m-%dT%H:%M:%S"))
                t = wall + float(m.group(2)) - self.history.wall_offset
                fault = Fault("observed-cache-trouble", f"poller-{i}", t, t, [hist.OBSERVED])
                fault.params = {"log": line[:300]}
                self.history.add_fault(fault)

    def timeout_counts(self) -> list[float | None]:
        """Each poll server's cache gets that timed out so far (None: it did not answer)."""
        counts: list[float | None] = []
        for port in self.stack.admin_ports:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
                    text = r.read().decode()
            except OSError:
                counts.append(None)  # restarting: its count starts again at 0
                continue
            counts.append(
                sum(
                    float(line.rsplit(" ", 1)[1])
                    for line in text.splitlines()
                    if line.startswith("fastpoll_backend_gets_total{")
                    and 'result="timeout"' in line
                )
            )
        return counts

    def timeout_sampler(self) -> None:
        """Every params.timeout_sample_s (the period the checker reads them with), the poll
        servers' new timed-out cache gets (History.
        cache_timeouts): a lone late answer is not logged, so no observed fault says why such a
        poll went to the app. A count that went down is a restarted poll server's, all new."""
        last: list[float | None] = [None] * len(self.stack.admin_ports)
        total = [0.0] * len(last)
        while True:
            t = time.monotonic()
            for i, n in enumerate(self.timeout_counts()):
                if n is None:
                    continue
                before = last[i]
                new = n if before is None or n < before else n - before
                if before is not None and new > 0:
                    self.history.cache_timeouts.append({"t": t, "poller": i, "n": new})
                    total[i] += new
                last[i] = n
            if self.sampling_stop.wait(self.s.params.timeout_sample_s):
                break
        for i, n in enumerate(total):
            self.history.notes.append(f"poller-{i}: {n:.0f} cache gets timed out")

    def pulse(self) -> None:
        """The client's own pauses (History.stalls), until the final reads are done: asleep
        PULSE_S at a time, a wake more than STALL_S late means this process did not run (starved
        of CPU, the interpreter held by another thread), and an answer that came meanwhile is
        recorded that much later than it came."""
        while not self.sampling_stop.is_set():
            t = time.monotonic()
            time.sleep(PULSE_S)
            now = time.monotonic()
            if now - t - PULSE_S > STALL_S:
                self.history.add_stall(t + PULSE_S, now)

    def run(self) -> Report:
        self.start()
        writers = [
            threading.Thread(target=self.writer, args=(u,), name=f"writer-{u}")
            for u in range(1, self.s.users + 1)
        ]
        writers.append(threading.Thread(target=self.batch_writer, name="batch-writer"))
        writers += [
            threading.Thread(target=self.room_writer, args=(n,), name=f"room-writer-{n}")
            for n in range(ROOM_WRITERS)
        ]
        threads = list(writers)
        for u in [*range(1, self.s.users + 1), *self.batch_users]:
            threads.append(threading.Thread(target=self.poller, args=(u, True), name=f"held-{u}"))
            threads.append(threading.Thread(target=self.poller, args=(u, False), name=f"poll-{u}"))
        for u in STREAM_USERS:
            if u <= self.s.users:
                threads.append(threading.Thread(target=self.streamer, args=(u,), name=f"es-{u}"))
        for u in ROOM_STREAMERS:
            threads.append(
                threading.Thread(target=self.streamer, args=(u, True), name=f"room-es-{u}")
            )
        for u in ROOM_POLLERS:
            for held in (True, False):
                name = f"room-{'held' if held else 'poll'}-{u}"
                threads.append(
                    threading.Thread(target=self.poller, args=(u, held, True), name=name)
                )
        threads.append(threading.Thread(target=self.hostile, name="hostile"))
        threads.append(threading.Thread(target=self.bad_input, name="bad-input"))
        sampler = threading.Thread(target=self.timeout_sampler, name="timeouts")
        sampler.start()
        pulse = threading.Thread(target=self.pulse, name="pulse", daemon=True)
        pulse.start()
        t0 = time.monotonic()
        nemesis = threading.Thread(target=self.nemesis, args=(t0,), name="nemesis")
        self.nemesis_thread = nemesis
        for t in [*threads, nemesis]:
            t.start()
        self.stop.wait(self.s.seconds)
        self.nemesis_stop.set()
        nemesis.join()
        self.finish(writers)
        self.stop.set()
        self.heal()
        for t in threads:
            t.join(timeout=90)
        self.renumber_room()
        self.drain()
        self.idle_orders()
        self.final_reads()
        self.sampling_stop.set()
        sampler.join()
        pulse.join()
        self.history.notes.append(
            f"client: {len(self.history.stalls)} pauses over {STALL_S * 1000:.0f} ms, "
            f"{sum(e - s for s, e in self.history.stalls):.1f} s in all"
        )
        self.nginx_errors()
        self.poller_events()
        self.proxy_failures()
        self.memcached_connections()
        self.history.write(self.run_dir / "history.jsonl")
        return check(self.history, self.s.params)
