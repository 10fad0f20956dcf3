"""A small fault-injecting TCP proxy for tests: it forwards a loopback connection both ways and,
while `hold` is on, keeps back the client's chunks that match a predicate (a cache write) instead
of forwarding them. `release()` later sends what it kept, in order, on the connections they came
from: a write the client gave up on (timed out) lands late, as with a node that stalled."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable


class HoldingProxy:
    def __init__(self, upstream_port: int, hold_if: Callable[[bytes], bool]) -> None:
        self._upstream = upstream_port
        self._hold_if = hold_if
        self._lock = threading.Lock()
        self._held: list[tuple[socket.socket, bytes]] = []
        self._socks: list[socket.socket] = []
        self.hold = False
        self._listener = socket.socket()
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self.port: int = self._listener.getsockname()[1]
        self._closed = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def held(self) -> int:
        with self._lock:
            return len(self._held)

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", self._upstream))
            with self._lock:
                self._socks += [client, server]
            threading.Thread(target=self._pump, args=(client, server, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, False), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, from_client: bool) -> None:
        while True:
            try:
                chunk = src.recv(65536)
            except OSError:
                chunk = b""
            if not chunk:
                # The client gave up: keep the server side open while something it sent is
                # still held back, so it can land later.
                if from_client:
                    return
                with contextlib.suppress(OSError):
                    dst.shutdown(socket.SHUT_WR)
                return
            with self._lock:
                if from_client and self.hold and self._hold_if(chunk):
                    self._held.append((dst, chunk))
                    continue
            with contextlib.suppress(OSError):
                dst.sendall(chunk)

    def release(self) -> None:
        """Send every held chunk now, in the order it arrived."""
        with self._lock:
            held, self._held = self._held, []
        for dst, chunk in held:
            with contextlib.suppress(OSError):
                dst.sendall(chunk)

    def close(self) -> None:
        self._closed.set()
        self._listener.close()
        with self._lock:
            socks, self._socks = self._socks, []
        for s in socks:
            with contextlib.suppress(OSError):
                s.close()
