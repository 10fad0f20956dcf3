"""Failure drills under load, as a new user would run them: a cache node lost or hung
while wrk polls random users, and what the clients and the app saw.

    .venv/bin/python loadtests/drills.py node-loss [--fault kill|stop] [--seconds 30]
                                                   [--users 20000] [--conns 200] [--nodes 3]
                                                   [--replicas 0|1] [--no-check-stale]
    .venv/bin/python loadtests/drills.py herd [--seconds 20] [--conns 400] [--cap 64]
    .venv/bin/python loadtests/drills.py edge [--seconds 20] [--conns 10000 15000]

A fresh stack on free loopback ports (the harness) with `--nodes` memcached nodes, the answers
of `--users` users cached (on both copies with replicas, the default), wrk with `--conns`
keep-alive connections polling random users for `--seconds`; a third of the way in one node is
killed (`kill -9`) or hung (SIGSTOP, resumed two thirds of the way in, so the run shows the node's
return too). Meanwhile a checker publishes to users (5 a second, through the app's API) and polls
them through nginx: a poll sent after a publish returned that shows an older newest message is
stale (`stale`, must be 0). Report: failed requests (socket errors, timeouts, any status but 200),
p99, where the load went (cache, app, shed by nginx's fallback cap) overall and after the fault,
and the time from the fault until the hit ratio is back above 95% for good. The per-second
timeline comes from nginx's access log (`src=` and `rt=` of every request). Results:
loadtests/results/drill-*.json, with the machine's load average at the start.

The herd drill: first the app's capacity, measured as wrk against the app's own listener with
every poll a miss (the cache stopped) at 4 x its workers connections; then every memcached node
is gone and wrk polls through nginx with `--conns` connections, far more than nginx's fallback cap
(`--cap`, fastpoll_fallback_max_conns) admits. Report: requests over wrk's timeout and socket
errors (both must be 0), answers by status and source (200 from the app, 503 shed with
Retry-After), the rate the app was given against its capacity, and the app's latency behind the
cap (nginx's upstream time) against its latency when measured alone.

The edge drill: `make up`'s defaults (nothing tuned for the run) hold `--conns` keep-alive clients
each (wrk, all connecting at once, random users with cached answers): requests over wrk's 10 s
timeout, socket errors and non-2xx must all be 0. Also the kernel's listen-queue overflows during
the run (TcpExtListenOverflows: a SYN dropped because an accept queue was full).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import signal
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from datetime import UTC, datetime
from pathlib import Path

from fastpoll_testkit import loadgen
from fastpoll_testkit.procs import freeze
from fastpoll_testkit.stack import Stack  # the one stack harness
from loadtests import preload
from loadtests.signing import Signer

HERE = Path(__file__).resolve().parent


RESULTS = HERE / "results"
RECOVERED = 0.95
STABLE_S = 3  # the hit ratio must hold above RECOVERED this many seconds in a row


def timeline(access_log: Path) -> dict[int, Counter[str]]:
    """Requests per second of the run, by X-Poll-Source (cache, app, shed, - for neither)."""
    per_s: dict[int, Counter[str]] = defaultdict(Counter)
    for line in access_log.read_text().splitlines():
        parts = line.split(" ", 1)
        m = re.search(r" src=(\S*)", line)
        if not m:
            continue
        ts = int(datetime.fromisoformat(parts[0]).timestamp())
        per_s[ts][m.group(1) or "-"] += 1
    return per_s


def recovery_s(per_s: dict[int, Counter[str]], fault_at: int, end: int) -> float | None:
    """Seconds from the fault until the hit ratio holds above RECOVERED for STABLE_S seconds."""
    run = 0
    for t in range(fault_at, end + 1):
        c = per_s.get(t, Counter())
        total = sum(c.values())
        ok = total > 0 and c["cache"] / total >= RECOVERED
        run = run + 1 if ok else 0
        if run == STABLE_S:
            return float(t - STABLE_S + 1 - fault_at)
    return None


def share(per_s: dict[int, Counter[str]], since: int | None = None) -> dict[str, float]:
    total: Counter[str] = Counter()
    for t, c in per_s.items():
        if since is None or t >= since:
            total.update(c)
    n = sum(total.values()) or 1
    return {k: round(v / n, 4) for k, v in sorted(total.items())}


def preload_replicas(servers: list[str], users: int, batch: int = 2000) -> None:
    """Write each preloaded answer to its replica too (preload.preload wrote the primaries),
    placed as the app places it (fastpoll_app.cache.Placement)."""
    import pylibmc

    from fastpoll_app.cache import Placement

    placement = Placement(servers, 1)
    clients_ = {a: pylibmc.Client([a], binary=False) for a in servers}
    try:
        for start in range(1, users + 1, batch):
            per_node: dict[str, dict[bytes, bytes]] = defaultdict(dict)
            for u in range(start, min(start + batch, users + 1)):
                k = preload.key(u)
                per_node[placement.nodes(k)[1]][k] = preload.answer(u)
            for addr, chunk in per_node.items():
                failed = clients_[addr].set_multi(chunk, time=0)
                if failed:
                    raise RuntimeError(f"{addr} refused {len(failed)} keys")
    finally:
        placement.close()
        for c in clients_.values():
            c.disconnect_all()


class StaleChecker:
    """Publishes to users through the app's API and polls them through nginx: a poll sent after
    a publish returned must show that message or a newer one as the newest."""

    def __init__(self, stack: Stack, users: list[int], rate: float = 5.0) -> None:
        self.stack, self.users, self.period = stack, users, 1.0 / rate
        self.published: dict[int, int] = {}
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.counts: Counter[str] = Counter()
        self.stale_at: list[float] = []
        self.threads = [
            threading.Thread(target=self._publish, daemon=True),
            threading.Thread(target=self._check, daemon=True),
        ]
        self.t0 = time.time()

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def _publish(self) -> None:
        rng = random.Random(11)
        with self.stack.api(timeout=10) as api:
            while not self.stop.wait(self.period):
                u = rng.choice(self.users)
                try:
                    r = api.post("/api/messages", json={"user_id": u, "text": "drill"})
                except Exception:  # noqa: BLE001 - counted, the drill goes on
                    self.counts["publish_error"] += 1
                    continue
                if r.status_code != 201:
                    self.counts[f"publish_{r.status_code}"] += 1
                    continue
                self.counts["publish_" + r.headers.get("x-cache-publish", "?")] += 1
                with self.lock:
                    self.published[u] = int(r.json()["id"])

    def _check(self) -> None:
        import httpx

        rng = random.Random(12)
        with httpx.Client(base_url=self.stack.base_url, timeout=10) as c:
            while not self.stop.is_set():
                with self.lock:
                    if not self.published:
                        u = None
                    else:
                        u = rng.choice(list(self.published))
                        want = self.published[u]
                if u is None:
                    time.sleep(0.05)
                    continue
                try:
                    r = c.get(self.stack.poll_url(u))
                except Exception:  # noqa: BLE001
                    self.counts["check_error"] += 1
                    continue
                self.counts[f"check_{r.status_code}_{r.headers.get('x-poll-source', '-')}"] += 1
                if r.status_code == 200:
                    body = json.loads(r.content) if r.content else {}
                    got = int(body.get("newest", {}).get("id", 0))
                    if got < want:
                        self.counts["stale"] += 1
                        self.stale_at.append(round(time.time() - self.t0, 2))
                time.sleep(0.01)

    def result(self) -> dict[str, object]:
        self.stop.set()
        for t in self.threads:
            t.join(15)
        return {
            "stale": self.counts.get("stale", 0),
            "stale_at_s": self.stale_at[:20],
            "counts": dict(sorted(self.counts.items())),
        }


def drill_stack(
    n_memcached: int = 1,
    extra_ini: dict[str, dict[str, str]] | None = None,
    nginx_vars: dict[str, object] | None = None,
) -> tuple[Path, tuple[float, float, float], Stack]:
    """A fresh stack with nginx's access log (the drills' timeline), and the load average before."""
    run_dir = Path(tempfile.mkdtemp(prefix="fastpoll-drill-"))
    load_avg = os.getloadavg()
    stack = Stack(
        run_dir=run_dir,
        backend="memcached",
        access_log=True,
        n_memcached=n_memcached,
        extra_ini=extra_ini or {},
        nginx_vars=nginx_vars or {},
    )
    stack.start()
    return run_dir, load_avg, stack


def node_loss(args: argparse.Namespace) -> dict[str, object]:
    run_dir, load_avg, stack = drill_stack(
        n_memcached=args.nodes, extra_ini={"memcached": {"replicas": str(args.replicas)}}
    )
    checker: StaleChecker | None = None
    resumed_at: float | None = None
    try:
        servers = [f"127.0.0.1:{p}" for p in stack.memcached_ports]
        preload.preload(servers, args.users)
        if args.replicas:
            preload_replicas(servers, args.users)
        uids = (str(u) for u in range(1, args.users + 1))
        targets = Signer(stack).write(run_dir / "targets.txt", uids)
        env = {"FP_TARGETS": str(targets), "FP_USERS": str(args.users)}
        result: dict[str, loadgen.LoadResult] = {}
        load = threading.Thread(
            target=lambda: result.setdefault(
                "wrk",
                loadgen.run_wrk(
                    f"{stack.base_url}/Poll/getMessages", args.conns, args.seconds, env=env
                ),
            )
        )
        start = time.time()
        load.start()
        if args.check_stale:
            checker = StaleChecker(stack, list(range(1, min(args.users, 500) + 1)))
            checker.start()
        time.sleep(args.seconds / 3)
        victim = stack.procs["memcached-0"].pid
        fault_at = time.time()
        if args.fault == "kill":
            os.kill(victim, signal.SIGKILL)
        else:
            freeze(victim)
        if args.fault == "stop":
            time.sleep(max(0.0, start + args.seconds * 2 / 3 - time.time()))
            os.kill(victim, signal.SIGCONT)
            resumed_at = time.time()
        load.join(args.seconds + 120)
        end = time.time()
    finally:
        stale = checker.result() if checker is not None else None
        if args.fault == "stop":
            with contextlib.suppress(ProcessLookupError):
                os.kill(stack.procs["memcached-0"].pid, signal.SIGCONT)
        stack.stop()  # nginx flushes its access log as it exits
    wrk = result["wrk"]
    per_s = timeline(run_dir / "nginx" / "access.log")
    fault_s, end_s = int(fault_at), int(end)
    rec = recovery_s(per_s, fault_s, end_s)
    d = wrk.as_dict()
    return {
        "drill": f"node-loss ({args.fault})",
        "nodes": args.nodes,
        "replicas": args.replicas,
        "load_average_at_start": [round(x, 2) for x in load_avg],
        "users": args.users,
        "conns": args.conns,
        "seconds": args.seconds,
        "fault_after_s": round(fault_at - start, 1),
        "requests": d.get("requests"),
        "rps": d.get("rps"),
        "failed": d.get("failed"),
        "errors": d.get("errors"),
        "p99_ms": d.get("p99_ms"),
        "share_all": share(per_s),
        "share_after_fault": share(per_s, fault_s),
        "recovered_above_95pct_after_s": rec,
        "resumed_after_s": round(resumed_at - start, 1) if resumed_at else None,
        "share_after_resume": share(per_s, int(resumed_at)) if resumed_at else None,
        "stale_check": stale,
        "timeline": {str(t - int(start)): dict(per_s[t]) for t in sorted(per_s) if t >= int(start)},
        "run_dir": str(run_dir),
    }


def _quantile(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return round(xs[min(len(xs) - 1, int(q * len(xs)))] * 1000, 1)


def herd(args: argparse.Namespace) -> dict[str, object]:
    run_dir, load_avg, stack = drill_stack(
        n_memcached=1, nginx_vars={"fastpoll_fallback_max_conns": args.cap}
    )
    try:
        users = 1_000_000  # random users: with the cache gone every poll is a miss anyway
        uids = (str(u) for u in range(1, 20001))
        targets = Signer(stack).write(run_dir / "targets.txt", uids)
        env = {"FP_TARGETS": str(targets), "FP_USERS": str(users)}
        # The cache gone: a dead node is refused at once, by the pollers and by the app's fills.
        os.kill(stack.procs["memcached-0"].pid, signal.SIGKILL)
        alone = loadgen.run_wrk(
            f"{stack.app_url()}/Poll/getMessages", 4 * stack.app_workers, 8, env=env
        )
        start = time.time()
        herd_run = loadgen.run_wrk(
            f"{stack.base_url}/Poll/getMessages", args.conns, args.seconds, env=env
        )
        end = time.time()
    finally:
        stack.stop()  # nginx flushes its access log as it exits
    status: Counter[str] = Counter()
    app_ut: list[float] = []
    shed_rt: list[float] = []
    for line in (run_dir / "nginx" / "access.log").read_text().splitlines():
        ts = datetime.fromisoformat(line.split(" ", 1)[0]).timestamp()
        if ts < int(start):
            continue
        m = re.search(r'" (\d{3}) .* rt=([0-9.]+) src=(\S*) .* ut=(\S+)', line)
        if not m:
            continue
        code, rt, src = m.group(1), float(m.group(2)), m.group(3) or "-"
        status[f"{code} {src}"] += 1
        if src == "shed":
            shed_rt.append(rt)
        elif code == "200":
            # ut= lists one time per upstream tried: the poller's 503, then the app's answer.
            with contextlib.suppress(ValueError):
                app_ut.append(float(m.group(4).replace(":", ",").split(",")[-1].strip()))
    h = herd_run.as_dict()
    secs = max(end - start, 1e-9)
    return {
        "drill": "herd",
        "load_average_at_start": [round(x, 2) for x in load_avg],
        "app_workers": stack.app_workers,
        "cap": args.cap,
        "conns": args.conns,
        "seconds": args.seconds,
        "app_alone": {
            "conns": alone.conns,
            "rps": alone.rps,
            "p50_ms": alone.p50_ms,
            "p99_ms": alone.p99_ms,
            "failed": alone.failed,
        },
        "requests": h.get("requests"),
        "rps": h.get("rps"),
        "timeouts": (herd_run.errors or {}).get("timeout", 0),
        "socket_errors": sum(v for k, v in (herd_run.errors or {}).items() if k != "timeout"),
        "p99_ms": h.get("p99_ms"),
        "max_ms": h.get("max_ms"),
        "answers": dict(status.most_common()),
        "app_rps_behind_cap": round(len(app_ut) / secs, 1),
        "app_p50_ms_behind_cap": _quantile(app_ut, 0.5),
        "app_p99_ms_behind_cap": _quantile(app_ut, 0.99),
        "shed_p99_ms": _quantile(shed_rt, 0.99),
        "run_dir": str(run_dir),
    }


def listen_overflows() -> int:
    """TcpExtListenOverflows, the whole network namespace's count since boot."""
    with open("/proc/net/netstat", encoding="ascii") as f:
        lines = f.read().splitlines()
    for names, values in zip(lines[::2], lines[1::2], strict=True):
        if names.startswith("TcpExt:"):
            return int(dict(zip(names.split(), values.split(), strict=True))["ListenOverflows"])
    raise RuntimeError("/proc/net/netstat has no TcpExt line")


