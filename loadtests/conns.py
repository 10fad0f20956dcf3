"""Hold many idle keep-alive connections open to one server, to measure its memory with them.

Each connection sends one complete request and reads its answer, so the server has accepted it,
parsed a request, answered, and now keeps it as an idle keep-alive connection (its steady state
under a crowd of pollers). Connections are opened in batches: a single burst of 10,000 SYNs would
overflow the server's listen backlog and measure the kernel's retransmission timer instead.
"""

from __future__ import annotations

import errno
import selectors
import socket
import time


class ConnectionCrowd:
    def __init__(
        self, port: int, request: bytes, count: int, batch: int = 500, deadline_s: float = 60.0
    ) -> None:
        self.port, self.request, self.count = port, request, count
        self.batch, self.deadline_s = batch, deadline_s
        self.socks: list[socket.socket] = []
        self.answered = 0
        self.failed = 0

    def __enter__(self) -> ConnectionCrowd:
        try:
            self.open()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def open(self) -> None:
        deadline = time.monotonic() + self.deadline_s
        while len(self.socks) < self.count:
            if time.monotonic() > deadline:
                raise TimeoutError(f"only {len(self.socks)} of {self.count} connections in time")
            n = min(self.batch, self.count - len(self.socks))
            self._one_batch(n, deadline)

    def _one_batch(self, n: int, deadline: float) -> None:
        sel = selectors.DefaultSelector()
        state: dict[socket.socket, bytearray] = {}
        try:
            for _ in range(n):
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                sock.setblocking(False)
                err = sock.connect_ex(("127.0.0.1", self.port))
                if err not in (0, errno.EINPROGRESS):
                    sock.close()
                    self.failed += 1
                    continue
                state[sock] = bytearray()
                sel.register(sock, selectors.EVENT_WRITE)
            while sel.get_map() and time.monotonic() < deadline:
                for key, ev in sel.select(timeout=1.0):
                    s = key.fileobj
                    assert isinstance(s, socket.socket)
                    if ev & selectors.EVENT_WRITE:
                        if s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
                            self._drop(sel, state, s)
                            continue
                        s.sendall(self.request)  # small: fits the empty send buffer
                        sel.modify(s, selectors.EVENT_READ)
                        continue
                    try:
                        chunk = s.recv(65536)
                    except OSError:
                        self._drop(sel, state, s)
                        continue
                    if not chunk:
                        self._drop(sel, state, s)
                        continue
                    state[s] += chunk
                    if _complete(bytes(state[s])):
                        sel.unregister(s)
                        self.socks.append(s)
                        self.answered += 1
            for key in list(sel.get_map().values()):  # still waiting at the deadline
                if isinstance(key.fileobj, socket.socket):  # all it holds: registered above
                    self._drop(sel, state, key.fileobj)
        finally:
            sel.close()

    def _drop(self, sel: selectors.BaseSelector, state: dict, s: socket.socket) -> None:
        sel.unregister(s)
        state.pop(s, None)
        s.close()
        self.failed += 1

    def still_open(self) -> int:
        """Connections the server has not closed (a closed one reads EOF without blocking)."""
        alive = 0
        for s in self.socks:
            try:
                if s.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b"":
                    continue
            except BlockingIOError:
                pass
            except OSError:
                continue
            alive += 1
        return alive

    def close(self) -> None:
        for s in self.socks:
            s.close()
        self.socks.clear()


def _complete(buf: bytes) -> bool:
    head, sep, body = buf.partition(b"\r\n\r\n")
    if not sep:
        return False
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return len(body) >= int(value.strip())
    return True
