#!/usr/bin/env python3
"""Hand check of the poll server's HTTP side against a real memcached.

Starts its own memcached and poll_server on free loopback ports, checks hit, miss,
NUL bytes, empty value, HEAD, 405, 413, 400, invalid keys (memcached's cmd_get must not
move), coalescing, clients that hang up while waiting, timeouts, `wait` read one way
(any case, twice refused) and nginx's X-Fastpoll-Route, If-None-Match with control bytes,
a held client that leaves with input pipelined behind it, and the SIGTERM drain (exit 0,
answers carry "Connection: close"). With a Redis of its own and more poll servers: the
subscriber's liveness (Redis stopped, a connection cut silently through a proxy), an
announcement during a poll's first (slow) read, and a node's recovery window after a hang
without replicas. Polls with channels: composed answers, refusals, timeouts, held ones.
Stops exactly the pids it started.
Part of `make check` (poll_server/Makefile), not of `make test`: it sends signals to
memcached and takes a few seconds.

    python3 tests/http_check.py [--binary build/poll_server-asan]

With the ASan binary, any sanitizer report in the server's stderr fails the check.
Standard library only.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from fastpoll_testkit.procs import (
    Server,
    free_port,
    freeze,
    memcached_argv,
    start_redis,
    wait_port,
)

HERE = Path(__file__).resolve().parent


class Check:
    def __init__(self, port: int, mc_port: int, mc_pid: int, admin_port: int = 0) -> None:
        self.port, self.mc_port, self.mc_pid = port, mc_port, mc_pid
        self.admin_port = admin_port
        self.failed = 0

    def metric(self, name: str) -> float:
        """One unlabelled value from the admin listener's /metrics."""
        with socket.create_connection(("127.0.0.1", self.admin_port), timeout=2) as s:
            s.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
            out = b""
            while chunk := s.recv(65536):
                out += chunk
        for line in out.decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
        raise RuntimeError(f"no {name} in /metrics")

    def ok(self, name: str, cond: bool, detail: object = "") -> None:
        print(
            ("PASS " if cond else "FAIL ")
            + name
            + (f"  ({detail})" if detail and not cond else "")
        )
        self.failed += 0 if cond else 1

    def mc(self, cmd: bytes) -> bytes:
        with socket.create_connection(("127.0.0.1", self.mc_port), timeout=2) as s:
            s.sendall(cmd)
            out = b""
            while not out.endswith(
                (b"END\r\n", b"STORED\r\n", b"DELETED\r\n", b"NOT_FOUND\r\n")
            ):
                chunk = s.recv(65536)
                if not chunk:
                    break
                out += chunk
            return out

    def cmd_get(self) -> int:
        for line in self.mc(b"stats\r\n").split(b"\r\n"):
            if line.startswith(b"STAT cmd_get "):
                return int(line.split()[2])
        raise RuntimeError("no cmd_get in stats")

    def raw(self, data: bytes, wait: float = 2.0) -> bytes:
        with socket.create_connection(("127.0.0.1", self.port)) as s:
            s.sendall(data)
            s.settimeout(wait)
            out = b""
            try:
                while chunk := s.recv(65536):
                    out += chunk
            except (TimeoutError, ConnectionResetError):
                pass
            return out

    def req(self, target: bytes, method: bytes = b"GET", extra: bytes = b"") -> bytes:
        return self.raw(
            b"%s %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n%s\r\n"
            % (method, target, extra)
        )


def read_answer(s: socket.socket, buf: bytes) -> tuple[bytes, bytes]:
    """One Content-Length answer from s (after what buf holds); returns (answer, rest)."""
    while b"\r\n\r\n" not in buf:
        chunk = s.recv(65536)
        if not chunk:
            return buf, b""
        buf += chunk
    head, _, body = buf.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    while len(body) < length:
        chunk = s.recv(1 << 20)
        if not chunk:
            break
        body += chunk
    return head + b"\r\n\r\n" + body[:length], body[length:]


def keepalive_many(c: Check) -> None:
    """Answers written at once, request after request on one connection (the way nginx's
    upstream keepalive uses a poll server)."""
    good = 0
    with socket.create_connection(("127.0.0.1", c.port), timeout=3) as s:
        rest = b""
        for i in range(300):
            target = b"/getMessages?user_id=1" if i % 3 else b"/nothere?user_id=3"
            s.sendall(b"GET %s HTTP/1.1\r\nHost: x\r\n\r\n" % target)
            answer, rest = read_answer(s, rest)
            want = b"HTTP/1.1 200" if i % 3 else b"HTTP/1.1 404"
            good += answer.startswith(want) and (not i % 3 or answer.endswith(b"hello"))
    c.ok(f"keep-alive: 300 requests on one connection, {good} right", good == 300)


def long_heads(c: Check) -> None:
    """Heads longer than a connection's small input buffer (1 KB) but within max_header_size
    (8 KB): read into a pooled big buffer, trickled or pipelined, and the connection goes back
    to its small buffer for the next request."""
    pad = b"X-Pad: " + b"p" * 7000 + b"\r\n"
    long_req = b"GET /getMessages?user_id=1 HTTP/1.1\r\nHost: x\r\n" + pad + b"\r\n"
    short_req = b"GET /getMessages?user_id=1 HTTP/1.1\r\nHost: x\r\n\r\n"
    answers: list[bytes] = []
    with socket.create_connection(("127.0.0.1", c.port), timeout=3) as s:
        rest = b""
        for i in range(20):
            if i % 4 == 0:
                # Trickled: the small buffer fills before the head ends.
                for k in range(0, len(long_req), 900):
                    s.sendall(long_req[k : k + 900])
                    time.sleep(0.002)
                answer, rest = read_answer(s, rest)
                answers.append(answer)
            elif i % 4 == 1:
                s.sendall(short_req)
                answer, rest = read_answer(s, rest)
                answers.append(answer)
            else:
                # Pipelined: a short head, a long one and a short one in one send.
                s.sendall(short_req + long_req + short_req)
                for _ in range(3):
                    answer, rest = read_answer(s, rest)
                    answers.append(answer)
    good = sum(a.startswith(b"HTTP/1.1 200") and a.endswith(b"hello") for a in answers)
    c.ok(
        f"heads of 7 KB between short ones on one connection: {good}/{len(answers)} answered",
        good == len(answers) == 40,
        [a[:40] for a in answers if not a.endswith(b"hello")][:3],
    )


