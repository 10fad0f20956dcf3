"""Where the CPU goes on a cache hit: a system-wide perf profile during wrk -c50 keep-alive runs.

    .venv/bin/python loadtests/profile.py [--seconds 5] [--attach run/]

For each case (fastpoll with one hot key, fastpoll with 100,000 keys, the nginx memcached_pass
peer with 100,000 keys) it runs wrk while `perf record -e cpu-clock -a` samples every CPU, then
prints: the share of CPU per process (wrk, nginx, poll_server, memcached) split into user and
kernel time, CPU microseconds per request for each, and the poll server's hottest symbols.
No hardware counters exist in this VM (`perf stat -e instructions` is <not supported>), so this
samples the clock; instruction counts need valgrind --tool=callgrind (see --callgrind).
Output: loadtests/results/profile-<stamp>.txt (and on stdout). With --strace instead: every
syscall of single hits on one poll server, loadtests/results/strace-poll_server-hit.txt.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

import clients  # noqa: E402
import peers  # noqa: E402
import plans  # noqa: E402
import preload  # noqa: E402
import stackctl  # noqa: E402
import sysinfo  # noqa: E402
from signing import Signer  # noqa: E402

COMMS = ("wrk", "nginx", "poll_server", "memcached")


def user_sys(pids: list[int]) -> tuple[float, float]:
    u = s = 0.0
    for pid in pids:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        f = stat[stat.rindex(")") + 2 :].split()
        u += int(f[11]) / sysinfo.CLK_TCK
        s += int(f[12]) / sysinfo.CLK_TCK
    return u, s


def perf_report(data: Path, *args: str) -> str:
    """`perf report --stdio` of a recording, with these options."""
    return subprocess.run(
        ["perf", "report", "-i", str(data), "--stdio", *args],
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout


def perf_breakdown(data: Path) -> tuple[str, dict[str, float]]:
    """Samples per comm and per kernel/user, as percent of all samples."""
    out = perf_report(data, "--sort", "comm,dso", "--percent-limit", "0.5")
    share: dict[str, float] = {}
    for line in out.splitlines():
        m = re.match(r"\s*([0-9.]+)%\s+(\S+)\s+(\S+)", line)
        if m:
            pct, comm, dso = float(m.group(1)), m.group(2), m.group(3)
            side = "kernel" if dso.startswith("[kernel") else "user"
            share[f"{comm}/{side}"] = share.get(f"{comm}/{side}", 0.0) + pct
    return out, share


def top_symbols(data: Path, comm: str, limit: int = 30) -> str:
    out = perf_report(
        data,
        "--comms",
        comm,
        "--sort",
        "dso,sym",
        "--percentage",
        "relative",
        "--percent-limit",
        "1.2",
    )
    lines = [ln for ln in out.splitlines() if ln.strip() and not ln.startswith("#")]
    return "\n".join(lines[:limit])


def strace_hits(out: Path) -> None:
    """strace one poll server (of a 1-poller stack) while three signed keep-alive GETs arrive one
    at a time: every syscall one hit costs, with nothing else to batch it with."""
    import signal
    import socket

    work = ROOT / "run" / "profile-strace"
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    t = stackctl.start(work / "stack", plans.TUNING, {"log": {"level": "warn"}}, n_pollers=1)
    try:
        preload.preload([f"127.0.0.1:{p}" for p in t.memcached_ports], 10)
        signer = Signer(t.stack)
        s = socket.create_connection(("127.0.0.1", t.poller_ports[0]))

        def hit(u: int) -> None:
            s.sendall(
                f"GET /getMessages?{signer.query(str(u))} HTTP/1.1\r\nHost: x\r\n\r\n".encode()
            )
            s.recv(4096)

        hit(1)
        with out.open("w") as f:
            f.write(
                f"# strace -f -p <poll_server>: three signed keep-alive GETs (users 2-4),\n"
                f"# one at a time, 0.2 s apart; {datetime.now(UTC):%Y-%m-%dT%H:%M:%SZ}.\n"
                f"# One hit = the lines between two long (idle) epoll_waits.\n"
            )
            f.flush()
            st = subprocess.Popen(["strace", "-f", "-p", str(t.poller_pids[0])], stderr=f)
            time.sleep(1)
            for u in (2, 3, 4):
                hit(u)
                time.sleep(0.2)
            st.send_signal(signal.SIGINT)
            st.wait(10)
        s.close()
    finally:
        t.stack.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--attach", type=Path)
    ap.add_argument("--users", type=int, default=plans.USERS)
    ap.add_argument(
        "--memcached-threads",
        type=int,
        default=None,
        help="memcached -t (default: memcached's own, 4); 1 is the peer at its best on 2 cores",
    )
    ap.add_argument(
        "--strace",
        action="store_true",
        help="only strace one poll server serving single hits (needs strace)",
    )
    args = ap.parse_args()
    if args.strace:
        out = plans.RESULTS / "strace-poll_server-hit.txt"
        strace_hits(out)
        print(f"wrote {out.relative_to(ROOT)}")
        return 0
    if shutil.which("perf") is None:
        print("profile: perf is not installed (apt-get install linux-perf)", file=sys.stderr)
        return 2
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    work = ROOT / "run" / "profile"
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    out_txt = plans.RESULTS / f"profile-{stamp}.txt"
    report: list[str] = [
        f"# profile {stamp}: wrk -t2 -c50 keep-alive, {args.seconds:g}s per case",
        f"# machine: {sysinfo.cpu_model()}, {os.cpu_count()} cores",
    ]

    if args.attach:
        target = stackctl.attach(args.attach.resolve())
    else:
        target = stackctl.start(
            work / "stack",
            plans.TUNING,
            {"log": {"level": "warn"}},
            memcached_args=["-t", str(args.memcached_threads)] if args.memcached_threads else None,
        )
    mc_servers = [f"127.0.0.1:{p}" for p in target.memcached_ports]
    peer = peers.Peer(
        "memcached_pass",
        work / "peer",
        {k: v for k, v in plans.TUNING.items() if not k.startswith("fastpoll_")},
        {
            "memcached": mc_servers[0],
            "upstream_keepalive": plans.TUNING["fastpoll_upstream_keepalive"],
        },
    )
    try:
        preload.preload(mc_servers, args.users)
        hits = Signer(target.stack).write(
            work / "hits.txt", (str(u) for u in range(1, args.users + 1))
        )
        peer.start()
        cases = [
            (
                "fastpoll, one hot key",
                target.base_url,
                1,
                {
                    "nginx": [target.nginx_pid, *sysinfo.children(target.nginx_pid)],
                    "poll_server": target.poller_pids,
                    "memcached": target.memcached_pids,
                },
            ),
            (
                "fastpoll, 100,000 keys",
                target.base_url,
                args.users,
                {
                    "nginx": [target.nginx_pid, *sysinfo.children(target.nginx_pid)],
                    "poll_server": target.poller_pids,
                    "memcached": target.memcached_pids,
                },
            ),
            (
                "nginx memcached_pass, 100,000 keys",
                peer.base_url,
                args.users,
                {
                    "nginx": [peer.pid, *sysinfo.children(peer.pid)],
                    "memcached": target.memcached_pids,
                },
            ),
        ]
        for title, base, users, groups in cases:
            data = work / f"perf-{len(report)}.data"
            before = {g: user_sys(p) for g, p in groups.items()}
            perf = subprocess.Popen(
                [
                    "perf",
                    "record",
                    "-e",
                    "cpu-clock",
                    "-F",
                    "1999",
                    "-a",
                    "-o",
                    str(data),
                    "--",
                    "sleep",
                    f"{args.seconds + 0.5:g}",
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            time.sleep(0.3)
            r = clients.run_wrk(
                f"{base}/Poll/getMessages",
                50,
                args.seconds,
                env={
                    "FP_PATH": "/Poll/getMessages",
                    "FP_TARGETS": str(hits),
                    "FP_USERS": str(users),
                },
            )
            perf.wait(timeout=60)
            after = {g: user_sys(p) for g, p in groups.items()}
            report.append(
                f"\n## {title}: {r.rps:,.0f} req/s, {r.requests:,} requests, "
                f"p50 {r.p50_ms:.2f} ms, p99 {r.p99_ms:.2f} ms, failed {r.failed}"
            )
            report.append(
                f"{'process':12} {'user s':>8} {'sys s':>8} {'µs/req':>8} "
                f"{'user µs':>8} {'sys µs':>8}"
            )
            cu, cs = r.client_cpu_s, 0.0
            rows = [("wrk (u+s)", cu, cs)]
            rows += [(g, after[g][0] - before[g][0], after[g][1] - before[g][1]) for g in groups]
            for name, u, s in rows:
                report.append(
                    f"{name:12} {u:8.2f} {s:8.2f} {(u + s) / r.requests * 1e6:8.1f} "
                    f"{u / r.requests * 1e6:8.1f} {s / r.requests * 1e6:8.1f}"
                )
            text, share = perf_breakdown(data)
            report.append("perf samples by process (percent of all CPUs' samples):")
            for k in sorted(share, key=lambda k: -share[k]):
                if k.split("/")[0] in COMMS or share[k] >= 2.0:
                    report.append(f"  {k:28} {share[k]:5.1f}%")
            if "poll_server" in groups:
                report.append("poll_server hottest symbols (percent of its own samples):")
                report.append(top_symbols(data, "poll_server"))
            else:
                report.append("nginx (memcached_pass) hottest symbols (percent of its samples):")
                report.append(top_symbols(data, "nginx", 20))
            print("\n".join(report[-40:]), flush=True)
    finally:
        peer.stop()
        if target.started_here:
            target.stack.stop()
    out_txt.write_text("\n".join(report) + "\n")
    print(f"wrote {out_txt.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
