"""CPU profiles of the servers under load, with `perf record -g` (Debian's linux-perf): started
on a set of pids, stopped with SIGINT (perf writes its data then), read back as shares by process
and object and as the poll servers' top symbols. Used by loadtests/rooms.py (`--perf`) and by
`make bench` (the hit path's profile beside its peers')."""

from __future__ import annotations

import re
import signal
import subprocess
from pathlib import Path
from typing import Any

from fastpoll_testkit.procs import terminate


def perf_start(pids: list[int], data: Path) -> subprocess.Popen[bytes] | None:
    try:
        return subprocess.Popen(
            ["perf", "record", "-g", "-F", "999", "-o", str(data), "-p", ",".join(map(str, pids))],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    except OSError:
        return None


def perf_stop(proc: subprocess.Popen[bytes] | None) -> None:
    if proc is not None:
        terminate(proc, 60, signal.SIGINT)  # perf writes its data on SIGINT


PERF_LINE = re.compile(r"^\s+([0-9.]+)%\s+(\S+)\s+(.+?)\s*$")


def perf_shares(data: Path, sort: str, *extra: str) -> list[list[Any]]:
    """[[share %, key...], ...] from `perf report --sort <sort>` (shares of 0.5% and more)."""
    out = subprocess.run(
        [
            "perf",
            "report",
            "-i",
            str(data),
            "--no-children",
            "-g",
            "none",
            "--stdio",
            "--percent-limit",
            "0.5",
            "--sort",
            sort,
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    ).stdout
    rows: list[list[Any]] = []
    for line in out.splitlines():
        m = PERF_LINE.match(line)
        if m:
            rows.append([float(m.group(1)), m.group(2), " ".join(m.group(3).split())])
    return rows


def perf_profile(data: Path, symbols_of: tuple[str, ...] = ("poll_server",)) -> dict[str, Any]:
    """Shares by process and object, and the top symbols of each process name in SYMBOLS_OF
    (shares relative to that process's samples) as `<name>_symbols`."""
    profile: dict[str, Any] = {
        "data": str(data),
        "by_process_and_object": perf_shares(data, "comm,dso"),
    }
    for comm in symbols_of:
        profile[f"{comm}_symbols"] = perf_shares(
            data, "dso,sym", "--comm", comm, "--percentage", "relative"
        )[:25]
    return profile


# The system calls counted per process group during a profile: all of them, and the ones a hit
# is made of (the request's read, the answer's write, the loop's wait and its changes).
SYSCALLS = ("read", "readv", "recvfrom", "write", "writev", "sendto", "epoll_wait", "epoll_ctl")


def syscalls_start(pids: list[int], out: Path) -> subprocess.Popen[bytes] | None:
    """`perf stat` counting the system calls of PIDS (the raw_syscalls tracepoint, and SYSCALLS
    one by one) until perf_stop; None without perf."""
    events = ["raw_syscalls:sys_enter"] + [f"syscalls:sys_enter_{s}" for s in SYSCALLS]
    try:
        return subprocess.Popen(
            ["perf", "stat", "-x", ",", "-o", str(out), "-e", ",".join(events)]
            + ["-p", ",".join(map(str, pids))],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    except OSError:
        return None


def syscalls_read(out: Path) -> dict[str, int]:
    """{"all": n, "<syscall>": n, ...} from syscalls_start's file (after perf_stop)."""
    counts: dict[str, int] = {}
    try:
        text = out.read_text()
    except OSError:
        return counts
    for line in text.splitlines():
        f = line.split(",")
        if len(f) < 3 or not f[0].strip().isdigit():
            continue
        event = f[2].strip()
        name = "all" if event == "raw_syscalls:sys_enter" else event.rsplit("sys_enter_", 1)[-1]
        counts[name] = int(f[0])
    return counts
