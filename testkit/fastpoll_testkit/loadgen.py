"""Short, bounded load for the fault drills and the soak: wrk on loopback, counting what the
client sees (status codes, X-Poll-Source, socket errors), never how fast it was.

wrk runs a Lua script (below) that cycles through a list of request targets, tallies every
answer per thread and prints one JSON line at the end. A run is bounded in time (`seconds`) and,
optionally, in requests (`limit`).
"""

from __future__ import annotations

import json
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypedDict, Unpack

LUA = r"""
-- fastpoll drill script: round-robin over the requests in FP_REQUESTS (one "METHOD target"
-- per line), tally answers, stop after FP_LIMIT requests per thread (0: no limit); with
-- FP_CLOSE = 1 every request asks for its own connection (Connection: close), as ab without -k.
local threads = {}
local reqs, n, i, limit, count, marker = {}, 0, 0, 0, 0, nil
statuses, sources = {}, {}  -- globals: done() reads them with thread:get()

function setup(thread)
   table.insert(threads, thread)
   thread:set("id", #threads)
end

function init(args)
   local path, lim, close = args[1], tonumber(args[2]) or 0, args[3] == "1"
   marker = args[4] .. "/done-" .. tostring(id)
   limit = lim
   local headers = nil
   if close then headers = { ["Connection"] = "close" } end
   for line in io.lines(path) do
      local method, target = line:match("^(%S+) (%S+)$")
      if method then
         local body = nil
         if method == "POST" then body = "x=1" end
         n = n + 1
         reqs[n] = wrk.format(method, target, headers, body)
      end
   end
   -- every thread starts at another offset, so keys are spread from the first second
   i = ((id or 0) * 7919) % n
end

function request()
   i = i % n + 1
   return reqs[i]
end

function response(status, headers, body)
   local s = tostring(status)
   statuses[s] = (statuses[s] or 0) + 1
   local src = headers["X-Poll-Source"] or headers["x-poll-source"] or "-"
   sources[src] = (sources[src] or 0) + 1
   count = count + 1
   if limit > 0 and count == limit then
      -- wrk runs for its whole -d even when every thread stopped: tell Python, which
      -- interrupts it (SIGINT: wrk then prints its summary and calls done()).
      local f = io.open(marker, "w")
      if f then f:close() end
      wrk.thread:stop()
   end
end

local function merge(into, t)
   for k, v in pairs(t) do into[k] = (into[k] or 0) + v end
end

local function obj(t)
   local parts = {}
   for k, v in pairs(t) do table.insert(parts, string.format("%q:%d", k, v)) end
   return "{" .. table.concat(parts, ",") .. "}"
end

function done(summary, latency, requests)
   local st, so = {}, {}
   for _, t in ipairs(threads) do
      merge(st, t:get("statuses"))
      merge(so, t:get("sources"))
   end
   local e = summary.errors
   io.write(string.format(
      'FPJSON {"requests":%d,"duration_us":%d,"statuses":%s,"sources":%s,' ..
      '"errors":{"connect":%d,"read":%d,"write":%d,"timeout":%d}}\n',
      summary.requests, summary.duration, obj(st), obj(so),
      e.connect, e.read, e.write, e.timeout))
end
"""


@dataclass
class LoadResult:
    requests: int
    seconds: float
    statuses: dict[int, int]
    sources: dict[str, int]
    errors: dict[str, int]
    output: str = field(repr=False, default="")

    @property
    def failed(self) -> int:
        """What a client would call a failure: a socket error or any answer but 200."""
        not_ok = sum(n for code, n in self.statuses.items() if code != 200)
        return not_ok + sum(self.errors.values())

    def count(self, status: int) -> int:
        return self.statuses.get(status, 0)

    def summary(self) -> str:
        return (
            f"{self.requests} requests in {self.seconds:.1f}s, statuses {self.statuses}, "
            f"sources {self.sources}, errors {self.errors}"
        )


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
        (d / "drill.lua").write_text(LUA)
        (d / "requests.txt").write_text("\n".join(lines) + "\n")
        per_thread = -(-limit // threads) if limit else 0
        argv = [
            wrk,
            f"-t{threads}",
            f"-c{connections}",
            f"-d{max(1, round(seconds))}s",
            f"--timeout={timeout_s}s",
            "-s",
            str(d / "drill.lua"),
            base_url,
            "--",
            str(d / "requests.txt"),
            str(per_thread),
            "0" if keepalive else "1",
            str(d),
        ]
        self.started = time.monotonic()
        self._proc = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        self._seconds = seconds
        self._threads = threads if limit else 0

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
        return LoadResult(
            requests=doc["requests"],
            seconds=doc["duration_us"] / 1e6,
            statuses={int(k): v for k, v in doc["statuses"].items()},
            sources=doc["sources"],
            errors=doc["errors"],
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
            threading.Thread(target=self._run, args=(i,), daemon=True)
            for i in range(clients)
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
            if (
                status == b"" and got == 0
            ):  # closed while idle: retry once, new connection
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
