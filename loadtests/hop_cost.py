"""What one proxy hop costs over TCP loopback and over a unix socket, with nginx on both ends.

    .venv/bin/python loadtests/hop_cost.py [--seconds 4] [--rounds 2]

A front nginx proxies (HTTP/1.1, upstream keepalive 64) to a back nginx that answers `return 200`
with 47 bytes, once through 127.0.0.1 and once through a unix socket; wrk -t2 -c50 keep-alive.
Prints req/s and the CPU microseconds per request of each nginx and of the client. The back
nginx's figure is also the bar for a lean poll server: what answering one keep-alive request
on loopback costs a server that does nothing else.
"""

from __future__ import annotations

import argparse
import shutil
import signal
import sys
from pathlib import Path

from fastpoll_testkit import loadgen
from fastpoll_testkit.procs import Server, free_port
from fastpoll_testkit.stack import http_status
from loadtests import sysinfo

HERE = Path(__file__).resolve().parent


WORK = HERE.parent / "run" / "hop_cost"


def start(name: str, body: str, port: int) -> Server:
    d = WORK / name
    for sub in ("body", "proxy", "fastcgi", "uwsgi", "scgi"):
        (d / "tmp" / sub).mkdir(parents=True, exist_ok=True)
    temp = "\n".join(
        f"    {s}_temp_path {d}/tmp/{s};" for s in ("proxy", "fastcgi", "uwsgi", "scgi")
    )
    (d / "nginx.conf").write_text(f"""worker_processes 1;
pid {d}/nginx.pid;
error_log {d}/error.log warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    keepalive_requests 100000;
    client_body_temp_path {d}/tmp/body;
{temp}
    server {{ listen 127.0.0.1:{port}; location = /healthz {{ return 200; }} }}
{body}
}}
""")
    return Server(
        name,
        ["nginx", "-p", str(d), "-c", str(d / "nginx.conf"), "-g", "daemon off;"],
        port,
        log=d / "nginx.out",
        ready=lambda: http_status(f"http://127.0.0.1:{port}/healthz") == 200,
        timeout=30,
        stop_signal=signal.SIGQUIT,  # graceful: workers finish, then exit
        new_session=True,
    ).start()


def proxied_run(
    front_pid: int, back_pid: int, port: int, conns: int, seconds: float, env: dict[str, str]
) -> dict[str, object]:
    """One wrk run through a front nginx (front_pid) proxying to a back one (back_pid), on
    127.0.0.1:port with poll.lua's env: req/s, latency and each side's CPU µs per request."""
    meter = sysinfo.CpuMeter(
        {
            "front": [front_pid, *sysinfo.children(front_pid)],
            "back": [back_pid, *sysinfo.children(back_pid)],
        }
    )
    meter.start()
    r = loadgen.run_wrk(f"http://127.0.0.1:{port}/", conns, seconds, env=env)
    cpu = meter.stop()
    n = max(1, r.requests)
    return {
        "rps": round(r.rps),
        "failed": r.failed,
        "p50_ms": r.p50_ms,
        "p99_ms": r.p99_ms,
        "front_us": round(cpu["front"] / n * 1e6, 1),
        "back_us": round(cpu["back"] / n * 1e6, 1),
        "client_us": round(r.client_cpu_s / n * 1e6, 1),
    }


def measure(seconds: float = 4.0, rounds: int = 2, conns: int = 50) -> list[dict[str, object]]:
    """Run the comparison; one row per hop and round: req/s and CPU µs per request."""
    if WORK.exists():
        shutil.rmtree(WORK)
    WORK.mkdir(parents=True)
    sock = WORK / "back.sock"
    back_port, tcp_port, unix_port = free_port(), free_port(), free_port()
    body47 = "x" * 47
    proxy = 'proxy_http_version 1.1; proxy_set_header Connection "";'
    procs: list[Server] = []
    rows: list[dict[str, object]] = []
    try:
        back = start(
            "back",
            f"""    server {{
        listen 127.0.0.1:{back_port};
        listen unix:{sock};
        location / {{ return 200 '{body47}'; }}
    }}""",
            free_port(),
        )
        procs.append(back)
        front = start(
            "front",
            f"""
    upstream tcp {{ server 127.0.0.1:{back_port}; keepalive 64; }}
    upstream ux {{ server unix:{sock}; keepalive 64; }}
    server {{ listen 127.0.0.1:{tcp_port}; location / {{ proxy_pass http://tcp; {proxy} }} }}
    server {{ listen 127.0.0.1:{unix_port}; location / {{ proxy_pass http://ux; {proxy} }} }}""",
            free_port(),
        )
        procs.append(front)
        for rnd in range(rounds):
            for label, port in (("tcp", tcp_port), ("unix", unix_port)):
                run = proxied_run(
                    front.pid, back.pid, port, conns, seconds, {"FP_PATH": "/x", "FP_USERS": "1"}
                )
                rows.append({"hop": label, "round": rnd, **run})
    finally:
        for p in procs:
            p.stop()
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--conns", type=int, default=50)
    args = ap.parse_args()
    print("hop      req/s  front µs  back µs  wrk µs  p50 ms  p99 ms")
    for r in measure(args.seconds, args.rounds, args.conns):
        print(
            f"{r['hop']:5} {r['rps']:8,} {r['front_us']:9.1f} {r['back_us']:8.1f} "
            f"{r['client_us']:7.1f} {r['p50_ms']:7.2f} {r['p99_ms']:7.1f}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
