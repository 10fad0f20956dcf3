"""The project's one load-generator kit: wrk and ab, bounded in time, and what they print, parsed.

Two ways to drive wrk, one result type (LoadResult):

- the benchmark's runs (run_wrk with lua/poll.lua, run_ab): rates and latency percentiles, parsed
  by pure functions (parse_wrk, parse_ab) unit-checked against captured outputs
  (loadtests/tests/test_parsers.py);
- the fault drills' and the soak's short loads (Load, run with lua/drill.lua): wrk cycling through
  a list of request targets, tallying every answer per status and per X-Poll-Source, never how
  fast it was; bounded in time (`seconds`) and optionally in requests (`limit`).

KeepAliveClients is the drills' retrying client for servers that close idle connections on purpose.
Every run is bounded: wrk by -d plus a hard subprocess timeout, ab by -n plus -s and a timeout.
"""

from __future__ import annotations

import json
import os
import re
import resource
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TypedDict, Unpack

HERE = Path(__file__).resolve().parent
POLL_LUA = HERE / "lua" / "poll.lua"  # the bench: FP_* environment, exact µs latencies
DRILL_LUA = HERE / "lua" / "drill.lua"  # the drills: request list, per-status tallies


_UNITS_S = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_SIZE = {"": 1, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9}


class ToolError(RuntimeError):
    """The load generator failed to run or printed something we cannot read."""


@dataclass
class LoadResult:
    """What one run of a load generator saw. The bench reads the rates and latencies; the drills
    read the per-status and per-X-Poll-Source tallies (drill.lua) and `failed`."""

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
    failed: int = 0  # requests that did not complete properly (see each runner)
    check: dict[str, int] | None = None  # FP_CHECK counters from poll.lua
    statuses: dict[int, int] = field(default_factory=dict)  # drill.lua: answers per status
    sources: dict[str, int] = field(default_factory=dict)  # drill.lua: answers per X-Poll-Source
    client_cpu_s: float = 0.0  # user+sys CPU the load generator itself used
    command: list[str] = field(default_factory=list)
    output: str = field(repr=False, default="")

    @property
    def seconds(self) -> float:
        return self.duration_s

    def count(self, status: int) -> int:
        return self.statuses.get(status, 0)

    def summary(self) -> str:
        return (
            f"{self.requests} requests in {self.duration_s:.1f}s, statuses {self.statuses}, "
            f"sources {self.sources}, errors {self.errors}"
        )

    def as_dict(self) -> dict[str, object]:
        d = asdict(self)
        del d["output"]
        return d


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