def edge(args: argparse.Namespace) -> dict[str, object]:
    users = 5000
    run_dir, load_avg, stack = drill_stack()
    runs = []
    try:
        preload.preload([f"127.0.0.1:{p}" for p in stack.memcached_ports], users)
        uids = (str(u) for u in range(1, users + 1))
        targets = Signer(stack).write(run_dir / "targets.txt", uids)
        env = {"FP_TARGETS": str(targets), "FP_USERS": str(users)}
        for conns in args.conns:
            before = listen_overflows()
            r = loadgen.run_wrk(f"{stack.base_url}/Poll/getMessages", conns, args.seconds, env=env)
            runs.append(
                {
                    "conns": conns,
                    "requests": r.requests,
                    "rps": round(r.rps),
                    "timeouts": r.errors.get("timeout", 0),
                    "socket_errors": sum(v for k, v in r.errors.items() if k != "timeout"),
                    "non2xx": r.non2xx,
                    "p99_ms": r.p99_ms,
                    "max_ms": r.max_ms,
                    "listen_overflows": listen_overflows() - before,
                }
            )
        errors = (run_dir / "nginx" / "error.log").read_text(errors="replace").splitlines()
    finally:
        stack.stop()
    return {
        "drill": "edge",
        "load_average_at_start": [round(x, 2) for x in load_avg],
        "seconds": args.seconds,
        "users": users,
        "runs": runs,
        "nginx_error_log": [line for line in errors if "[warn]" in line or "[error]" in line][:5],
        "run_dir": str(run_dir),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = p.add_subparsers(dest="drill", required=True)
    nl = sub.add_parser("node-loss", help="kill or hang one memcached node under load")
    nl.add_argument("--fault", choices=["kill", "stop"], default="kill")
    nl.add_argument("--seconds", type=float, default=30)
    nl.add_argument("--users", type=int, default=20000)
    nl.add_argument("--conns", type=int, default=200)
    nl.add_argument("--nodes", type=int, default=3)
    nl.add_argument("--replicas", type=int, choices=[0, 1], default=1)
    nl.add_argument(
        "--no-check-stale",
        dest="check_stale",
        action="store_false",
        help="no publisher/checker (publishes 5/s and polls them through nginx)",
    )
    hd = sub.add_parser("herd", help="the cache gone, far more clients than the fallback cap")
    hd.add_argument("--seconds", type=float, default=20)
    hd.add_argument("--conns", type=int, default=400)
    hd.add_argument("--cap", type=int, default=64, help="fastpoll_fallback_max_conns")
    ed = sub.add_parser("edge", help="make up's defaults at 10,000 and 15,000 keep-alive clients")
    ed.add_argument("--seconds", type=float, default=20)
    ed.add_argument("--conns", type=int, nargs="+", default=[10000, 15000])
    args = p.parse_args()
    drills = {"node-loss": node_loss, "herd": herd, "edge": edge}
    out = drills[args.drill](args)
    RESULTS.mkdir(exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    what = f"-{args.fault}" if args.drill == "node-loss" else ""
    path = RESULTS / f"drill-{stamp}-{args.drill}{what}.json"
    path.write_text(json.dumps(out, indent=1) + "\n")
    brief = {k: v for k, v in out.items() if k not in ("timeline", "run_dir")}
    print(json.dumps(brief, indent=1))
    print(f"drill: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
