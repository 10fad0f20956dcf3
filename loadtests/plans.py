"""What the benchmark measures: the systems, the nginx tuning every nginx in a run shares, and
the plans (one measurement each) of a full and a quick run. No side effects on import."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


RESULTS = HERE / "results"
POLL_SERVER = ROOT / "poll_server" / "build" / "poll_server"
SWEEP = (20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 15000)
# The hit path against the design's ceiling and memcached_pass, in interleaved rounds: c50 in the
# c50 group, these in the "hit" group (many keys and the hot key).
HIT_LEVELS = (1000, 5000)
HIT_SYSTEMS = ("fastpoll_all", "fastpoll", "memcached_pass", "ceiling")
APP_SWEEP_MAX = 1000  # the app at 15,000 connections only measures wrk's timeouts
USERS = 100_000
HOT_USER = 1
APP_USERS = 1_000  # users with one unread message in the app's database (app-alone runs)
APP_EMPTY_BASE = 5_000_000  # users from here up have nothing in the app's database

# nginx tuning for every nginx in the run (the stack's and the peers'), so they are measured alike.
# Limits here: 2 cores, RLIMIT_NOFILE 20,000 per process. At 15,000 client connections one worker
# holds ~7,500 clients plus up to as many upstream connections, so worker_connections must exceed
# 15,000; reuseport gives each worker its own accept queue, so the kernel spreads clients evenly.
TUNING: dict[str, object] = {
    "worker_processes": "auto",
    # One worker per core, for every nginx of the run. Unpinned, the scheduler runs a woken
    # process next to its waker: nginx and the poller it wakes share a core while the other
    # idles (fastpoll's runs were 88% busy at c=50, the peer's 99%; pinned, 97-98% for both).
    "worker_cpu_affinity": "auto",
    "worker_rlimit_nofile": 20000,
    "worker_connections": 19500,
    "listen_options": " backlog=4096 reuseport",
    # Idle upstream connections kept per worker: at least the requests a worker has in flight at
    # the peak, else each new sweep level opens thousands of connections at once, the pollers'
    # accept queues overflow, connects time out (proxy_connect_timeout 1s) and nginx marks the
    # pollers down and sends everything to the app (measured at 15,000 with 1024).
    "fastpoll_upstream_keepalive": 8192,
    # No fastpoll_active_pollers: "fastpoll" runs the template's default ("auto", one active
    # poller per 3 cores, the rest standby: 1 of 2 here), "fastpoll_all" every poller active.
}

SYSTEMS = {
    "fastpoll": "fastpoll: nginx -> poll_server -> memcached",
    "fastpoll_all": "fastpoll with every poll server active (no standby)",
    "direct": "poll_server directly (one instance, no nginx)",
    "memcached_pass": "nginx memcached_pass (keepalive upstream)",
    "return200": "nginx return 200 (no hop)",
    "ceiling": "nginx -> nginx return 200 on a unix socket (the design's ceiling)",
    "app": "fallback app alone (no cache)",
}


@dataclass
class Plan:
    """One measurement."""

    group: str  # ab | c50 | sweep
    system: str
    scenario: str  # hit-hot, hit-many, mix95, mix50, miss, ...
    conns: int
    tool: str = "wrk"
    seconds: float = 5.0  # wrk duration
    n: int = 5000  # ab requests
    keepalive: bool = True
    users: int = USERS
    hit: float = 1.0
    method: str = "GET"
    check: str | None = None
    rep: int = 0

    @property
    def name(self) -> str:
        ka = "" if self.tool == "wrk" else (" -k" if self.keepalive else "")
        return (
            f"{self.group} {self.tool}{ka} c={self.conns} {self.system} {self.scenario} "
            f"{self.method}" + (f" #{self.rep + 1}" if self.rep else "")
        )

    def est_seconds(self) -> float:
        if self.tool == "ab":
            return 1.0 + self.n / (1500 if self.system == "app" else 12000)
        return self.seconds + 1.0 + (1.5 if self.conns >= 5000 else 0.0)


# ---- plans -------------------------------------------------------------------------------------


def full_plan(reps: int, sweep: tuple[int, ...] = SWEEP, ab_reps: int = 5) -> list[Plan]:
    plans: list[Plan] = []
    # 1. the seed's ab, interleaved over the systems and repeated: a 5,000-request run lasts
    #    under a second here, so one run alone is mostly noise.
    for rep in range(ab_reps):
        for ka in (False, True):
            for system in ("fastpoll", "return200", "memcached_pass"):
                plans.append(
                    Plan(
                        "ab",
                        system,
                        "hit-hot",
                        50,
                        tool="ab",
                        n=5000,
                        keepalive=ka,
                        users=1,
                        rep=rep,
                    )
                )
    plans.append(Plan("ab", "app", "nocache-msg", 50, tool="ab", n=2000, keepalive=False, users=1))
    # 2. wrk -c50 keep-alive. The ratio runs are interleaved and repeated.
    for rep in range(reps):
        for system in ("fastpoll", "memcached_pass", "return200", "fastpoll_all", "ceiling"):
            plans.append(Plan("c50", system, "hit-hot", 50, users=1, rep=rep))
        for system in ("fastpoll", "memcached_pass", "fastpoll_all", "ceiling"):
            plans.append(Plan("c50", system, "hit-many", 50, rep=rep))
        plans.append(Plan("c50", "app", "nocache-msg", 50, rep=rep))
    # 2b. the hit path at 1,000 and 5,000 connections, the same systems in interleaved rounds
    #     (order rotated each round).
    for rep in range(min(reps, 2)):
        for c in HIT_LEVELS:
            systems = list(HIT_SYSTEMS[rep:] + HIT_SYSTEMS[:rep])
            for scenario, users in (("hit-many", USERS), ("hit-hot", 1)):
                for system in systems:
                    plans.append(
                        Plan("hit", system, scenario, c, seconds=5.0, users=users, rep=rep)
                    )
    plans += [
        Plan("c50", "fastpoll", "hit-hot", 50, users=1, method="POST"),
        Plan("c50", "fastpoll", "hit-many", 50, method="POST"),
        Plan("c50", "return200", "hit-hot", 50, users=1, method="POST"),
        Plan("c50", "fastpoll", "mix95", 50, hit=0.95),
        Plan("c50", "fastpoll", "mix50", 50, hit=0.50),
        Plan("c50", "fastpoll", "miss", 50, hit=0.0),
        Plan("c50", "direct", "hit-hot", 50, users=1),
        Plan("c50", "direct", "hit-many", 50),
        Plan("c50", "app", "nocache-empty", 50),
    ]
    # 3. the sweep, interleaved level by level (order rotated) so drift hits every system alike.
    for i, c in enumerate(sweep):
        systems = ["fastpoll", "memcached_pass", "return200"]
        systems = systems[i % 3 :] + systems[: i % 3]
        if c <= APP_SWEEP_MAX:
            systems.append("app")
        secs = 3.0 if c <= 200 else (4.0 if c <= 2000 else 6.0)
        for system in systems:
            scen = "nocache-msg" if system == "app" else "hit-many"
            plans.append(Plan("sweep", system, scen, c, seconds=secs))
    return plans


def quick_plan() -> list[Plan]:
    """CI smoke: every path and every peer once, short, with every answer checked."""
    s = 1.0
    return [
        Plan("ab", "fastpoll", "hit-hot", 50, tool="ab", n=1000, keepalive=False, users=1),
        Plan("ab", "fastpoll", "hit-hot", 50, tool="ab", n=1000, keepalive=True, users=1),
        Plan("c50", "fastpoll", "hit-hot", 50, seconds=s, users=1, check="hit"),
        Plan("c50", "fastpoll", "hit-many", 50, seconds=s, check="hit"),
        Plan("c50", "fastpoll", "hit-many", 50, seconds=s, method="POST", check="hit"),
        Plan("c50", "fastpoll", "mix50", 50, seconds=s, hit=0.5, check="any"),
        Plan("c50", "fastpoll", "miss", 20, seconds=s, hit=0.0, check="any"),
        Plan("c50", "direct", "hit-many", 50, seconds=s, check="hit"),
        Plan("c50", "memcached_pass", "hit-many", 50, seconds=s, check="hit"),
        Plan("c50", "return200", "hit-hot", 50, seconds=s, users=1, check="hit"),
        Plan("c50", "ceiling", "hit-hot", 50, seconds=s, users=1, check="hit"),
        Plan("c50", "app", "nocache-msg", 20, seconds=s, check="any"),
        Plan("sweep", "fastpoll", "hit-many", 1000, seconds=2.0, check="hit"),
    ]
