"""What one cache hit costs a poll server: system calls, allocations and CPU per hit.

    .venv/bin/python loadtests/hitcost.py BINARY [BINARY ...] [--reps 3] [--seconds 3]

For each binary (e.g. the build before a change and after it), interleaved and repeated: a fresh
memcached and poll server (unsigned URLs, one hot key), then wrk keep-alive straight to the poll
server over TCP at c=1 and c=50:
- CPU per hit: the poll server's utime+stime (/proc) over the hits of a plain wrk run;
- system calls per hit: `strace -c -f -p` around a wrk run (strace slows the server; counts,
  not times, are what is read);
- allocations per hit: an LD_PRELOAD counter of malloc/calloc/realloc/free (built here with cc),
  read before and after a wrk run that follows a warm-up, so start-up does not count.
With --floor, nginx (one worker) answering the same body with `return 200` is measured the same
way alongside (CPU and system calls of its worker): what one keep-alive answer on loopback costs
a server that does nothing else, the floor under a poll server's CPU per hit.
Prints one line per binary and concurrency with the medians; loopback only.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

import hop_cost  # noqa: E402
import sysinfo  # noqa: E402

COUNTER_C = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
static unsigned long n_malloc, n_calloc, n_realloc, n_free;
static void *(*r_malloc)(size_t);
static void *(*r_calloc)(size_t, size_t);
static void *(*r_realloc)(void *, size_t);
static void (*r_free)(void *);
static char early[4096];
static size_t early_used;
static int resolving;
static void resolve(void) {
    if (r_malloc || resolving) return;
    resolving = 1;
    r_malloc = dlsym(RTLD_NEXT, "malloc");
    r_calloc = dlsym(RTLD_NEXT, "calloc");
    r_realloc = dlsym(RTLD_NEXT, "realloc");
    r_free = dlsym(RTLD_NEXT, "free");
    resolving = 0;
}
void *malloc(size_t n) { resolve(); n_malloc++; return r_malloc(n); }
void *calloc(size_t a, size_t b) {
    if (!r_calloc) { /* dlsym's own calloc, before we know the real one */
        void *p = early + early_used; early_used += (a * b + 15) & ~(size_t)15;
        return p;
    }
    n_calloc++; return r_calloc(a, b);
}
void *realloc(void *p, size_t n) { resolve(); n_realloc++; return r_realloc(p, n); }
void free(void *p) {
    if ((char *)p >= early && (char *)p < early + sizeof(early)) return;
    resolve(); if (p) n_free++; r_free(p);
}
static void dump(int sig) {
    char buf[160];
    int n = snprintf(buf, sizeof(buf), "ALLOCS malloc=%lu calloc=%lu realloc=%lu free=%lu\n",
                     n_malloc, n_calloc, n_realloc, n_free);
    (void)sig;
    if (n > 0) (void)!write(2, buf, (size_t)n);
}
__attribute__((constructor)) static void init(void) { resolve(); signal(SIGUSR2, dump); }
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_port(port: int) -> None:
    for _ in range(200):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listens on {port}")


def wrk(port: int, conns: int, seconds: int) -> int:
    out = subprocess.run(
        [
            "wrk",
            "-t1",
            f"-c{conns}",
            f"-d{int(seconds)}s",
            f"http://127.0.0.1:{port}/getMessages?user_id=1",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    m = re.search(r"(\d+) requests in", out)
    bad = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    # A few 503s (the cache's 100 ms timeout on a busy machine) are tolerated, not more.
    if m is None or (bad is not None and int(bad.group(1)) * 100 > int(m.group(1))):
        raise RuntimeError(f"wrk: {out}")
    return int(m.group(1))


def cpu_s(pid: int) -> float:
    f = Path(f"/proc/{pid}/stat").read_text()
    f2 = f[f.rindex(")") + 2 :].split()
    return (int(f2[11]) + int(f2[12])) / sysinfo.CLK_TCK


def allocs(log: Path, pid: int) -> int:
    os.kill(pid, signal.SIGUSR2)
    time.sleep(0.2)
    lines = [x for x in log.read_text().splitlines() if x.startswith("ALLOCS")]
    nums = [int(v) for v in re.findall(r"=(\d+)", lines[-1])]
    return sum(nums[:3])  # malloc + calloc + realloc


FLOOR = "nginx-return-200"


def start_floor(port: int) -> tuple[subprocess.Popen, int]:
    """nginx with one worker answering the hit's body itself; returns (master, worker pid)."""
    body = '{"unread":1}'
    server = f"""    server {{
        listen 127.0.0.1:{port};
        default_type application/json;
        location / {{ return 200 '{body}'; }}
    }}"""
    master = hop_cost.start("hitcost-floor", server, free_port())
    wait_port(port)
    kids = Path(f"/proc/{master.pid}/task/{master.pid}/children").read_text().split()
    if len(kids) != 1:
        master.terminate()
        raise RuntimeError(f"nginx floor: expected one worker, found {kids}")
    return master, int(kids[0])


