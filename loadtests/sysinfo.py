"""What machine a run was measured on, and what processes cost (CPU time, resident memory)."""

from __future__ import annotations

import contextlib
import os
import platform
import re
import resource
import socket
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CLK_TCK = os.sysconf("SC_CLK_TCK")
SYSCTLS = (
    "net.core.somaxconn",
    "net.ipv4.tcp_max_syn_backlog",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.tcp_tw_reuse",
    "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_syncookies",
    "net.core.netdev_max_backlog",
    "net.ipv4.tcp_congestion_control",
    "fs.file-max",
    "fs.nr_open",
)


def _out(cmd: list[str]) -> str:
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"unavailable ({e})"
    return (p.stdout + p.stderr).strip()


def _first_line(cmd: list[str]) -> str:
    out = _out(cmd)
    return out.splitlines()[0] if out else ""


def sysctl(name: str) -> str:
    path = Path("/proc/sys") / name.replace(".", "/")
    try:
        return " ".join(path.read_text().split())
    except OSError:
        return "unreadable"


def sysctl_writable(name: str) -> bool:
    return os.access(Path("/proc/sys") / name.replace(".", "/"), os.W_OK)


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def machine(poll_server: Path | None = None) -> dict[str, object]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    mem_kb = 0
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            mem_kb = int(line.split()[1])
    versions = {
        "nginx": _first_line(["nginx", "-v"]).removeprefix("nginx version: "),
        "memcached": _first_line(["memcached", "-V"]),
        "wrk": _first_line(["wrk", "--version"]).split(" Copyright")[0],
        "ab": _first_line(["ab", "-V"]).removeprefix("This is ").split(" <")[0],
        "python": platform.python_version(),
        "libevent": _first_line(["pkg-config", "--modversion", "libevent"]),
        "libmemcached": _first_line(["pkg-config", "--modversion", "libmemcached"]),
    }
    if poll_server is not None and poll_server.exists():
        versions["poll_server"] = _first_line([str(poll_server), "-V"])
    commit = _out(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"])
    dirty = _out(
        [
            "git",
            "-C",
            str(ROOT),
            "status",
            "--porcelain",
            "--",
            "poll_server",
            "nginx",
            "fallback_app",
            "testkit/fastpoll_testkit/stack.py",
            "loadtests",
        ]
    )
    return {
        "hostname": socket.gethostname(),
        "nproc": os.cpu_count(),
        "cpu_model": cpu_model(),
        "kernel": platform.release(),
        "os": _os_release(),
        "mem_total_mb": mem_kb // 1024,
        "nofile_limit": {"soft": soft, "hard": hard},
        "loadavg_at_start": [round(x, 2) for x in os.getloadavg()],
        "sysctl": {name: sysctl(name) for name in SYSCTLS},
        "versions": versions,
        "git": {"commit": commit, "dirty": bool(dirty.strip())},
    }


def _os_release() -> str:
    try:
        text = Path("/etc/os-release").read_text()
    except OSError:
        return platform.platform()
    m = re.search(r'^PRETTY_NAME="?([^"\n]*)', text, re.M)
    return m.group(1) if m else platform.platform()


def machine_cpu() -> tuple[float, float, float]:
    """(busy, irq+softirq, total) CPU seconds of the whole machine since boot (/proc/stat).

    Interrupt time is kept apart: loopback traffic is processed in softirq, which the kernel
    may account there rather than to the processes that caused it."""
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    total = sum(fields[:8])  # user nice system idle iowait irq softirq steal
    idle = fields[3] + fields[4]
    irq = fields[5] + fields[6]
    return (total - idle) / CLK_TCK, irq / CLK_TCK, total / CLK_TCK


TCP_COUNTERS = (
    "ListenOverflows",
    "ListenDrops",
    "TCPTimeouts",
    "TCPSynRetrans",
    "TCPAbortOnOverflow",
    "TCPReqQFullDrop",
    "SyncookiesSent",
    "TCPBacklogDrop",
)


def tcp_counters() -> dict[str, int]:
    """Machine-wide TCP counters (/proc/net/netstat) that reveal dropped SYNs and timeouts:
    a listen queue overflow costs the client a 1 s SYN retransmission, a latency tail."""
    out: dict[str, int] = {}
    lines = Path("/proc/net/netstat").read_text().splitlines()
    for names, values in zip(lines[::2], lines[1::2], strict=False):
        for n, v in zip(names.split()[1:], values.split()[1:], strict=False):
            if n in TCP_COUNTERS:
                out[n] = int(v)
    return out


# ---- per-process costs --------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (its own threads, not its children), in seconds."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()  # the name may contain spaces
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # fields 14 and 15 of proc(5)


def status_kb(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def children(pid: int) -> list[int]:
    """Direct children of pid (nginx workers, uvicorn workers)."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        if int(stat[stat.rindex(")") + 2 :].split()[1]) == pid:
            out.append(int(d.name))
    return sorted(out)


class CpuMeter:
    """CPU seconds used by groups of processes between start() and stop()."""

    def __init__(self, groups: dict[str, list[int]]) -> None:
        self.groups = {g: [p for p in pids if p] for g, pids in groups.items()}
        self._before: dict[int, float] = {}

    def _sample(self) -> dict[int, float]:
        out = {}
        for pids in self.groups.values():
            for pid in pids:
                with contextlib.suppress(OSError):  # it exited
                    out[pid] = cpu_seconds(pid)
        return out

    def start(self) -> None:
        self._before = self._sample()

    def stop(self) -> dict[str, float]:
        after = self._sample()
        return {
            g: round(sum(after.get(p, 0.0) - self._before.get(p, 0.0) for p in pids), 3)
            for g, pids in self.groups.items()
        }
