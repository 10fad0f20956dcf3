"""What the poll server's metrics cost on the hot path: metrics on versus compiled out.

Builds poll_server with -DFP_NO_STATS beside the normal build, runs both against one memcached
holding one key, directly (no nginx: the poll server's own cost is the point), and alternates
bounded wrk runs between them. It reports requests/second and, the robust reading on a shared
machine, the poll server's CPU time per request (utime + stime from /proc/PID/stat).

    .venv/bin/python loadtests/metrics_cost.py [--rounds 4] [--seconds 5]

One JSON file per run goes to loadtests/results/metrics-cost-<stamp>.json.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
from stack import free_port, start_time, tcp_ask, wait_for  # noqa: E402  (the one harness)

TICK = os.sysconf("SC_CLK_TCK")
KEY = "/Poll/getMessages?user_id=1"
VALUE = b'{"unread":1,"newest":{"id":1,"text":"hi"}}'


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def wrk(port: int, seconds: int) -> int:
    out = subprocess.run(
        ["wrk", "-t1", "-c50", f"-d{seconds}s", f"http://127.0.0.1:{port}/getMessages?user_id=1"],
        capture_output=True,
        text=True,
        check=True,
        timeout=seconds + 30,
    ).stdout
    m = re.search(r"(\d+) requests in", out)
    if m is None or "Non-2xx" in out or "Socket errors" in out:
        raise RuntimeError(f"wrk run not clean:\n{out}")
    return int(m.group(1))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--seconds", type=int, default=5)
    args = ap.parse_args()

    subprocess.run(["make", "-s", "-C", str(ROOT / "poll_server")], check=True)
    subprocess.run(
        [
            "make",
            "-s",
            "-C",
            str(ROOT / "poll_server"),
            "BUILD=build-nostats",
            "CFLAGS=-O2 -g -DFP_NO_STATS",
        ],
        check=True,
    )
    binaries = {
        "metrics on": ROOT / "poll_server/build/poll_server",
        "metrics compiled out": ROOT / "poll_server/build-nostats/poll_server",
    }
    procs: list[subprocess.Popen] = []
    try:
        mc_port = free_port()
        mc = subprocess.Popen(
            ["memcached", "-l", "127.0.0.1", "-p", str(mc_port), "-U", "0", "-m", "16"]
            + (["-u", "nobody"] if os.geteuid() == 0 else []),
        )
        procs.append(mc)
        wait_for("memcached", lambda: tcp_ask(mc_port, b"version\r\n", b"VERSION"), proc=mc)
        setcmd = b"set %s 0 0 %d\r\n%s\r\n" % (KEY.encode(), len(VALUE), VALUE)
        if not tcp_ask(mc_port, setcmd, b"STORED"):
            raise RuntimeError("could not store the key")
        ports: dict[str, int] = {}
        pids: dict[str, int] = {}
        for name, binary in binaries.items():
            port = free_port()
            argv = [str(binary), "-p", str(port), "-s", f"127.0.0.1:{mc_port}", "-L", "warn"]
            if name == "metrics on":
                argv += ["-A", str(free_port())]
            p = subprocess.Popen(argv)
            procs.append(p)
            wait_for(
                name,
                functools.partial(
                    tcp_ask, port, b"GET /getMessages?user_id=1 HTTP/1.0\r\n\r\n", b"200 OK"
                ),
                proc=p,
            )
            ports[name], pids[name] = port, p.pid
        totals = {name: {"requests": 0, "cpu": 0.0, "seconds": 0.0} for name in binaries}
        for r in range(args.rounds):
            for name in binaries if r % 2 == 0 else reversed(list(binaries)):
                c0, t0 = cpu_seconds(pids[name]), time.monotonic()
                n = wrk(ports[name], args.seconds)
                totals[name]["requests"] += n
                totals[name]["cpu"] += cpu_seconds(pids[name]) - c0
                totals[name]["seconds"] += time.monotonic() - t0
                print(
                    f"round {r + 1}/{args.rounds} {name:22} {n / args.seconds:9,.0f} req/s",
                    flush=True,
                )
    finally:
        for p in procs:
            if p.poll() is None and start_time(p.pid):
                p.terminate()
                p.wait(10)

    result = {
        "when": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "rounds": args.rounds,
        "seconds": args.seconds,
        "load_average": os.getloadavg(),
        "systems": {},
    }
    for name, t in totals.items():
        result["systems"][name] = {
            "req_per_s": t["requests"] / t["seconds"],
            "cpu_us_per_request": 1e6 * t["cpu"] / t["requests"],
        }
    on, off = result["systems"]["metrics on"], result["systems"]["metrics compiled out"]
    result["cpu_ratio_on_over_off"] = on["cpu_us_per_request"] / off["cpu_us_per_request"]
    for name, s in result["systems"].items():
        cpu = s["cpu_us_per_request"]
        print(f"{name:22} {s['req_per_s']:9,.0f} req/s  {cpu:6.2f} us CPU/request")
    print(f"CPU per request, metrics on / compiled out: {result['cpu_ratio_on_over_off']:.3f}")
    out = ROOT / "loadtests/results" / f"metrics-cost-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"written {out.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