def big_value_slow_reader(c: Check) -> None:
    """A value larger than the socket buffers: what the first write leaves is written later
    by the bufferevent, and the connection then serves its next request."""
    value = bytes(range(256)) * 3900  # 998,400 bytes, under memcached's 1 MiB item limit
    c.mc(b"set /Poll/big?user_id=4 0 0 %d\r\n%s\r\n" % (len(value), value))
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.settimeout(5)
        s.connect(("127.0.0.1", c.port))
        # Pipelined: the kernel buffers the first answer whole, not the next ones.
        s.sendall(b"GET /big?user_id=4 HTTP/1.1\r\nHost: x\r\n\r\n" * 4)
        time.sleep(0.1)  # under request_timeout_ms (300 here), which bounds a write too
        answers, rest = [], b""
        for _ in range(4):
            answer, rest = read_answer(s, rest)
            answers.append(answer)
        s.sendall(b"GET /getMessages?user_id=1 HTTP/1.1\r\nHost: x\r\n\r\n")
        last, _ = read_answer(s, rest)
    c.ok(
        "1 MB values to a slow reader: exact, then the connection serves the next request",
        all(a.startswith(b"HTTP/1.1 200") and a.endswith(b"\r\n\r\n" + value) for a in answers)
        and last.startswith(b"HTTP/1.1 200")
        and last.endswith(b"hello"),
        ([(a[:30], len(a)) for a in answers], last[:60]),
    )


