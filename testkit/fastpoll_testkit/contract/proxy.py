"""A fault-injecting TCP proxy for the nemesis, between the pollers and the apps and a memcached
node or Redis (the cache path), or between them and the Redis that carries announcements.

Each client chunk is classified (classify_memcached, classify_redis) as a read, a write or other.
Faults, each switched on and off by the nemesis:
- read_delay: on a connection that never wrote (a poll server's), the server's answers reach the
  client read_delay seconds late (each chunk when due, in order): the value was read at once, so
  a write and its announcement can land while that read is on its way back;
- hold: writes are kept back (and everything sent after them on the same connection, so the
  server still sees each connection's bytes in order); release() sends them, in arrival order or
  reversed (a reorder across connections). A client that gave up meanwhile has closed its side:
  the server side stays open until its held bytes are sent, so a write it timed out on lands late;
- blackhole(): every connection open now stops forwarding both ways and is never closed (a
  peer that vanished without a reset: half-open); new connections work.
"""

from __future__ import annotations

import contextlib
import json
import queue
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable

READ, WRITE, OTHER = "read", "write", "other"

_MC_READS = (b"get ", b"mg ", b"gat ")  # not `gets`: the app's read before its cas
_MC_WRITES = (b"cas ", b"add ", b"set ", b"replace ", b"delete ", b"touch ", b"ms ", b"md ")
_REDIS_READS = {b"GET", b"MGET"}
_REDIS_WRITES = {b"EVALSHA", b"EVAL", b"SET", b"DEL", b"SETEX", b"PSETEX"}


def classify_memcached(chunk: bytes) -> str:
    if chunk.startswith(_MC_READS):
        return READ
    if chunk.startswith(_MC_WRITES):
        return WRITE
    return OTHER


def classify_redis(chunk: bytes) -> str:
    """RESP: *N, $len, the command's name."""
    parts = chunk.split(b"\r\n", 3)
    name = parts[2].upper() if len(parts) > 2 and chunk.startswith(b"*") else b""
    if name in _REDIS_READS:
        return READ
    if name in _REDIS_WRITES:
        return WRITE
    return OTHER


def _recv(sock: socket.socket) -> bytes:
    """The next chunk; b"" at EOF or on an error."""
    try:
        return sock.recv(65536)
    except OSError:
        return b""


class _Conn:
    def __init__(self, client: socket.socket, server: socket.socket) -> None:
        self.client = client
        self.server = server
        self.dead = False  # blackholed
        self.held = 0  # chunks of this connection held back, not yet sent
        self.client_gone = False
        self.writer = False  # sent a write or a `gets` (the app's): its answers are never delayed
        # (when due, chunk), None to end: forwarded in order by _send, each when due, so a
        # delay shifts a connection's stream without adding up chunk after chunk.
        # A threading.Event instead of bytes: set once everything before it was sent (release).
        self.outq: queue.Queue[tuple[float, bytes | threading.Event] | None] = queue.Queue()
        self.inq: queue.Queue[tuple[float, bytes | threading.Event] | None] = queue.Queue()


