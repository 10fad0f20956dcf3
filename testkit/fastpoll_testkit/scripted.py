"""The one scripted fake server: a TCP server on a free loopback port that answers each request
line (CRLF-terminated) from a script, to give a client what no real server would (split,
late, malformed or oversized answers, a close in the middle). Standard library only: the poll
server's stand-alone checks use it as well as the tests.

    def answer(line: bytes) -> Reply: ...
    with ScriptedServer(answer) as srv:
        ... connect to srv.port ...

answer(line) gives, for one line received without its CRLF:
- bytes: written back; ending with CLOSE, written (without CLOSE) and the connection closed;
- Chunks(parts, pause): each part written in turn, `pause` seconds between them;
- None: the connection closed without an answer.
"""

from __future__ import annotations

import select
import socket
import threading
import time
from collections.abc import Callable
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
