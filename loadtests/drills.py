"""Failure drills under load, as a new user would run them (issue 11): a cache node lost or hung
while wrk polls random users, and what the clients and the app saw.

    .venv/bin/python loadtests/drills.py node-loss [--fault kill|stop] [--seconds 30]
                                                   [--users 20000] [--conns 200] [--nodes 3]

A fresh stack on free loopback ports (tests/stack.py) with `--nodes` memcached nodes, the answers
of `--users` users cached, wrk with `--conns` keep-alive connections polling random users for
`--seconds`; a third of the way in one node is killed (`kill -9`) or hung (SIGSTOP, resumed at
the end). Report: failed requests (socket errors, timeouts, any status but 200), p99, where the
load went (cache, app, shed by nginx's fallback cap) overall and after the fault, and the time
from the fault until the hit ratio is back above 95% for good. The per-second timeline comes from
nginx's access log (`src=` and `rt=` of every request). Results: loadtests/results/drill-*.json.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from datetime import UTC, datetime
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
from stack import Stack  # noqa: E402  (the one stack harness)

import clients  # noqa: E402
import preload  # noqa: E402
from signing import Signer  # noqa: E402

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


def node_loss(args: argparse.Namespace) -> dict[str, object]:
    run_dir = Path(tempfile.mkdtemp(prefix="fastpoll-drill-"))
    stack = Stack(
        run_dir=run_dir, backend="memcached", n_memcached=args.nodes, access_log=True
    )
    stack.start()
    try:
        servers = [f"127.0.0.1:{p}" for p in stack.memcached_ports]
        preload.preload(servers, args.users)
        uids = (str(u) for u in range(1, args.users + 1))
        targets = Signer(stack).write(run_dir / "targets.txt", uids)
        env = {"FP_TARGETS": str(targets), "FP_USERS": str(args.users)}
        result: dict[str, clients.LoadResult] = {}
        load = threading.Thread(
            target=lambda: result.setdefault(
                "wrk",
                clients.run_wrk(
                    f"{stack.base_url}/Poll/getMessages", args.conns, args.seconds, env=env
                ),
            )
        )
        start = time.time()
        load.start()
        time.sleep(args.seconds / 3)
        victim = stack.procs["memcached-0"].pid
        fault_at = time.time()
        os.kill(victim, signal.SIGKILL if args.fault == "kill" else signal.SIGSTOP)
        load.join(args.seconds + 120)
        if args.fault == "stop":
            os.kill(victim, signal.SIGCONT)
        end = time.time()
    finally:
        stack.stop()  # nginx flushes its access log as it exits
    wrk = result["wrk"]
    per_s = timeline(run_dir / "nginx" / "access.log")
    fault_s, end_s = int(fault_at), int(end)
    rec = recovery_s(per_s, fault_s, end_s)
    d = wrk.as_dict()
    return {
        "drill": f"node-loss ({args.fault})",
        "nodes": args.nodes,
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
        "timeline": {
            str(t - int(start)): dict(per_s[t]) for t in sorted(per_s) if t >= int(start)
        },
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
    args = p.parse_args()
    out = node_loss(args)
    RESULTS.mkdir(exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    path = RESULTS / f"drill-{stamp}-{args.drill}-{args.fault}.json"
    path.write_text(json.dumps(out, indent=1) + "\n")
    brief = {k: v for k, v in out.items() if k not in ("timeline", "run_dir")}
    print(json.dumps(brief, indent=1))
    print(f"drill: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
