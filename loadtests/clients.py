"""Run the load generators (wrk, ab) with bounded time, and parse what they print.

The parsers are pure functions over the tools' text, unit-checked by loadtests/tests/test_parsers.py
against captured outputs. Every run is bounded: wrk by -d plus a hard subprocess timeout, ab by -n
plus -s and a hard subprocess timeout.
"""

from __future__ import annotations

import json
import os
import re
import resource
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
POLL_LUA = HERE / "lua" / "poll.lua"

_UNITS_S = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_SIZE = {"": 1, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9}


class ToolError(RuntimeError):
    """The load generator failed to run or printed something we cannot read."""


@dataclass
class LoadResult:
    tool: str
    url: str
    conns: int
    keepalive: bool
    requests: int = 0
    duration_s: float = 0.0
    rps: float = 0.0
    p50_ms: float | None = None
    p75_ms: float | None = None
    p90_ms: float | None = None
    p99_ms: float | None = None
    p999_ms: float | None = None
    mean_ms: float | None = None
    max_ms: float | None = None
    errors: dict[str, int] = field(default_factory=dict)  # connect/read/write/timeout/...
    non2xx: int = 0
    failed: int = 0  # requests that did not complete properly (any error, any non-2xx)
    check: dict[str, int] | None = None  # FP_CHECK counters from poll.lua
    client_cpu_s: float = 0.0  # user+sys CPU the load generator itself used
    command: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def _dur_s(text: str) -> float:
    m = re.fullmatch(r"([0-9.]+)(us|ms|s|m|h)", text.strip())
    if not m:
        raise ToolError(f"unreadable duration {text!r}")
    return float(m.group(1)) * _UNITS_S[m.group(2)]


def parse_wrk(text: str, url: str = "", conns: int = 0) -> LoadResult:
    """Parse `wrk --latency` output; an FPBENCH line from poll.lua, if present, wins (exact µs)."""
    r = LoadResult(tool="wrk", url=url, conns=conns, keepalive=True)
    m = re.search(r"(\d+) threads and (\d+) connections", text)
    if m:
        r.conns = int(m.group(2))
    m = re.search(r"^\s*(\d+) requests in ([0-9.]+\w+),", text, re.M)
    if not m:
        raise ToolError("wrk output has no 'N requests in T' line:\n" + text[-2000:])
    r.requests = int(m.group(1))
    r.duration_s = _dur_s(m.group(2))
    m = re.search(r"^Requests/sec:\s+([0-9.]+)", text, re.M)
    if not m:
        raise ToolError("wrk output has no Requests/sec line")
    r.rps = float(m.group(1))
    m = re.search(r"^\s*Latency\s+([0-9.]+\w+)\s+([0-9.]+\w+)\s+([0-9.]+\w+)", text, re.M)
    if m:
        r.mean_ms = _dur_s(m.group(1)) * 1e3
        r.max_ms = _dur_s(m.group(3)) * 1e3
    for pct, attr in (("50", "p50_ms"), ("75", "p75_ms"), ("90", "p90_ms"), ("99", "p99_ms")):
        m = re.search(rf"^\s*{pct}%\s+([0-9.]+\w+)", text, re.M)
        if m:
            setattr(r, attr, _dur_s(m.group(1)) * 1e3)
    errors = {"connect": 0, "read": 0, "write": 0, "timeout": 0}
    m = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", text)
    if m:
        errors = dict(zip(errors, map(int, m.groups()), strict=True))
    m = re.search(r"Non-2xx or 3xx responses: (\d+)", text)
    r.non2xx = int(m.group(1)) if m else 0

    m = re.search(r"^FPBENCH (\{.*\})\s*$", text, re.M)
    if m:
        d = json.loads(m.group(1))
        r.requests = int(d["requests"])
        r.duration_s = d["duration_us"] / 1e6
        r.rps = r.requests / r.duration_s if r.duration_s else 0.0
        lat = d["latency_us"]
        r.mean_ms, r.max_ms = lat["mean"] / 1e3, lat["max"] / 1e3
        r.p50_ms, r.p75_ms, r.p90_ms = lat["p50"] / 1e3, lat["p75"] / 1e3, lat["p90"] / 1e3
        r.p99_ms, r.p999_ms = lat["p99"] / 1e3, lat["p999"] / 1e3
        errors = {k: int(d["errors"][k]) for k in ("connect", "read", "write", "timeout")}
        r.check = {k: int(d.get(k, 0)) for k in ("n_hit", "n_miss", "miss_reused")}
        if d.get("checked"):
            r.check.update({k: int(d[k]) for k in ("bad_status", "bad_body", "bad_source")})
    r.errors = errors
    # wrk counts a read error for every connection the server closes; with keep-alive every one
    # of them is a failure, as is every timeout, connect error or non-2xx answer.
    r.failed = sum(errors.values()) + r.non2xx
    if r.check:
        r.failed += sum(r.check.get(k, 0) for k in ("bad_status", "bad_body", "bad_source"))
    return r