def run_checks(c: Check) -> None:
    c.mc(b"set /Poll/getMessages?user_id=1 0 0 5\r\nhello\r\n")
    c.mc(b"set /Poll/bin?user_id=2 0 0 7\r\na\x00b\x00c\r\n\r\n")
    c.mc(b"set /Poll/empty?user_id=3 0 0 0\r\n\r\n")

    r = c.req(b"/getMessages?user_id=1&_=1699999")
    c.ok(
        "hit: 200, exact body, Content-Type, X-Poll-Source, Content-Length",
        r.startswith(b"HTTP/1.1 200")
        and r.endswith(b"\r\n\r\nhello")
        and b"Content-Type: application/json\r\n" in r
        and b"X-Poll-Source: cache\r\n" in r
        and b"Content-Length: 5\r\n" in r,
        r,
    )
    r = c.req(b"/bin?user_id=2")
    c.ok(
        "NUL bytes and CRLF in a value come back exactly",
        r.endswith(b"\r\n\r\na\x00b\x00c\r\n") and b"Content-Length: 7\r\n" in r,
        r,
    )
    r = c.req(b"/empty?user_id=3")
    c.ok(
        "empty value: 200 with an empty body",
        r.startswith(b"HTTP/1.1 200")
        and b"Content-Length: 0\r\n" in r
        and r.endswith(b"\r\n\r\n"),
        r,
    )
    r = c.req(b"/nothere?user_id=3")
    c.ok(
        "miss: 404, empty body",
        r.startswith(b"HTTP/1.1 404")
        and b"Content-Length: 0\r\n" in r
        and r.endswith(b"\r\n\r\n"),
        r,
    )
    r = c.raw(
        b"HEAD /getMessages?user_id=1 HTTP/1.1\r\nHost: x\r\n\r\n"
        b"GET /empty?user_id=3 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    first, _, rest = r.partition(b"\r\n\r\n")
    c.ok(
        "HEAD: GET's headers (Content-Length: 5), no body on a kept-alive connection",
        first.startswith(b"HTTP/1.1 200")
        and b"Content-Length: 5" in first
        and rest.startswith(b"HTTP/1.1 200"),
        r,
    )
    r = c.raw(
        b"GET /getMessages?user_id=1 HTTP/1.1\r\nHost: x\r\n\r\n"
        b"GET /nothere?user_id=3 HTTP/1.1\r\nHost: x\r\n\r\n"
        b"GET /bin?user_id=2 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    c.ok(
        "pipelined hit, miss, hit in one write: three answers in order",
        r.count(b"HTTP/1.1 ") == 3
        and r.startswith(b"HTTP/1.1 200")
        and r.index(b"hello") < r.index(b"HTTP/1.1 404") < r.index(b"a\x00b\x00c\r\n"),
        r,
    )
    keepalive_many(c)
    long_heads(c)
    big_value_slow_reader(c)
    for m in (b"PUT", b"DELETE", b"OPTIONS", b"PATCH", b"TRACE", b"BREW"):
        r = c.req(b"/getMessages?user_id=1", m)
        c.ok(
            f"405 for {m.decode()} with Allow",
            r.startswith(b"HTTP/1.1 405") and b"Allow: GET, HEAD, POST\r\n" in r,
            r[:80],
        )
    r = c.req(b"/getMessages?user_id=1", b"POST", b"Content-Length: 3\r\n\r\nabc")
    c.ok(
        "POST with a small body is a poll",
        r.startswith(b"HTTP/1.1 200") and r.endswith(b"hello"),
        r,
    )
    r = c.req(
        b"/getMessages?user_id=1",
        b"POST",
        b"Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
    )
    c.ok("chunked POST is read and discarded", r.startswith(b"HTTP/1.1 200"), r[:80])
    r = c.raw(
        b"POST /getMessages?user_id=1 HTTP/1.1\r\nHost: x\r\nContent-Length: 70000\r\n\r\n"
        + b"x" * 70000
    )
    c.ok("POST body over max_body_size: 413", r.startswith(b"HTTP/1.1 413"), r[:80])
    r = c.raw(
        b"GET /getMessages?user_id=1 HTTP/1.1\r\nHost: x\r\nX-Big: "
        + b"a" * 9000
        + b"\r\n\r\n"
    )
    c.ok("headers over max_header_size: 431", r.startswith(b"HTTP/1.1 431"), r[:80])

    before = c.cmd_get()
    for target in (
        b"/getMessages?user_id=1%0D%0Aflush_all",
        b"/getMessages?user_id=1&user_id=2",
        b"/a/../getMessages",
        b"/a/%2E%2E/x",
        b"/get%00x",
        b"/x?user_id=1%20delete",
        b"/x?user_id=1+1",
        b"/get%zz",
        b"/" + b"a" * 300,
        b"http://example.com/getMessages",
    ):
        r = c.req(target)
        c.ok(
            f"invalid key answered 404: {target[:40].decode()}",
            r.startswith(b"HTTP/1.1 404"),
            r[:60],
        )
    after = c.cmd_get()
    c.ok(
        f"invalid keys never reach memcached (cmd_get {before} -> {after})",
        before == after,
    )

    # Coalescing: with memcached paused, 50 clients of one key cost at most two gets (the one in
    # flight, and one for the requests that came after it started).
    results: list[bytes] = []

    def one() -> None:
        results.append(c.req(b"/getMessages?user_id=1"))

    before = c.cmd_get()
    freeze(c.mc_pid)
    try:
        threads = [threading.Thread(target=one) for _ in range(50)]
        for t in threads:
            t.start()
        time.sleep(0.05)
    finally:
        os.kill(c.mc_pid, signal.SIGCONT)
    for t in threads:
        t.join()
    gets = c.cmd_get() - before
    c.ok(
        f"coalescing: 50 concurrent requests, {gets} gets, all answered",
        gets <= 3
        and len(results) == 50
        and all(r.startswith((b"HTTP/1.1 200", b"HTTP/1.1 503")) for r in results),
    )

    # A paused memcached: 503 within the cache timeout (100 ms), never a hang.
    freeze(c.mc_pid)
    try:
        t0 = time.monotonic()
        r = c.req(b"/getMessages?user_id=1")
        took = time.monotonic() - t0
    finally:
        os.kill(c.mc_pid, signal.SIGCONT)
    c.ok(
        f"hung memcached: 503 in {took * 1000:.0f} ms",
        r.startswith(b"HTTP/1.1 503") and took < 0.5,
        r[:60],
    )

    # Clients that close or reset while their request waits for the cache (once the backend
    # is back from the hang above, so that the requests do wait).
    for _ in range(40):
        if c.req(b"/getMessages?user_id=1").startswith(b"HTTP/1.1 200"):
            break
        time.sleep(0.05)
    freeze(c.mc_pid)
    try:
        for i in range(20):
            s = socket.create_connection(("127.0.0.1", c.port))
            s.sendall(
                b"GET /getMessages?user_id=%d HTTP/1.1\r\nHost: x\r\n\r\n" % (i % 3)
            )
            if i % 2:
                s.setsockopt(
                    socket.SOL_SOCKET,
                    socket.SO_LINGER,
                    b"\x01\x00\x00\x00\x00\x00\x00\x00",
                )
            s.close()
        time.sleep(0.03)  # well within the cache timeout (100 ms): nothing answered yet
        inflight = c.metric("fastpoll_requests_in_flight")
        time.sleep(0.2)
    finally:
        os.kill(c.mc_pid, signal.SIGCONT)
    # The connection is still read while its request waits: a client that left is let go at
    # once, not when the cache answers.
    c.ok(
        f"clients that hung up mid-wait are let go at once ({inflight:.0f} still in flight)",
        inflight == 0,
    )
    time.sleep(0.3)  # the backend reconnects after its timeout
    r = c.req(b"/getMessages?user_id=1")
    c.ok(
        "still serving after clients hung up mid-wait",
        r.startswith(b"HTTP/1.1 200"),
        r[:60],
    )

    # A connection that never sends a request is closed after request_timeout_ms (300 here).
    with socket.create_connection(("127.0.0.1", c.port)) as s:
        s.settimeout(3)
        t0 = time.monotonic()
        try:
            closed = s.recv(1) == b""
        except ConnectionResetError:
            closed = True
        took = time.monotonic() - t0
    c.ok(
        f"silent connection closed after {took * 1000:.0f} ms (request_timeout_ms 300)",
        closed and 0.2 < took < 1.5,
    )


def hold_polls(c: Check, n: int) -> list[socket.socket]:
    """n long polls (wait=30) of user 7 with its current tag: held, nothing changes."""
    c.mc(b"set /Poll/getMessages?user_id=7 0 0 4\r\nheld\r\n")
    head = c.req(b"/getMessages?user_id=7").split(b"\r\n\r\n")[0]
    tag = next(v for v in head.split(b"\r\n") if v.startswith(b"ETag: "))[6:]
    socks = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", c.port))
        s.sendall(
            b"GET /getMessages?user_id=7&wait=30 HTTP/1.1\r\nHost: x\r\n"
            b"If-None-Match: %s\r\n\r\n" % tag
        )
        socks.append(s)
    deadline = time.monotonic() + 3
    while c.metric("fastpoll_held_requests") < n and time.monotonic() < deadline:
        time.sleep(0.01)
    c.ok(f"{n} long polls held", c.metric("fastpoll_held_requests") == n)
    return socks


def etag_of(c: Check, target: bytes) -> bytes:
    head = c.req(target).split(b"\r\n\r\n")[0]
    return next(v for v in head.split(b"\r\n") if v.startswith(b"ETag: "))[6:]


def wait_and_route(c: Check) -> None:
    """`wait` has one definition (docs/api.md): the name in any case, every occurrence
    counts (twice in any case: 400); nginx's plain route (X-Fastpoll-Route: plain) is never
    held, whatever the query says. If-None-Match with a control byte is ignored (200)."""
    c.mc(b"set /Poll/getMessages?user_id=8 0 0 4\r\nsame\r\n")
    tag = etag_of(c, b"/getMessages?user_id=8")
    inm = b"If-None-Match: %s\r\n" % tag
    for q in (b"WAIT=0&wait=30", b"wait=30&Wait=0", b"wait&WAIT=1", b"WAIT"):
        r = c.req(b"/getMessages?user_id=8&" + q, extra=inm)
        c.ok(f"wait: {q.decode()} is refused (400)", r.startswith(b"HTTP/1.1 400"), r[:60])
    t0 = time.monotonic()
    r = c.raw(
        b"GET /getMessages?user_id=8&wait=30 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
        b"X-Fastpoll-Route: plain\r\n%s\r\n" % inm
    )
    took = time.monotonic() - t0
    c.ok(
        f"X-Fastpoll-Route: plain with wait=30: 304 at once ({took * 1000:.0f} ms)",
        r.startswith(b"HTTP/1.1 304") and took < 1.0,
        r[:60],
    )
    for route in (b"", b"X-Fastpoll-Route: held\r\n"):
        t0 = time.monotonic()
        r = c.raw(
            b"GET /getMessages?user_id=8&WAIT=1 HTTP/1.1\r\nHost: x\r\n"
            b"Connection: close\r\n%s%s\r\n" % (route, inm),
            wait=4,
        )
        took = time.monotonic() - t0
        c.ok(
            f"WAIT=1 {'(held route) ' if route else ''}is held its second, then 304 "
            f"({took * 1000:.0f} ms)",
            r.startswith(b"HTTP/1.1 304") and 0.9 < took < 3.0,
            r[:60],
        )
    for ctl in (b"\x01", b"\x7f"):
        r = c.req(b"/getMessages?user_id=8", extra=b"If-None-Match: %s%s\r\n" % (tag, ctl))
        c.ok(
            f"If-None-Match with {ctl!r}: ignored (200, not 400)",
            r.startswith(b"HTTP/1.1 200") and r.endswith(b"same"),
            r[:60],
        )


def held_close_with_pipelined(c: Check) -> None:
    """A held poll whose client closes (FIN, then RST) while ~3 KB are pipelined behind it,
    more than its input buffer (1 KB) holds: the slot is freed at once, not at the wait's end."""
    c.mc(b"set /Poll/getMessages?user_id=9 0 0 4\r\nheld\r\n")
    tag = etag_of(c, b"/getMessages?user_id=9")
    for how in ("close", "reset"):
        s = socket.create_connection(("127.0.0.1", c.port))
        s.sendall(
            b"GET /getMessages?user_id=9&wait=30 HTTP/1.1\r\nHost: x\r\n"
            b"If-None-Match: %s\r\n\r\n" % tag
        )
        deadline = time.monotonic() + 3
        while c.metric("fastpoll_held_requests") < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        s.sendall(b"GET /getMessages?user_id=9 HTTP/1.1\r\nHost: x\r\n\r\n" * 60)
        time.sleep(0.1)
        if how == "reset":
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        s.close()
        deadline = time.monotonic() + 1.0
        held = c.metric("fastpoll_held_requests")
        while held > 0 and time.monotonic() < deadline:
            time.sleep(0.02)
            held = c.metric("fastpoll_held_requests")
        c.ok(f"held client gone ({how}) with 3 KB pipelined: slot freed at once", held == 0)
    # The same, but the client stays: the wait ends (304) and the pipelined requests are
    # answered after it, in order (the watch for its close is undone).
    with socket.create_connection(("127.0.0.1", c.port), timeout=5) as s:
        s.sendall(
            b"GET /getMessages?user_id=9&wait=1 HTTP/1.1\r\nHost: x\r\n"
            b"If-None-Match: %s\r\n\r\n" % tag
        )
        time.sleep(0.1)
        s.sendall(b"GET /getMessages?user_id=9 HTTP/1.1\r\nHost: x\r\n\r\n" * 60)
        answers, rest = [], b""
        for _ in range(61):
            answer, rest = read_answer(s, rest)
            answers.append(answer)
    c.ok(
        "held poll with 3 KB pipelined: 304 at the wait's end, then 60 answers in order",
        answers[0].startswith(b"HTTP/1.1 304")
        and all(a.startswith(b"HTTP/1.1 200") and a.endswith(b"held") for a in answers[1:]),
        [a[:20] for a in answers[:3]],
    )


def wait_held(c: Check, n: int, limit: float = 3) -> float:
    deadline = time.monotonic() + limit
    held = c.metric("fastpoll_held_requests")
    while held != n and time.monotonic() < deadline:
        time.sleep(0.01)
        held = c.metric("fastpoll_held_requests")
    return held


def channel_checks(c: Check) -> None:
    """Polls with channels (docs/channels.md): the composed answer (an empty part is null),
    304, a refused ch never read, a part that times out (503) or misses (404), clients that
    leave while the parts are read or while held, a held poll's wait ending (304) and a change
    found by the re-check (no announcements here) waking it, composed with the re-check's
    read."""
    c.mc(b"set /Poll/getMessages?user_id=20 0 0 2\r\nU1\r\n")
    c.mc(b"set /Poll#ra 0 0 2\r\nA1\r\n")
    c.mc(b"set /Poll#rb 0 0 0\r\n\r\n")
    target = b"/getMessages?user_id=20&ch=ra,rb"
    r = c.req(target)
    c.ok(
        "channels: 200, the composed body, its ETag",
        r.startswith(b"HTTP/1.1 200")
        and r.endswith(b'\r\n\r\n{"user":U1,"channels":{"ra":A1,"rb":null}}')
        and b"X-Poll-Source: cache\r\n" in r
        and b"ETag: " in r,
        r,
    )
    tag = etag_of(c, target)
    r = c.req(target, extra=b"If-None-Match: %s\r\n" % tag)
    c.ok("channels: 304 on its ETag", r.startswith(b"HTTP/1.1 304"), r)
    before = c.cmd_get()
    bad = [b"ch=rb,ra", b"ch=ra&CH=rb", b"ch=", b"ch=r%20a", b"ch=" + b",".join(
        b"c%02d" % i for i in range(17)), b"ch=ra,,rb", b"ch=r%2"]
    answers = [c.req(b"/getMessages?user_id=20&" + q) for q in bad]
    c.ok(
        "channels: a refused ch is 404 and never read from the cache",
        all(a.startswith(b"HTTP/1.1 404") for a in answers) and c.cmd_get() == before,
        (answers, c.cmd_get() - before),
    )
    r = c.req(b"/getMessages?user_id=20&ch=ra,rc")
    c.ok("channels: a part that misses is a 404", r.startswith(b"HTTP/1.1 404"), r)
    # The client leaves while the parts are read (memcached frozen), then one times out.
    freeze(c.mc_pid)
    try:
        with socket.create_connection(("127.0.0.1", c.port)) as s:
            s.sendall(b"GET %s HTTP/1.1\r\nHost: x\r\n\r\n" % target)
            time.sleep(0.05)
        r = c.req(target)
    finally:
        os.kill(c.mc_pid, signal.SIGCONT)
    c.ok("channels: a part's read that times out is a 503", r.startswith(b"HTTP/1.1 503"), r)
    back = until(lambda: c.req(target).startswith(b"HTTP/1.1 200"), 5)
    c.ok("channels: answered again once the cache is back", back is not None)
    # Held: the client leaves; the wait ends; a change is found by the re-check.
    with socket.create_connection(("127.0.0.1", c.port)) as s:
        s.sendall(b"GET %s&wait=30 HTTP/1.1\r\nHost: x\r\nIf-None-Match: %s\r\n\r\n"
                  % (target, tag))
        c.ok("channels: a held poll counts once", wait_held(c, 1) == 1)
    c.ok("channels: held client gone: slot freed at once", wait_held(c, 0, 1) == 0)
    t0 = time.monotonic()
    r = c.req(target + b"&wait=1", extra=b"If-None-Match: %s\r\n" % tag)
    took = time.monotonic() - t0
    c.ok("channels: the wait ends with 304", r.startswith(b"HTTP/1.1 304") and took > 0.9, r)
    with socket.create_connection(("127.0.0.1", c.port), timeout=10) as s:
        s.sendall(b"GET %s&wait=30 HTTP/1.1\r\nHost: x\r\nIf-None-Match: %s\r\n\r\n"
                  % (target, tag))
        wait_held(c, 1)
        c.mc(b"set /Poll#rb 0 0 2\r\nB2\r\n")
        t0 = time.monotonic()
        answer, _ = read_answer(s, b"")
    c.ok(
        "channels: a part's change (the re-check's read) answers, composed with that read",
        answer.startswith(b"HTTP/1.1 200")
        and answer.endswith(b'{"user":U1,"channels":{"ra":A1,"rb":B2}}')
        and time.monotonic() - t0 < 5,
        answer,
    )


class Proxy:
    """A TCP proxy on a free loopback port to `port`: server-to-client bytes are delayed by
    `delay` seconds (order kept), and `cut()` silences every connection open then (nothing
    forwarded either way, nothing closed: a peer that vanished), while new ones pass."""

    def __init__(self, port: int, delay: float = 0.0) -> None:
        self.target, self.delay = port, delay
        self.lsock = socket.socket()
        self.lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.lsock.bind(("127.0.0.1", 0))
        self.lsock.listen(16)
        self.lsock.settimeout(0.2)
        self.port = self.lsock.getsockname()[1]
        self.stop = False
        self.gen = 0
        self.socks: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def cut(self) -> None:
        self.gen += 1

    def close(self) -> None:
        self.stop = True
        for so in self.socks:
            with contextlib.suppress(OSError):
                so.close()
        self.lsock.close()

    def _accept(self) -> None:
        while not self.stop:
            try:
                a, _ = self.lsock.accept()
            except (TimeoutError, OSError):
                continue
            try:
                b = socket.create_connection(("127.0.0.1", self.target))
            except OSError:
                a.close()
                continue
            self.socks += [a, b]
            gen = self.gen
            threading.Thread(target=self._pump, args=(a, b, 0.0, gen), daemon=True).start()
            threading.Thread(target=self._pump, args=(b, a, self.delay, gen), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, delay: float, gen: int) -> None:
        while not self.stop:
            try:
                data = src.recv(65536)
            except OSError:
                return
            if not data:
                with contextlib.suppress(OSError):
                    dst.shutdown(socket.SHUT_WR)
                return
            if delay:
                threading.Timer(delay, self._send, args=(dst, data, gen)).start()
            else:
                self._send(dst, data, gen)

    def _send(self, dst: socket.socket, data: bytes, gen: int) -> None:
        if gen != self.gen:
            return  # cut: dropped on the floor, the connection stays open
        with contextlib.suppress(OSError):
            dst.sendall(data)


def poll_server(binary: str, ini: Path, log: Path, name: str) -> tuple[Server, Check]:
    """A poll server on ini and free ports, its stderr to log, listening on both (started)."""
    port, admin_port = free_port(), free_port()
    argv = [binary, "-c", str(ini), "-p", str(port), "-A", str(admin_port)]
    srv = Server(name, argv, port, log=log, stdout=False).start()
    try:
        wait_port(admin_port, srv.popen, what=name + "'s admin listener")
    except BaseException:
        srv.stop()
        raise
    return srv, Check(port, 0, 0, admin_port)


def start_server(binary: str, tmp: Path, name: str, ini_text: str) -> tuple[Server, Check]:
    ini = tmp / f"{name}.ini"
    ini.write_text(ini_text)
    return poll_server(binary, ini, tmp / f"{name}.log", name)


def until(cond: Callable[[], bool], limit: float) -> float | None:
    """Seconds until cond() held (polled every 20 ms), None if not within limit."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit:
        if cond():
            return time.monotonic() - t0
        time.sleep(0.02)
    return None


def subscribed(c: Check, v: int) -> Callable[[], bool]:
    return lambda: c.metric("fastpoll_announce_subscribed") == v


def held(c: Check, v: int) -> Callable[[], bool]:
    return lambda: c.metric("fastpoll_held_requests") == v


def recv_some(s: socket.socket, limit: float) -> bytes:
    """What comes within limit seconds (b"" if nothing)."""
    s.settimeout(limit)
    try:
        return s.recv(4096)
    except OSError:
        return b""


def publish(redis_port: int, msg: bytes) -> None:
    with socket.create_connection(("127.0.0.1", redis_port), timeout=2) as s:
        s.sendall(
            b"*3\r\n$7\r\nPUBLISH\r\n$17\r\nfastpoll:announce\r\n$%d\r\n%s\r\n"
            % (len(msg), msg)
        )
        s.recv(100)


def room_wake_checks(c: Check, redis_port: int) -> None:
    """Held polls with channels woken by an announcement (docs/channels.md): the read of the
    announced key is the only cache read; each answer is composed from it and the other parts
    as the poll read them. A room's message to 3 held members is one get, not one per member."""
    members = (31, 32, 33)
    c.mc(b"set /Poll#rr 0 0 2\r\nR1\r\n")
    targets = {u: b"/getMessages?user_id=%d&ch=rr" % u for u in members}
    for u in members:
        c.mc(b"set /Poll/getMessages?user_id=%d 0 0 2\r\nU%d\r\n" % (u, u % 10))

    def wake(users: tuple[int, ...], key: bytes, value: bytes | None) -> tuple[float, int, list]:
        """Holds users' polls on their current answers, writes key (None: deletes it) and
        announces it: (polls held, memcached gets meanwhile, the answers)."""
        tags = {u: etag_of(c, targets[u]) for u in users}
        socks = []
        try:
            for u in users:
                s = socket.create_connection(("127.0.0.1", c.port), timeout=5)
                socks.append(s)
                s.sendall(
                    b"GET %s&wait=20 HTTP/1.1\r\nHost: x\r\nIf-None-Match: %s\r\n\r\n"
                    % (targets[u], tags[u])
                )
            held_n = wait_held(c, len(users))
            before = c.cmd_get()
            if value is None:
                c.mc(b"delete %s\r\n" % key)
            else:
                c.mc(b"set %s 0 0 %d\r\n%s\r\n" % (key, len(value), value))
            publish(redis_port, key)
            answers = [read_answer(s, b"")[0] for s in socks]
            return held_n, c.cmd_get() - before, answers
        finally:
            for s in socks:
                s.close()

    def composed(user: bytes, room: bytes) -> bytes:
        return b'{"user":%s,"channels":{"rr":%s}}' % (user, room)

    held_n, gets, answers = wake(members, b"/Poll#rr", b"R2")
    c.ok(
        "rooms: an announced room answers its 3 held members with one read of its key",
        held_n == len(members)
        and all(
            a.startswith(b"HTTP/1.1 200") and a.endswith(composed(b"U%d" % (u % 10), b"R2"))
            for u, a in zip(members, answers, strict=True)
        )
        and gets == 1,
        (held_n, gets, answers),
    )
    # The member's own key announced: its new value, the room's part as the poll read it.
    u = members[0]
    held_n, gets, answers = wake((u,), b"/Poll/getMessages?user_id=%d" % u, b"V1")
    c.ok(
        "rooms: an announced user key answers with its new value and one read",
        held_n == 1
        and answers[0].startswith(b"HTTP/1.1 200")
        and answers[0].endswith(composed(b"V1", b"R2"))
        and gets == 1,
        (held_n, gets, answers),
    )
    # Parts over 4 KB in all are not kept while held (a held poll's memory stays bounded): a
    # woken member reads its parts again, and is answered as before.
    c.mc(b"set /Poll#rr 0 0 5000\r\n%s\r\n" % (b"B" * 5000))
    held_n, gets, answers = wake(members, b"/Poll#rr", b"C" * 5000)
    user_part = {u: b"V1" if u == members[0] else b"U%d" % (u % 10) for u in members}
    c.ok(
        "rooms: a room over 4 KB: its held members read their parts again when it changes",
        held_n == len(members)
        and all(
            a.startswith(b"HTTP/1.1 200") and a.endswith(composed(user_part[u], b"C" * 5000))
            for u, a in zip(members, answers, strict=True)
        )
        and gets >= 1 + len(members),
        (held_n, gets, [a[:200] for a in answers]),
    )
    # The room's key gone: every part is read again, the miss is the app's (404).
    held_n, gets, answers = wake((u,), b"/Poll#rr", None)
    c.ok(
        "rooms: an announced room gone: 404 (the app answers)",
        answers[0].startswith(b"HTTP/1.1 404"),
        answers,
    )


def announce_checks(main: Check, binary: str, tmp: Path) -> None:
    """The subscriber's liveness and the announcement that arrives during a poll's first
    read, with a real Redis, each on a poll server of its own."""
    redis = start_redis()
    redis_port = redis.port
    procs: list[Server] = []
    proxies: list[Proxy] = []
    try:

        # Liveness: Redis stopped, then a connection cut silently (through a proxy).
        rproxy = Proxy(redis_port)
        proxies.append(rproxy)
        for what, port in (("stopped", redis_port), ("silently cut", rproxy.port)):
            p, c = start_server(binary, tmp, "live-" + what.split()[0], (
                "[server]\nannounce_ping_ms = 200\nannounce_timeout_ms = 600\n"
                f"[memcached]\nservers = 127.0.0.1:{main.mc_port}\n"
                f"[announce]\nserver = 127.0.0.1:{port}\n"))
            procs.append(p)
            main.ok(f"subscriber ({what}): subscribed", until(subscribed(c, 1), 5) is not None)
            if what == "stopped":
                redis.freeze()
            else:
                rproxy.cut()
            try:
                took = until(subscribed(c, 0), 3)
                main.ok(
                    f"Redis {what}: fastpoll_announce_subscribed 0 within 0.6 s + a ping "
                    f"({took})",
                    took is not None and took < 1.5,
                )
            finally:
                if what == "stopped":
                    redis.thaw()
            took = until(subscribed(c, 1), 12)
            main.ok(f"Redis {what}, then back: subscribed again ({took})", took is not None)
            # Announcements reach it again: a held poll is answered by one.
            c.mc_port = main.mc_port
            c.mc(b"set /Poll/getMessages?user_id=21 0 0 3\r\nold\r\n")
            tag = etag_of(c, b"/getMessages?user_id=21")
            with socket.create_connection(("127.0.0.1", c.port)) as s:
                s.sendall(b"GET /getMessages?user_id=21&wait=20 HTTP/1.1\r\nHost: x\r\n"
                          b"If-None-Match: %s\r\n\r\n" % tag)
                until(held(c, 1), 3)
                c.mc(b"set /Poll/getMessages?user_id=21 0 0 3\r\nnew\r\n")
                t0 = time.monotonic()
                publish(redis_port, b"/Poll/getMessages?user_id=21")
                out = recv_some(s, 5)
                took = time.monotonic() - t0
            main.ok(f"Redis {what}, then back: an announcement wakes a held poll "
                    f"({took * 1000:.0f} ms)", out.startswith(b"HTTP/1.1 200") and took < 0.5,
                    out[:60])

        # A poll's first read is slow (800 ms through the proxy); the write and its
        # announcement come while it is in flight: the held poll gets the new answer at once
        # (one more read), not at the re-check (10 s) or its wait's end.
        mproxy = Proxy(main.mc_port, delay=0.8)
        proxies.append(mproxy)
        p, c = start_server(binary, tmp, "race", (
            "[server]\nrecheck_subscribed_ms = 10000\n[cache]\ntimeout_ms = 3000\n"
            f"[memcached]\nservers = 127.0.0.1:{mproxy.port}\n"
            f"[announce]\nserver = 127.0.0.1:{redis_port}\n"))
        procs.append(p)
        c.mc_port = main.mc_port
        main.ok("race: subscribed", until(subscribed(c, 1), 5) is not None)
        c.mc(b"set /Poll/getMessages?user_id=22 0 0 3\r\none\r\n")
        tag = etag_of(c, b"/getMessages?user_id=22")
        with socket.create_connection(("127.0.0.1", c.port)) as s:
            s.sendall(b"GET /getMessages?user_id=22&wait=8 HTTP/1.1\r\nHost: x\r\n"
                      b"If-None-Match: %s\r\n\r\n" % tag)
            time.sleep(0.3)  # the read is at memcached; its answer is on the way back
            c.mc(b"set /Poll/getMessages?user_id=22 0 0 3\r\ntwo\r\n")
            t0 = time.monotonic()
            publish(redis_port, b"/Poll/getMessages?user_id=22")
            out = recv_some(s, 10)
            took = time.monotonic() - t0
        main.ok(
            f"announcement during a poll's first read: answered after one more read "
            f"({took * 1000:.0f} ms, the read takes 800)",
            out.startswith(b"HTTP/1.1 200") and out.endswith(b"two") and took < 2.5,
            out[:80],
        )
        p, c = start_server(binary, tmp, "rooms", (
            "[server]\nrecheck_subscribed_ms = 10000\n"
            f"[memcached]\nservers = 127.0.0.1:{main.mc_port}\n"
            f"[announce]\nserver = 127.0.0.1:{redis_port}\n"))
        procs.append(p)
        c.mc_port, c.failed = main.mc_port, 0
        main.ok("rooms: subscribed", until(subscribed(c, 1), 5) is not None)
        room_wake_checks(c, redis_port)
        main.failed += c.failed
    finally:
        for pr in proxies:
            pr.close()
        for p in [*procs, redis]:
            p.stop()
        for name in ("live-stopped", "live-silently", "race", "rooms"):
            log = tmp / f"{name}.log"
            if log.exists():
                text = log.read_text(errors="replace")
                if "Sanitizer" in text or "runtime error" in text:
                    main.ok(f"no sanitizer report in {log}", False)


def recovery_check(main: Check, binary: str, tmp: Path) -> None:
    """One memcached, no replica: after a hang of 1.5 s that no poll saw (the idle probe
    does), no hit is served for recovery_ms (1.5 s here): 503, so nginx asks the app; then
    hits again."""
    p, c = start_server(
        binary,
        tmp,
        "recovery",
        f"[memcached]\nservers = 127.0.0.1:{main.mc_port}\nrecovery_ms = 1500\n",
    )
    try:
        c.mc_port, c.mc_pid = main.mc_port, main.mc_pid
        c.mc(b"set /Poll/getMessages?user_id=23 0 0 3\r\nold\r\n")
        first = c.req(b"/getMessages?user_id=23")
        freeze(c.mc_pid)
        try:
            time.sleep(1.5)
        finally:
            os.kill(c.mc_pid, signal.SIGCONT)
        t0 = time.monotonic()
        answers = []
        while time.monotonic() - t0 < 4:
            r = c.req(b"/getMessages?user_id=23")
            answers.append((round(time.monotonic() - t0, 2), r[:12]))
            if r.startswith(b"HTTP/1.1 200") and time.monotonic() - t0 > 1.0:
                break
            time.sleep(0.05)
        early = [a for a in answers if a[0] < 1.2]
        main.ok(
            "one node back from a hang no poll saw: no hit for recovery_ms (503), then hits",
            first.startswith(b"HTTP/1.1 200")
            and bool(early)
            and all(a[1] == b"HTTP/1.1 503" for a in early)
            and answers[-1][1] == b"HTTP/1.1 200",
            answers,
        )
    finally:
        p.stop()
        text = (tmp / "recovery.log").read_text(errors="replace")
        if "Sanitizer" in text or "runtime error" in text:
            main.ok("no sanitizer report in recovery.log", False)


def drain(c: Check, server: subprocess.Popen) -> None:
    """SIGTERM with requests waiting for the cache and long polls held: they are answered
    (Connection: close; the held ones 304 at once), exit 0."""
    held = hold_polls(c, 3)
    target = b"/getMessages?user_id=20&ch=ra,rb"
    tag = etag_of(c, target)
    s = socket.create_connection(("127.0.0.1", c.port))
    s.sendall(b"GET %s&wait=30 HTTP/1.1\r\nHost: x\r\nIf-None-Match: %s\r\n\r\n"
              % (target, tag))
    held.append(s)
    c.ok("a poll with channels held too", wait_held(c, 4) == 4)
    freeze(c.mc_pid)
    socks = []
    try:
        for i in range(5):
            s = socket.create_connection(("127.0.0.1", c.port))
            s.sendall(
                b"GET /getMessages?user_id=%d HTTP/1.1\r\nHost: x\r\n\r\n" % (i % 2)
            )
            socks.append(s)
        time.sleep(0.03)
        server.send_signal(signal.SIGTERM)
        time.sleep(0.03)
        try:
            socket.create_connection(("127.0.0.1", c.port), timeout=1).close()
            refused = False
        except OSError:
            refused = True
        c.ok("SIGTERM: the listening socket is closed at once", refused)
    finally:
        os.kill(c.mc_pid, signal.SIGCONT)
    answers = []
    for s in socks:
        s.settimeout(3)
        out = b""
        try:
            while chunk := s.recv(4096):
                out += chunk
        except OSError:
            pass
        s.close()
        answers.append(out)
    c.ok(
        "SIGTERM: requests in flight are answered with Connection: close",
        all(
            a.startswith((b"HTTP/1.1 200", b"HTTP/1.1 404", b"HTTP/1.1 503"))
            and b"Connection: close\r\n" in a
            for a in answers
        ),
        answers,
    )
    held_answers = []
    for s in held:
        s.settimeout(1)  # at once: not after their 30 s wait
        try:
            held_answers.append(s.recv(4096))
        except OSError as e:
            held_answers.append(repr(e).encode())
        s.close()
    c.ok(
        "SIGTERM: held long polls are answered 304 with Connection: close",
        all(
            a.startswith(b"HTTP/1.1 304") and b"Connection: close\r\n" in a
            for a in held_answers
        ),
        held_answers,
    )
    rc = server.wait(timeout=10)
    c.ok("SIGTERM: exit status 0", rc == 0, rc)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--binary", default=str(HERE.parent / "build" / "poll_server"))
    args = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="fp-http-check-"))
    ini = tmp / "fastpoll.ini"
    mc_port = free_port()
    ini.write_text(
        f"[server]\nrequest_timeout_ms = 300\n[memcached]\nservers = 127.0.0.1:{mc_port}\n"
        # The checks below hang memcached; recovery_check has the window on.
        "recovery_ms = 0\n"
    )
    memcached = Server("memcached", memcached_argv(mc_port), mc_port)
    server: Server | None = None
    passed = False
    log = tmp / "poll_server.log"
    try:
        memcached.start()
        server, c = poll_server(args.binary, ini, log, "poll_server")
        c.mc_port, c.mc_pid = mc_port, memcached.pid
        run_checks(c)
        wait_and_route(c)
        held_close_with_pipelined(c)
        channel_checks(c)
        announce_checks(c, args.binary, tmp)
        recovery_check(c, args.binary, tmp)
        drain(c, server.popen)
        text = log.read_text(errors="replace")
        c.ok(
            "no sanitizer report in the server's log",
            "Sanitizer" not in text and "runtime error" not in text,
        )
        if c.failed:
            print(f"{c.failed} FAILED (server log: {log})")
            return 1
        print("ALL PASSED")
        passed = True
        return 0
    finally:
        for p in (server, memcached):
            if p is not None:
                p.stop()
        # The log is kept only when it is needed: a failed or crashed run.
        if passed:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
