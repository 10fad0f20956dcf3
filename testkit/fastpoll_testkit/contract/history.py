"""The history of a run: operations (with invoke and complete times) and faults, as JSON lines."""

from __future__ import annotations

import json
import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path

# What a fault touches (Fault.paths): the checker's exclusions are stated in these terms.
CACHE = "cache"  # the cache path of every key (held, hung, killed: not a mere delay)
CACHE_DOWN = "cache-down"  # a cache node (or the cache's Redis) hung or killed
CACHE_DELAY = "cache-delay"  # cache reads slowed by Fault.delay_s; answers still arrive
# Cache reads that do not come in time: answers later than [cache] timeout_ms, or a node stalled
# (SIGSTOP) for under a second. Held polls must still get a changed answer (rule 8).
CACHE_SLOW = "cache-slow"
ANNOUNCE = "announce"  # the announcement path (Redis pub/sub, the subscriber's connection)
# A poll server logged that a cache node did not answer in time or failed (not the nemesis: the
# proxies' own latency on a loaded machine, or a consequence of a fault elsewhere).
OBSERVED = "cache-observed"
# Only the app's path to the cache fails (its writes held; or a Redis cache hung, which has no
# recovery window): the poll servers see nothing (design.md, "Where the rule holds, and where not").
APP_PATH = "cache-app-path"
DB = "db"  # PostgreSQL down or restarting (or its sessions terminated)
DB_READ_ONLY = "db-read-only"  # PostgreSQL refuses writes (default_transaction_read_only on)
USER_LOCK = "user-lock"  # users' orders held from outside (Fault.lock_users)
# A hostile poll's note for a URL validly signed for more rooms than the poll servers' [channels]
# max: they answer it 404, so only the app answers it (400).
CH_OVER_MAX = "(signed for 17 rooms)"
APPS_DOWN = "apps-down"  # no app process can answer
POLLER = "poller:"  # + index: that poll server restarting
APP = "app:"  # + index: that app process restarting


@dataclass
class Op:
    """One client operation. kind: publish, read (mark-read), api (one attempt of either, or a
    poll URL asked for), bad-api (bad input to the private API), poll, cond, held, hostile,
    history (a history read through nginx), idle-orders, drain, final-nginx, final-app. For
    writes, `index` is the model's state number after this write and `body` the poll answer it
    makes; for polls `body` is the answer the poll shows (a 304's is the body of the tag it
    sent)."""

    kind: str
    user: int
    start: float
    end: float = 0.0
    status: int = 0  # 0: no answer (connection error, timeout)
    body: str | None = None
    inm_body: str | None = None  # held and conditional polls: the body of the tag sent
    wait: int = 0
    source: str = ""  # X-Poll-Source, or app0/app1 for API calls
    headers: dict[str, str] = field(default_factory=dict)
    index: int = -1
    target: str = ""
    expect: list[int] = field(default_factory=list)  # hostile, bad-api: the documented statuses
    note: str = ""
    # publishes: the ids of the messages stored; a batch's attempt (api): its owners; a history
    # read: [after]; a room poll: [the user whose URL it is]
    ids: list[int] = field(default_factory=list)
    text: str = ""  # publishes: the message's text
    data: object = None  # publishes: the message's data, as sent (None: none)


# The room's owner in a history: its writes are the room's publishes (run.ROOM).
ROOM_USER = 0


@dataclass
class Fault:
    kind: str
    target: str
    start: float
    end: float = 0.0
    paths: list[str] = field(default_factory=list)
    delay_s: float = 0.0
    params: dict[str, object] = field(default_factory=dict)

    def lock_users(self) -> set[int]:
        """A user-lock's users: params "users" (a list), or "user" (one, older histories)."""
        if USER_LOCK not in self.paths:
            return set()
        many = self.params.get("users")
        if isinstance(many, list):
            return {int(u) for u in many}
        return {int(str(self.params.get("user", -1)))}


@dataclass
class History:
    seed: int = 0
    config: str = ""
    ops: list[Op] = field(default_factory=list)
    faults: list[Fault] = field(default_factory=list)
    # time.time() - time.monotonic() at the start: maps nginx's wall-clock log lines.
    wall_offset: float = 0.0
    nginx_errors: list[dict[str, object]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # Each owner's cache nodes (str(user id), ROOM_USER's the room's): its key's primary and
    # replica, with several memcached nodes (empty otherwise: every key on the one node).
    placement: dict[str, list[str]] = field(default_factory=dict)
    apps: int = 0  # app processes behind nginx (0: not recorded)
    # Cache gets a poll server counted as timed out (fastpoll_backend_gets_total{result="timeout"},
    # sampled): {"t", "poller", "n"}, n new since the sample before at t. Not faults: a lone late
    # answer is the machine's load, not the nemesis, and only sends that poll to the app (rule 4
    # accepts its 503 when no app could answer); rules that excuse any fault must not see them.
    cache_timeouts: list[dict[str, float]] = field(default_factory=list)
    # The client's own pauses, (start, end): the run's pulse thread woke that much late (its
    # process starved of CPU, or the interpreter held elsewhere), so an answer that came then
    # was recorded late. Not faults: the checker widens a latency bound by them.
    stalls: list[tuple[float, float]] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, op: Op) -> None:
        with self._lock:
            self.ops.append(op)

    def add_fault(self, fault: Fault) -> None:
        with self._lock:
            self.faults.append(fault)

    def add_stall(self, start: float, end: float) -> None:
        with self._lock:
            self.stalls.append((start, end))

    def write(self, path: Path) -> None:
        with path.open("w") as f:
            meta = {
                "type": "meta",
                "seed": self.seed,
                "config": self.config,
                "wall_offset": self.wall_offset,
                "notes": self.notes,
                "placement": self.placement,
                "apps": self.apps,
            }
            f.write(json.dumps(meta) + "\n")
            for fault in self.faults:
                f.write(json.dumps({"type": "fault", **asdict(fault)}) + "\n")
            for op in sorted(self.ops, key=lambda o: o.start):
                f.write(json.dumps({"type": "op", **asdict(op)}) + "\n")
            for line in self.nginx_errors:
                f.write(json.dumps({"type": "nginx-error", **line}) + "\n")
            for sample in self.cache_timeouts:
                f.write(json.dumps({"type": "cache-timeout", **sample}) + "\n")
            for start, end in self.stalls:
                f.write(json.dumps({"type": "stall", "start": start, "end": end}) + "\n")

    @classmethod
    def read(cls, path: Path) -> History:
        h = cls()
        for line in path.read_text().splitlines():
            rec = json.loads(line)
            kind = rec.pop("type")
            if kind == "meta":
                h.seed, h.config = rec["seed"], rec["config"]
                h.wall_offset, h.notes = rec["wall_offset"], rec["notes"]
                h.placement = rec.get("placement", {})
                h.apps = int(rec.get("apps", 0))
            elif kind == "fault":
                h.faults.append(Fault(**rec))
            elif kind == "op":
                h.ops.append(Op(**rec))
            elif kind == "stall":
                h.stalls.append((float(rec["start"]), float(rec["end"])))
            elif kind == "cache-timeout":
                h.cache_timeouts.append({k: float(v) for k, v in rec.items()})
            else:
                h.nginx_errors.append(rec)
        return h
