"""The scripted fake servers. ScriptedServer: a TCP server on a free loopback port that answers
each request line (CRLF-terminated) from a script, to give a client what no real server would
(split, late, malformed or oversized answers, a close in the middle). Standard library only: the
poll server's stand-alone checks use them as well as the tests.

    def answer(line: bytes) -> Reply: ...
    with ScriptedServer(answer) as srv:
        ... connect to srv.port ...

answer(line) gives, for one line received without its CRLF:
- bytes: written back; ending with CLOSE, written (without CLOSE) and the connection closed;
- Chunks(parts, pause): each part written in turn, `pause` seconds between them;
- None: the connection closed without an answer.

slow_server(parse, answer): a cache that answers each request (mc_requests, resp_requests
split them) a delay after it came, in order: for checks of what a client sends while it waits.
"""

from __future__ import annotations

import contextlib
import select
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import TracebackType

CLOSE = b"\0close"


@dataclass
class Chunks:
    """An answer written in parts, `pause` seconds apart."""

    parts: list[bytes]
    pause: float = 0.001


Reply = bytes | Chunks | None


class ScriptedServer:
    """See the module. `accepted`: the connections it accepted so far."""

    def __init__(self, answer: Callable[[bytes], Reply]) -> None:
        self.answer = answer
        self._lsock = socket.socket()
        self._lsock.bind(("127.0.0.1", 0))
        self._lsock.listen(64)
        self._lsock.settimeout(0.2)
        self.port: int = self._lsock.getsockname()[1]
        self.accepted = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._lsock.accept()
            except OSError:  # the 0.2 s timeout (a TimeoutError) included
                continue
            self.accepted += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _write(self, conn: socket.socket, reply: bytes | Chunks) -> bool:
        """Write one reply; False: the connection is to be closed."""
        if isinstance(reply, Chunks):
            for i, part in enumerate(reply.parts):
                if i:
                    time.sleep(reply.pause)
                conn.sendall(part)
            return True
        conn.sendall(reply.removesuffix(CLOSE))
        return not reply.endswith(CLOSE)

    def _serve(self, conn: socket.socket) -> None:
        buf = b""
        with conn:
            while not self._stop.is_set():
                # Blocking sends (a slow reader of a big answer is not dropped); reads wake up
                # every 0.2 s to see whether the server is closing.
                try:
                    if not select.select([conn], [], [], 0.2)[0]:
                        continue
                    data = conn.recv(65536)
                except OSError:
                    return
                if not data:
                    return
                buf += data
                while b"\r\n" in buf:
                    line, buf = buf.split(b"\r\n", 1)
                    reply = self.answer(line)
                    try:
                        if reply is None or not self._write(conn, reply):
                            return
                    except OSError:
                        return

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2)
        self._lsock.close()

    def __enter__(self) -> ScriptedServer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def mc_requests(buf: bytes) -> tuple[list[bytes], bytes]:
    """Complete memcached request lines in buf, and what is left."""
    *lines, rest = buf.split(b"\r\n")
    return lines, rest


def resp_requests(buf: bytes) -> tuple[list[bytes], bytes]:
    """Complete RESP commands (arrays of bulk strings) in buf, joined by spaces, and what is
    left."""
    out: list[bytes] = []
    while buf.startswith(b"*") and b"\r\n" in buf:
        head, rest = buf[1:].split(b"\r\n", 1)
        args = []
        for _ in range(int(head)):
            if not rest.startswith(b"$") or b"\r\n" not in rest:
                return out, buf
            n, rest = rest[1:].split(b"\r\n", 1)
            if len(rest) < int(n) + 2:
                return out, buf
            args.append(rest[: int(n)])
            rest = rest[int(n) + 2 :]
        out.append(b" ".join(args))
        buf = rest
    return out, buf


@contextlib.contextmanager
def slow_server(
    parse: Callable[[bytes], tuple[list[bytes], bytes]],
    answer: Callable[[bytes], tuple[bytes, float]],
) -> Iterator[int]:
    """A cache on a free loopback port (yielded) that answers each request, in order, a delay
    after it came: answer(request) gives the bytes and the delay in seconds."""
    stop = False

    def serve(c: socket.socket) -> None:
        buf, due = b"", list[tuple[float, bytes]]()  # due: (when, bytes), in order
        with c:
            while not stop:
                wait = max(0.0, due[0][0] - time.monotonic()) if due else 0.2
                if select.select([c], [], [], wait)[0]:
                    try:
                        chunk = c.recv(65536)
                    except OSError:
                        return
                    if not chunk:
                        return
                    reqs, buf = parse(buf + chunk)
                    for req in reqs:
                        data, delay = answer(req)
                        when = time.monotonic() + delay
                        due.append((max(when, due[-1][0]) if due else when, data))
                now, out = time.monotonic(), b""
                while due and due[0][0] <= now:
                    out += due.pop(0)[1]
                try:
                    c.sendall(out)
                except OSError:
                    return

    def accept(lsock: socket.socket) -> None:
        lsock.settimeout(0.2)
        while not stop:
            try:
                c, _ = lsock.accept()
            except OSError:
                continue
            threading.Thread(target=serve, args=(c,), daemon=True).start()

    with socket.socket() as lsock:
        lsock.bind(("127.0.0.1", 0))
        lsock.listen(16)
        t = threading.Thread(target=accept, args=(lsock,), daemon=True)
        t.start()
        try:
            yield lsock.getsockname()[1]
        finally:
            stop = True
            t.join(2)