def measure(binary: str, label: str, tmp: Path, counter: Path, seconds: int) -> dict[str, float]:
    if binary == FLOOR:
        return measure_floor(label, tmp, seconds)
    mc_port, port = free_port(), free_port()
    ini = tmp / "fastpoll.ini"
    ini.write_text(f"[memcached]\nservers = 127.0.0.1:{mc_port}\n[log]\nlevel = warn\n")
    mc_argv = ["memcached", "-l", "127.0.0.1", "-p", str(mc_port), "-U", "0", "-t", "1"]
    if os.geteuid() == 0:
        mc_argv += ["-u", "nobody"]
    mc = subprocess.Popen(mc_argv)
    log = tmp / "poll_server.log"
    env = dict(os.environ, LD_PRELOAD=str(counter))
    srv = None
    try:
        wait_port(mc_port)
        with socket.create_connection(("127.0.0.1", mc_port)) as s:
            s.sendall(b'set /Poll/getMessages?user_id=1 0 0 12\r\n{"unread":1}\r\n')
            s.recv(100)
        with open(log, "wb") as err:
            srv = subprocess.Popen([binary, "-c", str(ini), "-p", str(port)], stderr=err, env=env)
        wait_port(port)
        return per_hit(port, srv.pid, lambda: allocs(log, srv.pid), label, tmp, seconds)
    finally:
        for p in (srv, mc):
            if p is not None and p.poll() is None:
                p.terminate()
                p.wait(timeout=10)


def per_hit(
    port: int, pid: int, count_allocs: Callable[[], int] | None, label: str, tmp: Path, seconds: int
) -> dict[str, float]:
    """CPU, allocations and system calls per hit of the server `pid` listening on `port`."""
    out: dict[str, float] = {}
    for conns in (1, 50):
        wrk(port, conns, 1)  # warm-up: connections, free lists, the cache's buffers
        a0, c0 = count_allocs() if count_allocs else 0, cpu_s(pid)
        n = wrk(port, conns, seconds)
        a1, c1 = count_allocs() if count_allocs else 0, cpu_s(pid)
        out[f"cpu_us_c{conns}"] = (c1 - c0) / n * 1e6
        out[f"allocs_c{conns}"] = (a1 - a0) / n if count_allocs else float("nan")
        st = tmp / f"strace-{conns}.txt"
        tr = subprocess.Popen(
            ["strace", "-c", "-f", "-o", str(st), "-p", str(pid)], stderr=subprocess.DEVNULL
        )
        time.sleep(0.5)
        n = wrk(port, conns, seconds)
        tr.send_signal(signal.SIGINT)
        tr.wait(timeout=20)
        total = re.search(r"-+\n100\.00\s+\S+\s+\S+\s+(\d+)", st.read_text())
        if total is None:
            total = re.search(r"\s(\d+)\s+(?:\d+\s+)?total", st.read_text())
        out[f"syscalls_c{conns}"] = int(total.group(1)) / n if total else float("nan")
        st.rename(tmp / f"strace-c{conns}-{label}.txt")
    return out


def measure_floor(label: str, tmp: Path, seconds: int) -> dict[str, float]:
    port = free_port()
    master, worker = start_floor(port)
    try:
        return per_hit(port, worker, None, label, tmp, seconds)
    finally:
        master.terminate()
        master.wait(timeout=10)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("binaries", nargs="+")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--seconds", type=int, default=3)
    ap.add_argument(
        "--floor", action="store_true", help="also measure nginx answering `return 200` itself"
    )
    args = ap.parse_args()
    if args.floor:
        args.binaries.append(FLOOR)
    tmp = Path(tempfile.mkdtemp(prefix="fp-hitcost-"))
    counter = tmp / "count_allocs.so"
    (tmp / "count_allocs.c").write_text(COUNTER_C)
    subprocess.run(
        ["cc", "-O2", "-shared", "-fPIC", "-o", str(counter), str(tmp / "count_allocs.c"), "-ldl"],
        check=True,
    )
    rows: dict[str, list[dict[str, float]]] = {b: [] for b in args.binaries}
    for _ in range(args.reps):
        for i, b in enumerate(args.binaries):
            rows[b].append(measure(b, f"{i}-rep{len(rows[b])}", tmp, counter, args.seconds))
    for b, rs in rows.items():
        for conns in (1, 50):
            med = {
                k: statistics.median(r[f"{k}_c{conns}"] for r in rs)
                for k in ("cpu_us", "allocs", "syscalls")
            }
            n_allocs = "-" if b == FLOOR else f"{med['allocs']:.2f}"  # nginx: its own pools
            print(
                f"{b} c={conns}: {med['cpu_us']:.1f} us CPU/hit, {n_allocs} "
                f"allocations/hit, {med['syscalls']:.2f} syscalls/hit (median of {len(rs)}; "
                f"strace tables in {tmp})"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
