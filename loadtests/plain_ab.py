"""Plain polls must not get slower with channels: one poll server build against another on the
seed's commands, with nginx `memcached_pass` as the yardstick, in interleaved rounds of one run.

    .venv/bin/python -m loadtests.plain_ab --old BINARY --new BINARY [--rounds 3] [--seconds 10]

Two stacks from the harness (testkit/fastpoll_testkit, the bench's nginx tuning from
loadtests/plans.py: one worker per core, pinned, 1 active poll server and its standby), the same
but for the poll server binary, each with its own memcached (`-t 1`, memcached at its best on 2
cores) holding user 1's answer, and nginx `memcached_pass` (loadtests/peers.py) on the new
stack's memcached. Each round runs, for each system in turn (the order rotated each round):
the seed's `ab -c 50 -n 5000` on the signed poll URL of user 1 (no keep-alive), then wrk -c50
-t2 keep-alive on the same hit for `--seconds`. Machine load hits all three alike within a round;
the figures are each system's median over the rounds, and the per-round ratios new/old and
new/memcached_pass (their medians). Requests per second move with other work's load on a shared
machine; the servers' CPU time per request (utime+stime from /proc of the system's nginx, poll
servers and memcached over each ab or wrk run, divided by its requests) much less: both are
reported. The load average is recorded at every round.

JSON: loadtests/results/plain-ab-<stamp>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from fastpoll_testkit import loadgen
from fastpoll_testkit.procs import free_port
from fastpoll_testkit.stack import Stack
from loadtests import peers, preload, sysinfo
from loadtests.longpoll import tree
from loadtests.plans import TUNING
from loadtests.signing import Signer

RESULTS = Path(__file__).resolve().parent / "results"
USER = 1


def git_describe(binary: Path) -> str:
    """The commit a build came from, if its tree says (`git archive` trees do not)."""
    try:
        out = subprocess.run(
            ["git", "-C", str(binary.parent), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except OSError:
        return ""
    return out.stdout.strip()


def start(run_dir: Path, binary: Path) -> Stack:
    stack = Stack(
        run_dir=run_dir,
        backend="memcached",
        http_port=free_port(),
        poll_server=binary,
        memcached_args=["-t", "1"],
    )
    vars_ = {k: v for k, v in TUNING.items() if k != "listen_options"}
    vars_["fastpoll_listen"] = f"127.0.0.1:{stack.http_port}{TUNING['listen_options']}"
    stack.nginx_vars.update(vars_)
    stack.start()
    preload.preload([f"127.0.0.1:{p}" for p in stack.memcached_ports], USER)
    return stack


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old", type=Path, required=True, help="the poll server build before")
    ap.add_argument("--new", type=Path, required=True, help="the poll server build now")
    ap.add_argument("--old-label", default="old")
    ap.add_argument("--new-label", default="new")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=10)
    args = ap.parse_args()
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    run_dir = Path(os.environ.get("FP_RUN_DIR", f"/tmp/fastpoll-plain-ab-{stamp}"))
    load0 = os.getloadavg()
    stacks: dict[str, Stack] = {}
    peer: peers.Peer | None = None
    rounds: list[dict[str, Any]] = []
    raw_log = run_dir / "raw.log"
    try:
        stacks["old"] = start(run_dir / "old", args.old)
        stacks["new"] = start(run_dir / "new", args.new)
        peer_tuning = {k: v for k, v in TUNING.items() if not k.startswith("fastpoll_")}
        peer = peers.Peer(
            "memcached_pass",
            run_dir / "memcached_pass",
            peer_tuning,
            {
                "memcached": f"127.0.0.1:{stacks['new'].memcached_ports[0]}",
                "upstream_keepalive": TUNING["fastpoll_upstream_keepalive"],
            },
        )
        peer.start()
        queries = {k: Signer(s).query(str(USER)) for k, s in stacks.items()}
        urls = {k: f"{s.base_url}/Poll/getMessages?{queries[k]}" for k, s in stacks.items()}
        urls["memcached_pass"] = f"{peer.base_url}/Poll/getMessages?user_id={USER}"
        mc = [v.pid for k, v in stacks["new"].procs.items() if k.startswith("memcached-")]
        groups = {
            k: {
                "nginx": tree(s.procs["nginx"].pid),
                "poll_servers": [v.pid for n, v in s.procs.items() if n.startswith("poller-")],
                "memcached": [v.pid for n, v in s.procs.items() if n.startswith("memcached-")],
            }
            for k, s in stacks.items()
        }
        groups["memcached_pass"] = {"nginx": tree(peer.pid), "memcached": mc}
        targets: dict[str, Path] = {}
        for k in urls:
            targets[k] = run_dir / f"targets-{k}.txt"
            targets[k].write_text((queries.get(k) or f"user_id={USER}") + "\n")
        order = ["old", "new", "memcached_pass"]
        for rnd in range(1, args.rounds + 1):
            systems = order[(rnd - 1) % 3 :] + order[: (rnd - 1) % 3]
            row: dict[str, Any] = {"round": rnd, "order": systems, "loadavg": os.getloadavg()}
            for k in systems:
                meter = sysinfo.CpuMeter(groups[k])
                meter.start()
                ab = loadgen.run_ab(urls[k], 50, 5000, raw_log=raw_log)
                ab_by = meter.stop()
                ab_cpu = sum(ab_by.values())
                base, _, _ = urls[k].partition("/Poll/")
                meter.start()
                wrk = loadgen.run_wrk(
                    base,
                    50,
                    args.seconds,
                    env={
                        "FP_PATH": "/Poll/getMessages",
                        "FP_TARGETS": str(targets[k]),
                        "FP_USERS": "1",
                    },
                    raw_log=raw_log,
                )
                wrk_by = meter.stop()
                wrk_cpu = sum(wrk_by.values())
                row[k] = {
                    "ab_rps": ab.rps,
                    "ab_p50_ms": ab.p50_ms,
                    "ab_p99_ms": ab.p99_ms,
                    "ab_failed": ab.failed,
                    "wrk_rps": wrk.rps,
                    "wrk_p50_ms": wrk.p50_ms,
                    "wrk_p99_ms": wrk.p99_ms,
                    "wrk_failed": wrk.failed,
                    "ab_cpu_us_per_request": round(ab_cpu / 5000 * 1e6, 2),
                    "ab_cpu_s": ab_by,
                    "wrk_cpu_s": wrk_by,
                    "wrk_requests": wrk.requests,
                    "ab_poll_servers_us_per_request": round(
                        ab_by.get("poll_servers", 0.0) / 5000 * 1e6, 2
                    ),
                    "wrk_poll_servers_us_per_request": round(
                        wrk_by.get("poll_servers", 0.0) / wrk.requests * 1e6, 2
                    )
                    if wrk.requests
                    else None,
                    "wrk_cpu_us_per_request": round(wrk_cpu / wrk.requests * 1e6, 2)
                    if wrk.requests
                    else None,
                }
                print(
                    f"r{rnd} {k:15} ab {ab.rps:9.0f}/s {row[k]['ab_cpu_us_per_request']:6.1f} us"
                    f"  wrk {wrk.rps:9.0f}/s {row[k]['wrk_cpu_us_per_request']} us",
                    flush=True,
                )
            rounds.append(row)
    finally:
        if peer is not None:
            peer.stop()
        for s in stacks.values():
            s.stop()

    def med(k: str, f: str) -> float:
        return round(statistics.median(r[k][f] for r in rounds), 1)

    def ratio(a: str, b: str, f: str) -> float:
        return round(statistics.median(r[a][f] / r[b][f] for r in rounds if r[b][f]), 3)

    figures = (
        "ab_rps",
        "ab_p50_ms",
        "ab_p99_ms",
        "ab_cpu_us_per_request",
        "wrk_rps",
        "wrk_p99_ms",
        "wrk_cpu_us_per_request",
        "ab_poll_servers_us_per_request",
        "wrk_poll_servers_us_per_request",
    )
    summary = {k: {f: med(k, f) for f in figures} for k in ("old", "new", "memcached_pass")}
    summary["ratios"] = {
        "ab_new_over_old": ratio("new", "old", "ab_rps"),
        "wrk_new_over_old": ratio("new", "old", "wrk_rps"),
        "ab_new_over_memcached_pass": ratio("new", "memcached_pass", "ab_rps"),
        "wrk_new_over_memcached_pass": ratio("new", "memcached_pass", "wrk_rps"),
        "ab_old_over_memcached_pass": ratio("old", "memcached_pass", "ab_rps"),
        "wrk_old_over_memcached_pass": ratio("old", "memcached_pass", "wrk_rps"),
        "ab_cpu_new_over_old": ratio("new", "old", "ab_cpu_us_per_request"),
        "wrk_cpu_new_over_old": ratio("new", "old", "wrk_cpu_us_per_request"),
        "ab_poll_servers_cpu_new_over_old": ratio("new", "old", "ab_poll_servers_us_per_request"),
        "wrk_poll_servers_cpu_new_over_old": ratio("new", "old", "wrk_poll_servers_us_per_request"),
    }
    doc = {
        "stamp": stamp,
        "command": f"python -m loadtests.plain_ab --old {args.old} --new {args.new} "
        f"--rounds {args.rounds} --seconds {args.seconds:g}",
        "old": {"label": args.old_label, "binary": str(args.old), "commit": git_describe(args.old)},
        "new": {"label": args.new_label, "binary": str(args.new), "commit": git_describe(args.new)},
        "machine": {"cpus": os.cpu_count(), "cpu_model": sysinfo.cpu_model()},
        "loadavg_start": load0,
        "loadavg_end": os.getloadavg(),
        "rounds": rounds,
        "summary": summary,
    }
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"plain-ab-{stamp}.json"
    out.write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps(summary, indent=1))
    print(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