class FaultProxy:
    def __init__(self, port: int, upstream_port: int, classify: Callable[[bytes], str]) -> None:
        self.upstream_port = upstream_port
        self._classify = classify
        self._lock = threading.Lock()
        self._conns: list[_Conn] = []
        self._held: list[tuple[_Conn, bytes]] = []
        self.read_delay = 0.0
        self.hold = False
        self.failures: dict[str, int] = {}  # connections it could not carry, by why (_failed)
        self._listener = socket.create_server(("127.0.0.1", port), backlog=512)
        self.port: int = self._listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True, name=f"proxy-{port}").start()

    def _next_client(self) -> socket.socket | None:
        try:
            return self._listener.accept()[0]
        except OSError:  # closed
            return None

    def _failed(self, what: str, e: BaseException) -> None:
        """A connection the proxy could not carry, in its log (the run's notes count them): the
        first 5 of each kind, then every 1,000th."""
        kind = f"{what}: {e!r}"
        with self._lock:
            n = self.failures[kind] = self.failures.get(kind, 0) + 1
        if n <= 5 or n % 1000 == 0:
            stamp = time.strftime("%H:%M:%S")
            print(f"{stamp} proxy :{self.port}: {kind} (#{n})", file=sys.stderr, flush=True)

    def _accept(self) -> None:
        while (client := self._next_client()) is not None:
            try:
                server = socket.create_connection(("127.0.0.1", self.upstream_port), timeout=2)
                server.settimeout(None)
            except OSError as e:
                self._failed(f"upstream connect to :{self.upstream_port} failed", e)
                client.close()  # the upstream is down: so is this connection
                continue
            conn = _Conn(client, server)
            with self._lock:
                self._conns.append(conn)
            try:
                for target, args in (
                    (self._up, (conn,)),
                    (self._send, (conn, False)),
                    (self._send, (conn, True)),
                    (self._down, (conn,)),
                ):
                    threading.Thread(target=target, args=args, daemon=True).start()
            except RuntimeError as e:  # no thread to be had (the machine's pid_max): keep on
                self._failed("no thread for a connection", e)
                self._drop(conn)

    def _up(self, conn: _Conn) -> None:
        """Client to server."""
        while True:
            chunk = _recv(conn.client)
            if not chunk:
                with self._lock:
                    conn.client_gone = True
                    keep = conn.held > 0 or conn.dead
                if not keep:
                    conn.outq.put(None)
                return
            kind = self._classify(chunk)
            with self._lock:
                if conn.dead:
                    continue
                if conn.held or (self.hold and kind == WRITE):
                    conn.held += 1
                    self._held.append((conn, chunk))
                    continue
                if kind == WRITE or chunk.startswith(b"gets "):
                    conn.writer = True
            conn.outq.put((0.0, chunk))

    def _send(self, conn: _Conn, to_client: bool) -> None:
        q, sock = (conn.inq, conn.client) if to_client else (conn.outq, conn.server)
        while True:
            item = q.get()
            if item is None:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_WR)
                if to_client:
                    self._drop(conn)
                return
            due, chunk = item
            if isinstance(chunk, threading.Event):
                chunk.set()
                continue
            pause = due - time.monotonic()
            if pause > 0:
                time.sleep(pause)
            with contextlib.suppress(OSError):
                sock.sendall(chunk)

    def _down(self, conn: _Conn) -> None:
        """Server to client."""
        while True:
            chunk = _recv(conn.server)
            if not chunk:
                conn.inq.put(None)
                return
            with self._lock:
                dead = conn.dead
                delay = 0.0 if conn.writer else self.read_delay
            if not dead:
                conn.inq.put((time.monotonic() + delay, chunk))

    def _drop(self, conn: _Conn) -> None:
        with self._lock:
            if conn in self._conns:
                self._conns.remove(conn)
        conn.outq.put(None)
        conn.inq.put(None)
        for s in (conn.client, conn.server):
            with contextlib.suppress(OSError):
                s.close()

    def release(self, reverse: bool = False, wait_s: float = 5.0) -> int:
        """Sends every held chunk now, connection after connection 10 ms apart, in the order
        their first held chunk arrived or reversed (each connection's own bytes stay in order);
        returns how many chunks once they are all handed to the server (wait_s at most), so
        that the fault's recorded end is when its writes landed, not when they were queued."""
        with self._lock:
            held, self._held = self._held, []
            self.hold = False
        groups: dict[_Conn, list[bytes]] = {}
        for conn, chunk in held:
            groups.setdefault(conn, []).append(chunk)
        order = list(groups)[::-1] if reverse else list(groups)
        start = time.monotonic()
        sent: list[tuple[_Conn, threading.Event]] = []
        for i, conn in enumerate(order):
            for chunk in groups[conn]:
                conn.outq.put((start + 0.01 * i, chunk))
            sent.append((conn, threading.Event()))
            conn.outq.put((0.0, sent[-1][1]))
            with self._lock:
                conn.held = 0
                close = conn.client_gone
            if close:
                conn.outq.put(None)
        deadline = time.monotonic() + wait_s
        for conn, event in sent:
            while not event.wait(min(0.05, max(0.0, deadline - time.monotonic()))):
                with self._lock:
                    gone = conn not in self._conns  # dropped: its sender has stopped
                if gone or time.monotonic() >= deadline:
                    break
        return len(held)

    def blackhole(self) -> int:
        """Every connection open now goes silent for good; returns how many."""
        with self._lock:
            for conn in self._conns:
                conn.dead = True
            return len(self._conns)

    def close_dead(self) -> None:
        """Ends the blackholed connections (the run's final heal)."""
        with self._lock:
            dead = [c for c in self._conns if c.dead]
        for conn in dead:
            self._drop(conn)

    def reset_all(self) -> None:
        """Closes every connection (the upstream restarted: its sockets are gone)."""
        with self._lock:
            conns = list(self._conns)
        for conn in conns:
            self._drop(conn)

    def close(self) -> None:
        self._listener.close()
        self.release(wait_s=0.0)
        self.reset_all()