class Load:
    """One wrk run in the background: start it, do something to the stack, then result()."""

    def __init__(
        self,
        base_url: str,
        requests: list[str],
        seconds: float,
        connections: int = 8,
        threads: int = 2,
        limit: int = 0,
        timeout_s: int = 10,
        keepalive: bool = True,
    ) -> None:
        wrk = shutil.which("wrk")
        if wrk is None:
            raise RuntimeError("wrk is not installed (apt-get install wrk)")
        lines = [r if " " in r else f"GET {r}" for r in requests]
        self._dir = tempfile.TemporaryDirectory(prefix="fp-load-")
        d = Path(self._dir.name)
        (d / "requests.txt").write_text("\n".join(lines) + "\n")
        per_thread = -(-limit // threads) if limit else 0
        argv = [
            wrk,
            f"-t{threads}",
            f"-c{connections}",
            f"-d{max(1, round(seconds))}s",
            f"--timeout={timeout_s}s",
            "-s",
            str(DRILL_LUA),
            base_url,
            "--",
            str(d / "requests.txt"),
            str(per_thread),
            "0" if keepalive else "1",
            str(d),
        ]
        self._url, self._conns, self._keepalive, self._argv = base_url, connections, keepalive, argv
        self.started = time.monotonic()
        self._proc = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        self._seconds = seconds
        self._threads = threads if limit else 0

    @property
    def pid(self) -> int:
        """wrk's process id (its threads are /proc/PID/task/*), for a test's evidence."""
        return self._proc.pid

    def result(self) -> LoadResult:
        d = Path(self._dir.name)
        while self._threads and self._proc.poll() is None:
            if len(list(d.glob("done-*"))) >= self._threads:
                self._proc.send_signal(signal.SIGINT)
                break
            time.sleep(0.2)
        try:
            out, _ = self._proc.communicate(timeout=self._seconds + 60)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            out, _ = self._proc.communicate()
            raise RuntimeError(f"wrk did not finish:\n{out}") from None
        finally:
            self._dir.cleanup()
        line = next((ln for ln in out.splitlines() if ln.startswith("FPJSON ")), None)
        if self._proc.returncode != 0 or line is None:
            raise RuntimeError(f"wrk failed ({self._proc.returncode}):\n{out}")
        doc = json.loads(line[len("FPJSON ") :])
        statuses = {int(k): v for k, v in doc["statuses"].items()}
        errors = doc["errors"]
        # What a client would call a failure: a socket error or any answer but 200.
        not_ok = sum(n for code, n in statuses.items() if code != 200)
        return LoadResult(
            tool="wrk",
            url=self._url,
            conns=self._conns,
            keepalive=self._keepalive,
            requests=doc["requests"],
            duration_s=doc["duration_us"] / 1e6,
            statuses=statuses,
            sources=doc["sources"],
            errors=errors,
            non2xx=sum(n for code, n in statuses.items() if not 200 <= code < 400),
            failed=not_ok + sum(errors.values()),
            command=self._argv,
            output=out,
        )


class LoadOptions(TypedDict, total=False):
    """Load's keyword arguments, for run()."""

    connections: int
    threads: int
    limit: int
    timeout_s: int
    keepalive: bool


def run(
    base_url: str, requests: list[str], seconds: float, **kw: Unpack[LoadOptions]
) -> LoadResult:
    """A whole run in the foreground."""
    return Load(base_url, requests, seconds, **kw).result()


class KeepAliveClients:
    """Threads polling on keep-alive connections the way RFC 9112 section 9.3.1 lets a client:
    a request that finds its idle connection closed before any byte of an answer came back is
    sent again on a new connection (counted in `retried`, not a failure). Everything else that
    is not a 200 is a failure. For drills where a server closes idle connections on purpose
    (nginx reload); wrk cannot retry, so it would count those races as read errors."""

    def __init__(self, port: int, targets: list[str], clients: int = 4) -> None:
        self.port = port
        self.targets = targets
        self.ok = self.retried = 0
        self.failures: list[str] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(clients)
        ]
        for t in self._threads:
            t.start()

    def _connect(self) -> socket.socket:
        return socket.create_connection(("127.0.0.1", self.port), timeout=10)

    def _one(self, s: socket.socket, target: str) -> tuple[bytes, int]:
        """Sends one GET, returns (status line, bytes of the answer read)."""
        s.sendall(f"GET {target} HTTP/1.1\r\nHost: fastpoll\r\n\r\n".encode())
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = s.recv(65536)
            if not chunk:
                return b"", len(data)
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        while len(body) < length:
            chunk = s.recv(65536)
            if not chunk:
                return b"", len(data)
            body += chunk
        return head.split(b"\r\n", 1)[0], len(data)

    def _run(self, i: int) -> None:
        s = self._connect()
        n = i
        while not self._stop.is_set():
            target = self.targets[n % len(self.targets)]
            n += 1
            try:
                status, got = self._one(s, target)
            except OSError:
                status, got = b"", 0
            if status == b"" and got == 0:  # closed while idle: retry once, new connection
                s.close()
                s = self._connect()
                with self._lock:
                    self.retried += 1
                try:
                    status, got = self._one(s, target)
                except OSError as e:
                    status = f"error {e}".encode()
            with self._lock:
                if status.split(b" ")[1:2] == [b"200"]:
                    self.ok += 1
                else:
                    self.failures.append(f"{target}: {status!r} after {got} bytes")
                    s.close()
                    s = self._connect()
        s.close()

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=20)
