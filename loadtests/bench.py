"""fastpoll's benchmark: `make bench` (full, <= 10 min) and `make bench-quick` (CI smoke, < 1 min).

    .venv/bin/python loadtests/bench.py            # full: results, plots, docs/benchmarks.md
    .venv/bin/python loadtests/bench.py --quick    # smoke: asserts 0 failed requests, right bodies
    .venv/bin/python loadtests/bench.py --attach run/   # measure the stack `make up` started

It starts the stack through tools/stack.py (tuned for many connections, see TUNING) unless told to
attach to a running one, preloads the answers of 100,000 users into memcached (ketama, the app's
key function), starts the peers (nginx `return 200`, nginx `memcached_pass`), then runs, with the
same client for every system:

1. the seed's `ab -c 50 -n 5000` on a poll URL, without and with -k;
2. wrk -c50 keep-alive: hits (one hot key / 100,000 keys), GET and POST, 95% and 50% hit mixes,
   all misses (the fallback), the poll server directly, the peers, and the app alone;
3. the concurrency sweep 20 .. 15,000 over fastpoll and the peers (the app up to 1,000);
4. the poll servers' CPU time per 100,000 hits, and one poll server's memory with 10,000
   connections open.

One JSON file per run goes to loadtests/results/ (raw tool outputs beside it), with the machine's
details; then the plots and docs/benchmarks.md are made from it (loadtests/report.py).
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import shutil
import statistics
import sys
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

import clients  # noqa: E402
import conns  # noqa: E402
import peers  # noqa: E402
import preload  # noqa: E402
import stackctl  # noqa: E402
import sysinfo  # noqa: E402
from report import PATH_GROUPS  # noqa: E402  (the processes on each system's path)
from signing import Signer  # noqa: E402

RESULTS = HERE / "results"
POLL_SERVER = ROOT / "poll_server" / "build" / "poll_server"
SWEEP = (20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 15000)
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
    "worker_rlimit_nofile": 20000,
    "worker_connections": 19500,
    "listen_options": " backlog=4096 reuseport",
    # Idle upstream connections kept per worker: at least the requests a worker has in flight at
    # the peak, else each new sweep level opens thousands of connections at once, the pollers'
    # accept queues overflow, connects time out (proxy_connect_timeout 1s) and nginx marks the
    # pollers down and sends everything to the app (measured at 15,000 with 1024).
    "fastpoll_upstream_keepalive": 8192,
    # nginx sends to one poll server; the other is its standby (`backup`). Here the client,
    # nginx's 2 workers, memcached and the pollers share 2 cores: one busy poller batches more
    # per loop turn than two half-busy ones (the "every poll server active" rows measure that).
    "fastpoll_active_pollers": 1,
}

SYSTEMS = {
    "fastpoll": "fastpoll: nginx -> poll_server -> memcached",
    "fastpoll_all": "fastpoll with every poll server active (no standby)",
    "direct": "poll_server directly (one instance, no nginx)",
    "memcached_pass": "nginx memcached_pass (keepalive upstream)",
    "return200": "nginx return 200 (ceiling)",
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


@dataclass
class Ctx:
    args: argparse.Namespace
    target: stackctl.Target
    peers: dict[str, peers.Peer | peers.AppPeer]
    raw_log: Path
    signer: Signer
    targets: Path  # directory of the signed query files
    app_users: int = APP_USERS
    miss_pool: int = 40_000
    miss_prefix: int = 0
    results: list[dict[str, object]] = field(default_factory=list)

    def next_miss_prefix(self) -> str:
        # A miss polls a user id nobody polled before: 11 digits of tenths of a second (unique
        # across runs) and 8 digits of counter: 19 digits, below 2**63.
        self.miss_prefix = max(self.miss_prefix + 1, int(time.time() * 10) % 10**11)
        return str(self.miss_prefix)

    def miss_file(self) -> Path:
        """Signed queries of users never polled before, fresh for every run."""
        prefix = self.next_miss_prefix()
        return self.signer.write(
            self.targets / "misses.txt", (f"{prefix}{i:08d}" for i in range(1, self.miss_pool + 1))
        )

    def write_targets(self, users: int) -> None:
        self.targets.mkdir(parents=True, exist_ok=True)
        self.signer.write(self.targets / "hits.txt", (str(u) for u in range(1, users + 1)))
        # The app alone (peers.AppPeer: no signed URLs, as without fastpoll) polls its users
        # written 0NNN: it answers them from SQLite like any poll, but never reads or fills the
        # cache for a non-canonical spelling of the id.
        (self.targets / "app-msg.txt").write_text(
            "".join(f"user_id=0{preload.APP_USER_BASE + i}\n" for i in range(1, APP_USERS + 1))
        )
        (self.targets / "app-empty.txt").write_text(
            "".join(f"user_id=0{APP_EMPTY_BASE + i}\n" for i in range(1, 20_001))
        )


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
        for system in ("fastpoll", "memcached_pass", "return200", "fastpoll_all"):
            plans.append(Plan("c50", system, "hit-hot", 50, users=1, rep=rep))
        for system in ("fastpoll", "memcached_pass", "fastpoll_all"):
            plans.append(Plan("c50", system, "hit-many", 50, rep=rep))
        plans.append(Plan("c50", "app", "nocache-msg", 50, rep=rep))
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
        Plan("c50", "app", "nocache-msg", 20, seconds=s, check="any"),
        Plan("sweep", "fastpoll", "hit-many", 1000, seconds=2.0, check="hit"),
    ]


# ---- running one plan ---------------------------------------------------------------------------


def system_url(ctx: Ctx, system: str) -> tuple[str, str]:
    """(base URL, poll path) of a system."""
    t = ctx.target
    if system in ("fastpoll", "fastpoll_all"):
        return t.base_url, "/Poll/getMessages"
    if system == "direct":
        return f"http://127.0.0.1:{t.poller_ports[0]}", "/getMessages"
    return ctx.peers[system].base_url, "/Poll/getMessages"


def set_active_pollers(ctx: Ctx, system: str) -> None:
    """Before a fastpoll run: nginx sends to the configured number of poll servers
    ("fastpoll"), or to all of them ("fastpoll_all"). A change reloads the stack's nginx and
    waits until the old workers are gone, so no run measures two generations."""
    stack = ctx.target.stack
    want = 0 if system == "fastpoll_all" else TUNING.get("fastpoll_active_pollers", 0)
    if (
        system not in ("fastpoll", "fastpoll_all")
        or stack.nginx_vars.get("fastpoll_active_pollers", 0) == want
    ):
        return
    old = set(sysinfo.children(ctx.target.nginx_pid))
    stack.nginx_vars["fastpoll_active_pollers"] = want
    stack.reload_nginx()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        now = set(sysinfo.children(ctx.target.nginx_pid))
        if now and not now & old:
            break
        time.sleep(0.05)
    time.sleep(0.5)


def cpu_groups(ctx: Ctx) -> dict[str, list[int]]:
    t = ctx.target
    groups = {
        "poll_servers": t.poller_pids,
        "nginx": [t.nginx_pid, *sysinfo.children(t.nginx_pid)],
        "memcached": t.memcached_pids,
        "app": [t.app_pid, *sysinfo.children(t.app_pid)],
    }
    for name, peer in ctx.peers.items():
        groups[f"peer_{name}"] = [peer.pid, *sysinfo.children(peer.pid)]
    return groups


def run_plan(ctx: Ctx, p: Plan, users: int) -> dict[str, object]:
    base, path = system_url(ctx, p.system)
    app = p.system == "app"
    empty = p.scenario == "nocache-empty"  # users the app has nothing for
    targets = ctx.targets / ("app-empty.txt" if empty else "app-msg.txt" if app else "hits.txt")
    n_users = min(p.users, 20_000 if empty else ctx.app_users if app else users)
    env = {
        "FP_PATH": path,
        "FP_TARGETS": str(targets),
        "FP_USERS": str(n_users),
        "FP_HIT": str(p.hit),
        "FP_METHOD": p.method,
    }
    if p.hit < 1:
        env["FP_MISSES"] = str(ctx.miss_file())
    if p.check:
        env["FP_CHECK"] = "status" if app else p.check
        if p.system in ("fastpoll", "direct") and p.scenario.startswith("hit"):
            env["FP_SOURCE"] = "cache"
    meter = sysinfo.CpuMeter(cpu_groups(ctx))
    mc_before = stackctl.memcached_stats(ctx.target.memcached_ports)
    meter.start()
    busy0, irq0, total0 = sysinfo.machine_cpu()
    tcp0 = sysinfo.tcp_counters()
    if p.tool == "ab":
        body = None
        if p.method == "POST":
            body = ctx.raw_log.parent / "post-body.json.tmp"
            body.write_text('{"since":0}')
        query = targets.open().readline().strip()  # the first user: the hot one
        r = clients.run_ab(
            f"{base}{path}?{query}",
            p.conns,
            p.n,
            p.keepalive,
            raw_log=ctx.raw_log,
            method_body=body,
        )
    else:
        r = clients.run_wrk(
            f"{base}{path}",
            p.conns,
            p.seconds,
            threads=2,
            env=env,
            timeout_s=10.0,
            raw_log=ctx.raw_log,
        )
    cpu = meter.stop()
    busy1, irq1, total1 = sysinfo.machine_cpu()
    tcp1 = sysinfo.tcp_counters()
    mc = stackctl.mc_delta(mc_before, stackctl.memcached_stats(ctx.target.memcached_ports))
    row: dict[str, object] = {
        "name": p.name,
        "group": p.group,
        "system": p.system,
        "scenario": p.scenario,
        "method": p.method,
        "rep": p.rep,
        "users": n_users,
        "hit_ratio": p.hit,
        **r.as_dict(),
        "cpu_s": cpu,
        "memcached": mc,
        # Whatever else ran on the machine meanwhile (other users, the kernel's own threads):
        # busy CPU of the whole machine minus interrupts, ours and the client's, as a share of
        # its capacity. Interrupt time (mostly our own loopback softirq) is shown apart.
        "machine_busy_share": round((busy1 - busy0) / max(1e-9, total1 - total0), 3),
        "irq_share": round((irq1 - irq0) / max(1e-9, total1 - total0), 3),
        # Machine-wide, so other users' tests count too; a listen overflow means a dropped SYN.
        "tcp": {k: tcp1.get(k, 0) - tcp0.get(k, 0) for k in tcp1 if tcp1[k] != tcp0.get(k)},
        "other_cpu_share": round(
            max(0.0, (busy1 - busy0) - (irq1 - irq0) - sum(cpu.values()) - r.client_cpu_s)
            / max(1e-9, total1 - total0),
            3,
        ),
    }
    # Hits that quietly went to the app would still be 200s: memcached's own counters show them
    # (the app's fill is an `add`, counted in cmd_set).
    if p.system in ("fastpoll", "direct") and p.scenario.startswith("hit"):
        row["fallbacks_seen"] = mc["cmd_set"]
    return row


# ---- derived figures ---------------------------------------------------------------------------


def _median(rows: list[dict[str, object]], key: str = "rps") -> float | None:
    vals = [float(r[key]) for r in rows if r.get(key) is not None]  # type: ignore[arg-type]
    return statistics.median(vals) if vals else None


def pick(results: list[dict[str, object]], **kw: object) -> list[dict[str, object]]:
    return [r for r in results if all(r.get(k) == v for k, v in kw.items())]


def cost_us(r: dict[str, object], client: bool = True) -> float:
    """CPU microseconds one request cost the processes on its path (and the client's own)."""
    cpu: dict[str, float] = r["cpu_s"]  # type: ignore[assignment]
    total = sum(cpu.get(g, 0.0) for g in PATH_GROUPS[str(r["system"])])
    if client:
        total += float(r["client_cpu_s"])  # type: ignore[arg-type]
    return total / max(1, int(r["requests"])) * 1e6  # type: ignore[call-overload]


def derive(results: list[dict[str, object]], rss: dict[str, object]) -> dict[str, object]:
    def med(**kw: object) -> float | None:
        return _median(pick(results, **kw))

    def cost(**kw: object) -> float | None:
        """CPU µs per request over the matching runs (their CPU over their requests)."""
        rows = pick(results, **kw)
        n = sum(int(r["requests"]) for r in rows)  # type: ignore[call-overload]
        return sum(cost_us(r) * int(r["requests"]) for r in rows) / n if n else None  # type: ignore

    def ratio(a: float | None, b: float | None) -> float | None:
        return round(a / b, 3) if a and b else None

    def ab_bound(system: str) -> float | None:
        """ab's two-core model: ab on one core, the servers on the other; the slower side
        sets the pace (µs per request)."""
        rows = pick(results, group="ab", system=system, keepalive=False)
        n = sum(int(r["requests"]) for r in rows)  # type: ignore[call-overload]
        if not n:
            return None
        server = sum(cost_us(r, client=False) * int(r["requests"]) for r in rows) / n  # type: ignore
        client = sum(float(r["client_cpu_s"]) for r in rows) / n * 1e6  # type: ignore[arg-type]
        return max(server, client)

    ab = {
        f"{s}{'_k' if ka else ''}": med(group="ab", system=s, keepalive=ka)
        for s in ("fastpoll", "return200", "memcached_pass", "app")
        for ka in (False, True)
    }
    c50 = {
        f"{s}_{sc}": med(group="c50", system=s, scenario=sc, method="GET")
        for s in ("fastpoll", "memcached_pass", "return200", "direct")
        for sc in ("hit-hot", "hit-many")
    }
    for sc in ("nocache-msg", "nocache-empty"):
        c50[f"app_{sc}"] = med(group="c50", system="app", scenario=sc)
    for sc in ("mix95", "mix50", "miss"):
        c50[f"fastpoll_{sc}"] = med(group="c50", system="fastpoll", scenario=sc)
    for sc in ("hit-hot", "hit-many"):
        c50[f"fastpoll_{sc}_POST"] = med(group="c50", system="fastpoll", scenario=sc, method="POST")
    c50["return200_hit-hot_POST"] = med(group="c50", system="return200", method="POST")

    sweep: dict[str, dict[int, dict[str, object]]] = {}
    for r in pick(results, group="sweep"):
        point = {
            k: r.get(k)
            for k in (
                "rps",
                "p50_ms",
                "p99_ms",
                "failed",
                "errors",
                "non2xx",
                "other_cpu_share",
                "fallbacks_seen",
                "tcp",
            )
        }
        n = max(1, int(r["requests"]))  # type: ignore[arg-type]
        point["cpu_us_per_req"] = {
            g: round(v / n * 1e6, 1)  # the path's own processes
            for g, v in r["cpu_s"].items()  # type: ignore[union-attr]
            if g in PATH_GROUPS[str(r["system"])]
        }
        point["client_us_per_req"] = round(float(r["client_cpu_s"]) / n * 1e6, 1)  # type: ignore
        sweep.setdefault(str(r["system"]), {})[int(r["conns"])] = point  # type: ignore[arg-type]

    def flat(system: str, c: int) -> float | None:
        s = sweep.get(system, {})
        if c in s and 50 in s:
            return ratio(s[c]["rps"], s[50]["rps"])  # type: ignore[arg-type]
        return None

    # CPU of the poll servers per 100,000 hits, in the c50 GET hit runs through nginx.
    cpu = {}
    for sys_ in ("fastpoll", "direct"):
        for sc in ("hit-hot", "hit-many"):
            rows = pick(results, group="c50", system=sys_, scenario=sc, method="GET")
            reqs = sum(int(r["requests"]) for r in rows)  # type: ignore[arg-type]
            secs = sum(float(r["cpu_s"]["poll_servers"]) for r in rows)  # type: ignore[index]
            if reqs:
                cpu[f"{sys_}_{sc}"] = round(secs / reqs * 100_000 * 1000, 1)  # ms
    ratios = {
        "c50_vs_memcached_pass_hot": ratio(c50["fastpoll_hit-hot"], c50["memcached_pass_hit-hot"]),
        "c50_vs_memcached_pass_many": ratio(
            c50["fastpoll_hit-many"], c50["memcached_pass_hit-many"]
        ),
        "c50_vs_return200_hot": ratio(c50["fastpoll_hit-hot"], c50["return200_hit-hot"]),
        "ab_vs_return200": ratio(ab["fastpoll"], ab["return200"]),
        "ab_k_vs_return200": ratio(ab["fastpoll_k"], ab["return200_k"]),
        "ab_vs_memcached_pass": ratio(ab["fastpoll"], ab["memcached_pass"]),
        "c50_vs_app": ratio(c50["fastpoll_hit-many"], c50["app_nocache-msg"]),
        "c50_vs_app_empty": ratio(c50["fastpoll_hit-many"], c50["app_nocache-empty"]),
        "ab_vs_app": ratio(ab["fastpoll"], ab["app"]),
        "sweep_10000_vs_50": flat("fastpoll", 10000),
        "sweep_15000_vs_50": flat("fastpoll", 15000),
        "peer_memcached_pass_15000_vs_50": flat("memcached_pass", 15000),
        "peer_return200_15000_vs_50": flat("return200", 15000),
    }
    fp = sweep.get("fastpoll", {})
    sweep_errors = sum(int(v["failed"]) for c, v in fp.items() if c >= 10000)  # type: ignore

    # The same ratios from CPU cost per request: the other system's cost over ours. On a machine
    # whose CPU other work shares, req/s depends on how much CPU was left to each run; the cost of
    # a request does not, and on an idle machine (everything CPU-bound) it predicts the req/s ratio.
    def cratio(ours: float | None, theirs: float | None) -> float | None:
        return round(theirs / ours, 3) if ours and theirs else None

    def sweep_cost(system: str, c: int) -> float | None:
        return cost(group="sweep", system=system, conns=c)

    costs = {
        "c50_vs_memcached_pass_hot": cratio(
            cost(group="c50", system="fastpoll", scenario="hit-hot", method="GET"),
            cost(group="c50", system="memcached_pass", scenario="hit-hot", method="GET"),
        ),
        "c50_vs_memcached_pass_many": cratio(
            cost(group="c50", system="fastpoll", scenario="hit-many", method="GET"),
            cost(group="c50", system="memcached_pass", scenario="hit-many", method="GET"),
        ),
        "c50_vs_app": cratio(
            cost(group="c50", system="fastpoll", scenario="hit-many", method="GET"),
            cost(group="c50", system="app", scenario="nocache-msg"),
        ),
        "c50_vs_app_empty": cratio(
            cost(group="c50", system="fastpoll", scenario="hit-many", method="GET"),
            cost(group="c50", system="app", scenario="nocache-empty"),
        ),
        "ab_vs_return200": cratio(ab_bound("fastpoll"), ab_bound("return200")),
        "sweep_10000_vs_50": cratio(sweep_cost("fastpoll", 10000), sweep_cost("fastpoll", 50)),
        "sweep_15000_vs_50": cratio(sweep_cost("fastpoll", 15000), sweep_cost("fastpoll", 50)),
    }
    targets = [
        _target(
            "wrk -c50 keep-alive, hot key: fastpoll >= 1.0x nginx memcached_pass",
            ratios["c50_vs_memcached_pass_hot"],
            1.0,
            costs["c50_vs_memcached_pass_hot"],
        ),
        _target(
            "wrk -c50 keep-alive, 100,000 keys: fastpoll >= 1.0x nginx memcached_pass",
            ratios["c50_vs_memcached_pass_many"],
            1.0,
            costs["c50_vs_memcached_pass_many"],
        ),
        _target(
            "sweep flat: 10,000 connections >= 0.9x its own 50",
            ratios["sweep_10000_vs_50"],
            0.9,
            costs["sweep_10000_vs_50"],
        ),
        _target(
            "sweep flat: 15,000 connections >= 0.9x its own 50",
            ratios["sweep_15000_vs_50"],
            0.9,
            costs["sweep_15000_vs_50"],
        ),
        {
            "target": "sweep: 0 errors or timeouts at 10,000 and 15,000",
            "value": sweep_errors,
            "need": 0,
            "met": (sweep_errors == 0) if {10000, 15000} & set(fp) else None,
            "by_cost": None,
            "met_by_cost": None,
        },
        _target(
            "ab -c 50 -n 5000: fastpoll >= 0.95x nginx return 200",
            ratios["ab_vs_return200"],
            0.95,
            costs["ab_vs_return200"],
        ),
        _target(
            "wrk -c50: fastpoll >= 10x the app alone (users with a message)",
            ratios["c50_vs_app"],
            10.0,
            costs["c50_vs_app"],
        ),
        _target(
            "wrk -c50: fastpoll >= 10x the app alone (users with nothing new)",
            ratios["c50_vs_app_empty"],
            10.0,
            costs["c50_vs_app_empty"],
        ),
    ]
    return {
        "ab": ab,
        "c50": c50,
        "sweep": sweep,
        "ratios": ratios,
        "cost_ratios": costs,
        "cpu_ms_per_100k_hits": cpu,
        "rss": rss,
        "targets": targets,
    }


def _target(
    what: str, value: float | None, need: float, by_cost: float | None = None
) -> dict[str, object]:
    return {
        "target": what,
        "value": value,
        "need": need,
        "met": None if value is None else value >= need,
        "by_cost": by_cost,
        "met_by_cost": None if by_cost is None else by_cost >= need,
    }


# ---- memory with many connections ---------------------------------------------------------------


def measure_rss(ctx: Ctx, count: int) -> dict[str, object]:
    t = ctx.target
    pid, port = t.poller_pids[0], t.poller_ports[0]
    before = sysinfo.status_kb(pid, "VmRSS")
    req = (
        f"GET /getMessages?{ctx.signer.query(str(HOT_USER))} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    ).encode()
    t0 = time.monotonic()
    with conns.ConnectionCrowd(port, req, count) as crowd:
        time.sleep(0.5)
        during = sysinfo.status_kb(pid, "VmRSS")
        alive = crowd.still_open()
        answered, failed = crowd.answered, crowd.failed
    return {
        "connections": count,
        "answered": answered,
        "failed": failed,
        "still_open": alive,
        "rss_kb_before": before,
        "rss_kb_with_connections": during,
        "bytes_per_connection": round((during - before) * 1024 / max(1, answered)),
        "seconds": round(time.monotonic() - t0, 1),
    }


# ---- main --------------------------------------------------------------------------------------


def fmt_row(r: dict[str, object]) -> str:
    def ms(v: object) -> str:
        return "-" if v is None else (f"{v:.2f}ms" if float(v) < 100 else f"{v:.0f}ms")  # type: ignore

    s = (
        f"{float(r['rps']):>10,.0f} req/s  p50 {ms(r['p50_ms']):>8}  p99 {ms(r['p99_ms']):>8}"  # type: ignore
        f"  failed {r['failed']}"
    )
    c = r.get("check") or {}
    if "bad_status" in c:  # type: ignore[operator]
        bad = sum(c[k] for k in ("bad_status", "bad_body", "bad_source"))  # type: ignore[index]
        s += f"  answers checked: {c['n_hit'] + c['n_miss']:,}, wrong {bad}"  # type: ignore
    if r.get("fallbacks_seen"):
        s += f"  fallbacks(app adds) {r['fallbacks_seen']}"
    tcp = r.get("tcp") or {}
    if tcp.get("ListenOverflows") or tcp.get("TCPSynRetrans"):  # type: ignore[union-attr]
        s += (
            f"  [tcp: {tcp.get('ListenOverflows', 0)} listen overflows, "  # type: ignore
            f"{tcp.get('TCPSynRetrans', 0)} SYN retransmits]"
        )  # type: ignore[union-attr]
    if float(r.get("other_cpu_share") or 0) >= 0.05:  # type: ignore[arg-type]
        s += f"  [other load on the machine: {float(r['other_cpu_share']):.0%} of its CPU]"  # type: ignore
    return s


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="CI smoke: < 1 minute, checks bodies")
    ap.add_argument(
        "--attach",
        type=Path,
        metavar="RUN_DIR",
        help="use the stack `make up` started (its run dir) instead of a fresh one",
    )
    ap.add_argument("--users", type=int, default=None, help=f"preloaded users (default {USERS})")
    ap.add_argument("--reps", type=int, default=3, help="repetitions of the ratio runs")
    ap.add_argument("--rss-conns", type=int, default=None, help="default 10000 (quick: 1000)")
    ap.add_argument(
        "--max-minutes",
        type=float,
        default=None,
        help="skip what is left after this long (default 12, quick 1.5)",
    )
    ap.add_argument("--no-docs", action="store_true", help="do not rewrite docs/benchmarks.md")
    ap.add_argument(
        "--poller-tcp",
        action="store_true",
        help="nginx reaches the poll servers over TCP, not unix sockets",
    )
    ap.add_argument(
        "--wait-quiet",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="first wait up to this long for the machine to be idle (other users)",
    )
    ap.add_argument("--only", default="", help="comma list of groups to run: ab,c50,sweep,rss")
    ap.add_argument(
        "--systems", default="", help="comma list of systems to run: " + ",".join(SYSTEMS)
    )
    ap.add_argument(
        "--upstream-keepalive",
        type=int,
        default=None,
        help=f"idle upstream connections per nginx worker "
        f"(default {TUNING['fastpoll_upstream_keepalive']})",
    )
    ap.add_argument(
        "--memcached-threads",
        type=int,
        default=None,
        help="memcached -t (default: memcached's own, 4); the peer at its best on 2 cores",
    )
    ap.add_argument(
        "--pollers",
        type=int,
        default=None,
        help="poll servers in the stack (default: one per core)",
    )
    ap.add_argument(
        "--sweep",
        default=",".join(map(str, SWEEP)),
        help="concurrency levels of the sweep (default: %(default)s)",
    )
    args = ap.parse_args()
    quick = args.quick
    users = args.users or (2000 if quick else USERS)
    max_s = 60 * (args.max_minutes or (1.5 if quick else 12.0))
    rss_n = args.rss_conns or (1000 if quick else 10000)
    only = {g for g in args.only.split(",") if g}
    if args.upstream_keepalive:
        TUNING["fastpoll_upstream_keepalive"] = args.upstream_keepalive

    for tool in ("wrk", "ab", "nginx", "memcached"):
        if shutil.which(tool) is None:
            print(f"bench: {tool} is not installed (make deps)", file=sys.stderr)
            return 2
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # children inherit it

    t_start = time.monotonic()
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    partial = bool(only or args.systems or args.sweep != ",".join(map(str, SWEEP)))
    run_id = f"{'quick' if quick else 'partial' if partial else 'bench'}-{stamp}"
    RESULTS.mkdir(parents=True, exist_ok=True)
    # Quick and partial runs are not kept in git (.gitignore: /loadtests/results/*.tmp).
    suffix = ".tmp" if quick or partial else ""
    out_json = RESULTS / f"{run_id}.json{suffix}"
    raw_log = RESULTS / f"{run_id}-raw.log{suffix}"
    work = ROOT / "run" / "bench"
    if work.exists():
        shutil.rmtree(work)  # our own scratch dir from an earlier run (stopped, by pid)
    work.mkdir(parents=True)

    print(
        f"bench {run_id}: {'quick smoke' if quick else 'full run'}; results -> {out_json}",
        flush=True,
    )
    quiet = wait_quiet(args.wait_quiet) if args.wait_quiet else None
    t_start = time.monotonic()  # the time limit and the run's duration start after the wait
    machine = sysinfo.machine(POLL_SERVER)
    ini = {"log": {"level": "warn"}}
    if args.attach:
        target = stackctl.attach(args.attach.resolve())
        print(f"  attached to the running stack at {target.base_url} (its own nginx tuning)")
    else:
        # The smoke checks every body, so a hit that falls back to the app on a starved CI
        # machine (a cache answer later than 100 ms) would fail it: quick mode allows 1 s.
        target = stackctl.start(
            work / "stack",
            TUNING,
            ini,
            cache_timeout_ms=1000 if quick else None,
            poller_unix=not args.poller_tcp,
            n_pollers=args.pollers,
            memcached_args=["-t", str(args.memcached_threads)] if args.memcached_threads else None,
        )
        print(
            f"  stack up at {target.base_url}: {len(target.poller_ports)} poll servers "
            f"{target.poller_ports} (nginx reaches them over {target.poller_hop}), memcached "
            f"{target.memcached_ports}, app {target.app_port}"
            f" ({time.monotonic() - t_start:.1f}s)",
            flush=True,
        )
    peer_tuning = {k: v for k, v in TUNING.items() if not k.startswith("fastpoll_")}
    ctx = Ctx(
        args=args,
        target=target,
        peers={},
        raw_log=raw_log,
        signer=Signer(target.stack),
        targets=work / "targets",
        miss_pool=8_000 if quick else 40_000,
    )
    failures: list[str] = []
    rss: dict[str, object] = {}
    hop: list[dict[str, object]] = []
    doc: dict[str, object] = {}
    try:
        mc_servers = [f"127.0.0.1:{p}" for p in target.memcached_ports]
        t0 = time.monotonic()
        preload.preload(mc_servers, users)
        print(f"  preloaded {users:,} users into memcached ({time.monotonic() - t0:.1f}s)")
        t0 = time.monotonic()
        ctx.write_targets(users)
        print(
            f"  {'signed' if ctx.signer.enabled else 'unsigned (signing is off)'} poll URLs "
            f"written for {users:,} users and the app's ({time.monotonic() - t0:.1f}s)"
        )
        ctx.peers = {
            "return200": peers.Peer(
                "return200",
                work / "peer-return200",
                peer_tuning,
                {"body": preload.answer(HOT_USER).decode()},
            ),
            "memcached_pass": peers.Peer(
                "memcached_pass",
                work / "peer-memcached_pass",
                peer_tuning,
                {
                    "memcached": mc_servers[0],
                    "upstream_keepalive": TUNING["fastpoll_upstream_keepalive"],
                },
            ),
        }
        ctx.peers["app"] = peers.AppPeer(
            work / "peer-app", target.stack.ini_path, workers=target.stack.app_workers
        )
        for peer in ctx.peers.values():
            peer.start()
        print("  peers up: " + ", ".join(f"{n} {p.base_url}" for n, p in ctx.peers.items()))

        levels = tuple(int(c) for c in args.sweep.split(",") if c)
        plans = quick_plan() if quick else full_plan(args.reps, levels)
        if only:
            plans = [p for p in plans if p.group in only]
        if args.systems:
            plans = [p for p in plans if p.system in args.systems.split(",")]
        if args.attach or len(target.poller_ports) < 2:  # not our nginx to reload / same thing
            plans = [p for p in plans if p.system != "fastpoll_all"]
        ctx.app_users = 0
        if any(p.system == "app" for p in plans):
            ctx.app_users = 200 if quick else APP_USERS
            secs = preload.seed_app(target.app_port, ctx.app_users, token=target.stack.api_token)
            print(f"  gave {ctx.app_users:,} users a message in the app's database ({secs:.1f}s)")

        failures += sanity(ctx, users, quick)
        if failures:
            raise SystemExit("bench: the stack does not answer right:\n  " + "\n  ".join(failures))
        total_est = sum(p.est_seconds() for p in plans)
        print(f"  {len(plans)} runs planned, ~{total_est / 60:.1f} min of load", flush=True)
        done_est = 0.0
        for i, p in enumerate(plans, 1):
            elapsed = time.monotonic() - t_start
            if elapsed > max_s:
                print(f"  time limit reached: skipping the last {len(plans) - i + 1} runs")
                failures.append(f"{len(plans) - i + 1} runs skipped (time limit)")
                break
            try:
                if not args.attach:
                    set_active_pollers(ctx, p.system)
                row = run_plan(ctx, p, users)
            except clients.ToolError as e:
                failures.append(f"{p.name}: {e}")
                print(f"  [{i:3}/{len(plans)}] {p.name}: FAILED TO RUN: {e}", flush=True)
                continue
            ctx.results.append(row)
            done_est += p.est_seconds()
            left = max(0.0, total_est - done_est)
            print(
                f"  [{i:3}/{len(plans)} {_mmss(elapsed)} ~{_mmss(left)} left] "
                f"{p.name:44} {fmt_row(row)}",
                flush=True,
            )
            if row.get("check") and row["check"].get("miss_reused"):  # type: ignore[union-attr]
                failures.append(
                    f"{p.name}: the pool of miss URLs ran out "
                    f"({row['check']['miss_reused']} reused)"
                )  # type: ignore[index]
            if quick or p.check:
                if row["failed"]:
                    failures.append(
                        f"{p.name}: {row['failed']} failed requests "
                        f"(errors {row['errors']}, non-2xx {row['non2xx']})"
                    )
                if row.get("check") and row["check"]["n_hit"] + row["check"]["n_miss"] == 0:  # type: ignore
                    failures.append(f"{p.name}: no requests were checked")
            # Let the closed connections settle (TIME_WAIT, nginx's upstream pool) before the next.
            time.sleep(0.2 if quick else (2.0 if p.conns >= 5000 else 0.5))

        if not quick and (not only or "hop" in only) and not args.systems:
            import hop_cost

            print("  one proxy hop, TCP vs unix socket (nginx -> nginx return 200):", flush=True)
            hop = hop_cost.measure(seconds=3.0, rounds=2)
            for h in hop:
                print(
                    f"    {h['hop']:5} {h['rps']:8,} req/s  CPU µs/req: proxy {h['front_us']}"
                    f", upstream {h['back_us']}, wrk {h['client_us']}",
                    flush=True,
                )
        if not only or "rss" in only:
            rss = measure_rss(ctx, rss_n)
            print(
                f"  poll server RSS: {rss['rss_kb_before']} KB idle, "
                f"{rss['rss_kb_with_connections']} KB with {rss['answered']:,} connections open"
                f" ({rss['bytes_per_connection']} B each; {rss['still_open']} still open)"
            )
            if rss["answered"] != rss_n or rss["still_open"] != rss_n:
                failures.append(
                    f"rss: {rss['answered']} of {rss_n} connections answered, "
                    f"{rss['still_open']} still open"
                )
        peak = {
            f"poller-{i}": sysinfo.status_kb(pid, "VmHWM")
            for i, pid in enumerate(target.poller_pids)
        }
        failures += sanity(ctx, users, quick, after=True)
        derived = derive(ctx.results, rss)
        derived["poll_server_peak_rss_kb"] = peak
        logs = collect_logs(target.stack.run_dir)
        derived["hop"] = hop
        doc = {
            "run_id": run_id,
            "mode": "quick" if quick else "full",
            "started_utc": stamp,
            "seconds": round(time.monotonic() - t_start, 1),
            "machine": machine,
            "idle_before_start": quiet,
            "tuning": {
                "nginx": TUNING,
                "nginx_applied_via": target.nginx_vars_via,
                "poller_hop": target.poller_hop,
                "attached": bool(args.attach),
                "nofile": [hard, hard],
                "wrk": {"threads": 2, "timeout_s": 10},
                "ini": ini,
                "sysctl_changed": {},
            },
            "stack": {
                "argv": {n: p.argv for n, p in target.stack.procs.items()},
                "http_port": target.http_port,
                "poller_ports": target.poller_ports,
                "memcached_ports": target.memcached_ports,
                "app_port": target.app_port,
            },
            "users": users,
            "derived": derived,
            "results": ctx.results,
            "logs": logs,
            "failures": failures,
        }
    finally:
        for peer in ctx.peers.values():
            peer.stop()
        if target.started_here:
            target.stack.stop()
        if doc:
            out_json.write_text(json.dumps(doc, indent=1, default=str) + "\n")
            print(f"  wrote {out_json.relative_to(ROOT)}")

    if not quick and doc:
        import report

        doc = json.loads(out_json.read_text())  # exactly what is stored (string keys and all)
        pngs = report.plots(doc, RESULTS) if not partial else []
        if pngs:
            print("  plots: " + ", ".join(str(p.relative_to(ROOT)) for p in pngs))
        if not args.no_docs and not partial:
            md = report.write_markdown(doc, out_json, pngs)
            print(f"  wrote {md.relative_to(ROOT)}")
        for t in doc["derived"]["targets"]:  # type: ignore[index]
            mark = {True: "met   ", False: "MISSED", None: "n/a   "}[t["met"]]
            by_cost = {True: "met", False: "missed", None: "n/a"}[t.get("met_by_cost")]
            print(
                f"  target {mark} {t['target']}: {t['value']} (by CPU cost: "
                f"{t.get('by_cost')}, {by_cost})"
            )
    print(
        f"bench {run_id}: {'OK' if not failures else 'FAILED'} in "
        f"{_mmss(time.monotonic() - t_start)}"
    )
    for f in failures:
        print(f"  FAIL {f}")
    return 1 if failures else 0


def sanity(ctx: Ctx, users: int, quick: bool, after: bool = False) -> list[str]:
    """Right bytes from every path before (and after) the load; returns problems."""
    import random

    rnd = random.Random(11 if after else 5)
    sample = sorted({HOT_USER, users, *rnd.sample(range(1, users + 1), min(users, 50))})
    t = ctx.target
    q = ctx.signer.query
    problems = [
        f"fastpoll {m}" for m in stackctl.check_hits(t.base_url, "/Poll/getMessages", sample, q)
    ]
    problems += [
        f"fastpoll POST {m}"
        for m in stackctl.check_hits(t.base_url, "/Poll/getMessages", sample[:10], q, post=True)
    ]
    problems += [
        f"direct {m}"
        for m in stackctl.check_hits(
            f"http://127.0.0.1:{t.poller_ports[0]}", "/getMessages", sample[:10], q
        )
    ]
    if "memcached_pass" in ctx.peers:
        problems += [
            f"memcached_pass {m}"
            for m in stackctl.check_hits(
                ctx.peers["memcached_pass"].base_url,
                "/Poll/getMessages",
                sample[:10],
                q,
                source=None,
            )
        ]
    if "return200" in ctx.peers:
        problems += [
            f"return200 {m}"
            for m in stackctl.check_hits(
                ctx.peers["return200"].base_url, "/Poll/getMessages", [HOT_USER], q, source=None
            )
        ]
    if ctx.signer.enabled:  # an unsigned poll is refused before the cache and the app
        a = stackctl.get(f"{t.base_url}/Poll/getMessages?user_id={HOT_USER}")
        if a.status != 403:
            problems.append(f"unsigned poll: {a.status}, expected 403")
    # A miss goes to the app (empty body: nothing new for a user with no messages).
    a = stackctl.get(f"{t.base_url}/Poll/getMessages?{q(ctx.next_miss_prefix() + '00000001')}")
    if (a.status, a.body, a.source) != (200, b"", "app"):
        problems.append(f"miss: {a.status} {a.source} {a.body[:80]!r}")
    a = stackctl.get(
        f"{ctx.peers['app'].base_url}/Poll/getMessages?user_id=0{preload.APP_USER_BASE + 1}"
    )
    seeded = ctx.app_users > 0
    if (a.status, a.source) != (200, "app") or a.body.startswith(b'{"unread":') != seeded:
        problems.append(f"app alone: {a.status} {a.source} {a.body[:80]!r}")
    if not problems:
        print(
            f"  answers {'after' if after else 'before'} the load: right "
            f"({len(sample)} users, POST, direct, peers, a miss, the app)"
        )
    return problems


def collect_logs(run_dir: Path) -> dict[str, dict[str, int]]:
    """What the poll servers and the stack's nginx logged during the run (warnings and errors),
    each message once with its count: the evidence behind a fallback or a failure."""
    import re

    out: dict[str, dict[str, int]] = {}
    files = {
        **{f.stem: f for f in sorted(run_dir.glob("poller-*.log"))},
        "nginx": run_dir / "nginx" / "error.log",
    }
    for name, path in files.items():
        counts: dict[str, int] = {}
        try:
            lines = path.read_text(errors="replace").splitlines()
        except OSError:
            continue
        for line in lines:
            if "[signing]" in line or " info:" in line or "[notice]" in line:
                continue
            msg = re.sub(r"^\S+ \[\d+\] |^\S+ \S+ |\d+#\d+: \*\d+ |, client: .*$", "", line)
            counts[msg[:200]] = counts.get(msg[:200], 0) + 1
        if counts:
            out[name] = dict(sorted(counts.items(), key=lambda kv: -kv[1])[:20])
    return out


def wait_quiet(limit_s: float, busy_max: float = 0.15, window_s: float = 5.0) -> dict:
    """Wait (bounded) until the machine's busy share over a window is below busy_max."""
    t0 = time.monotonic()
    share = 1.0
    while True:
        b0, _, n0 = sysinfo.machine_cpu()
        time.sleep(window_s)
        b1, _, n1 = sysinfo.machine_cpu()
        share = (b1 - b0) / max(1e-9, n1 - n0)
        waited = time.monotonic() - t0
        if share <= busy_max or waited >= limit_s:
            break
        print(
            f"  machine busy {share:.0%} (other users); waiting for it to calm down "
            f"({waited:.0f}/{limit_s:.0f}s)",
            flush=True,
        )
    print(f"  machine busy {share:.0%} over the last {window_s:.0f}s; starting", flush=True)
    return {"busy_share": round(share, 3), "waited_s": round(time.monotonic() - t0, 1)}


def _mmss(s: float) -> str:
    s = max(0, int(math.ceil(s)))
    return f"{s // 60}:{s % 60:02d}"


if __name__ == "__main__":
    sys.exit(main())