# ---- the proxies of a run, in a process of their own -----------------------------------------
#
# The clients' threads would share the GIL with the proxies' and slow every cache read beyond
# the poll server's timeout (100 ms) at random. So a run starts `python -m
# fastpoll_testkit.contract.proxy SPEC` with all its proxies and drives them over a control
# connection: one JSON line per command, one JSON line back. The process ends when that
# connection closes (its parent is gone).

CLASSIFIERS: dict[str, Callable[[bytes], str]] = {
    "memcached": classify_memcached,
    "redis": classify_redis,
    "none": lambda _chunk: OTHER,
}


def serve(spec: dict[str, list[object]]) -> None:
    """spec: {name: [listen port, upstream port, classifier name]}; prints the control port."""
    proxies = {
        name: FaultProxy(int(str(port)), int(str(up)), CLASSIFIERS[str(kind)])
        for name, (port, up, kind) in spec.items()
    }
    control = socket.socket()
    control.bind(("127.0.0.1", 0))
    control.listen(1)
    print(control.getsockname()[1], flush=True)
    sys.stdout.close()
    conn, _ = control.accept()
    with conn, conn.makefile("rw") as f:
        for line in f:
            cmd = json.loads(line)
            p = proxies[cmd["proxy"]]
            op, arg = cmd["op"], cmd.get("arg")
            result: object = None
            if op == "read_delay":
                p.read_delay = float(arg)
            elif op == "hold":
                p.hold = bool(arg)
            elif op == "release":
                result = p.release(bool(arg))
            elif op == "blackhole":
                result = p.blackhole()
            elif op == "close_dead":
                p.close_dead()
            elif op == "reset_all":
                p.reset_all()
            elif op == "failures":
                with p._lock:
                    result = dict(p.failures)
            f.write(json.dumps({"result": result}) + "\n")
            f.flush()
    for p in proxies.values():
        p.close()


class ProxyControl:
    """The run's side: starts the proxy process and sends it commands."""

    def __init__(self, spec: dict[str, list[object]], log: str) -> None:
        self.ports = {name: int(str(v[0])) for name, v in spec.items()}
        with open(log, "ab") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "fastpoll_testkit.contract.proxy", json.dumps(spec)],
                stdout=subprocess.PIPE,
                stderr=err,
                start_new_session=True,
            )
        if self.proc.stdout is None:
            raise RuntimeError("no pipe to the proxy process")
        port = int(self.proc.stdout.readline())
        self._sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        self._file = self._sock.makefile("rw")
        self._lock = threading.Lock()

    def send(self, proxy: str, op: str, arg: object = None) -> object:
        with self._lock:
            self._file.write(json.dumps({"proxy": proxy, "op": op, "arg": arg}) + "\n")
            self._file.flush()
            return json.loads(self._file.readline())["result"]

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._file.close()
            self._sock.close()
        try:
            self.proc.wait(5)
        except Exception:  # noqa: BLE001 -- it did not end: stop it, by its pid
            self.proc.kill()
            self.proc.wait()


if __name__ == "__main__":
    serve(json.loads(sys.argv[1]))