def parse_ab(text: str, url: str = "", keepalive: bool = False) -> LoadResult:
    """Parse ApacheBench's report (ab -c C -n N [-k])."""

    def num(label: str, default: float | None = None) -> float:
        m = re.search(rf"^{re.escape(label)}:\s+([0-9.]+)", text, re.M)
        if not m:
            if default is not None:
                return default
            raise ToolError(f"ab output has no '{label}' line:\n" + text[-2000:])
        return float(m.group(1))

    r = LoadResult(tool="ab", url=url, conns=int(num("Concurrency Level")), keepalive=keepalive)
    r.requests = int(num("Complete requests"))
    r.duration_s = num("Time taken for tests")
    r.rps = num("Requests per second")
    r.mean_ms = num("Time per request")
    failed = int(num("Failed requests"))
    r.non2xx = int(num("Non-2xx responses", 0))
    write_errors = int(num("Write errors", 0))
    m = re.search(r"\(Connect: (\d+), Receive: (\d+), Length: (\d+), Exceptions: (\d+)\)", text)
    detail = (
        dict(zip(("connect", "receive", "length", "exceptions"), map(int, m.groups()), strict=True))
        if m
        else {}
    )
    r.errors = {"failed": failed, "write": write_errors, **detail}
    r.failed = failed + write_errors + r.non2xx
    pcts = dict(re.findall(r"^\s*(\d+)%\s+(\d+)", text, re.M))
    for pct, attr in (("50", "p50_ms"), ("75", "p75_ms"), ("90", "p90_ms"), ("99", "p99_ms")):
        if pct in pcts:
            setattr(r, attr, float(pcts[pct]))  # ab reports whole milliseconds
    if "100" in pcts:
        r.max_ms = float(pcts["100"])
    return r


def _children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def _run(cmd: list[str], env: dict[str, str] | None, timeout: float) -> tuple[str, float]:
    before = _children_cpu()
    try:
        p = subprocess.run(
            cmd, capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})}
        )
    except subprocess.TimeoutExpired as e:  # subprocess.run killed it
        raise ToolError(f"{cmd[0]} did not finish within {timeout:.0f}s") from e
    cpu = _children_cpu() - before
    if p.returncode != 0:
        raise ToolError(
            f"{' '.join(cmd)} exited {p.returncode}:\n{p.stderr[-2000:]}{p.stdout[-2000:]}"
        )
    return p.stdout + p.stderr, cpu


def run_wrk(
    url: str,
    conns: int,
    duration_s: float,
    threads: int = 2,
    env: dict[str, str] | None = None,
    timeout_s: float = 10.0,
    raw_log: Path | None = None,
) -> LoadResult:
    threads = max(1, min(threads, conns))
    env = {**(env or {}), "FP_THREADS": str(threads)}  # poll.lua splits the miss pool by thread
    cmd = [
        "wrk",
        f"-t{threads}",
        f"-c{conns}",
        f"-d{duration_s:g}s",
        f"--timeout={timeout_s:g}s",
        "--latency",
        "-s",
        str(POLL_LUA),
        url,
    ]
    # The hard bound: the run, a slow start of many connections, and the final timeout.
    text, cpu = _run(cmd, env, timeout=duration_s + timeout_s + 60)
    if raw_log is not None:
        with raw_log.open("a") as f:
            f.write(f"$ {' '.join(f'{k}={v}' for k, v in (env or {}).items())} {' '.join(cmd)}\n")
            f.write(text + "\n")
    r = parse_wrk(text, url=url, conns=conns)
    r.client_cpu_s, r.command = cpu, cmd
    return r


def run_ab(
    url: str,
    conns: int,
    n: int,
    keepalive: bool = False,
    raw_log: Path | None = None,
    method_body: Path | None = None,
) -> LoadResult:
    cmd = ["ab", "-q", "-c", str(conns), "-n", str(n), "-s", "10", "-r"]
    if keepalive:
        cmd.append("-k")
    if method_body is not None:
        cmd += ["-p", str(method_body), "-T", "application/json"]
    cmd.append(url)
    t0 = time.monotonic()
    text, cpu = _run(cmd, None, timeout=120)
    if raw_log is not None:
        with raw_log.open("a") as f:
            f.write(f"$ {' '.join(cmd)}   # {time.monotonic() - t0:.1f}s\n{text}\n")
    r = parse_ab(text, url=url, keepalive=keepalive)
    r.client_cpu_s, r.command = cpu, cmd
    return r
