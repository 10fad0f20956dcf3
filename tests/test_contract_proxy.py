"""The contract checker's fault proxy against a tiny line server on loopback: answers delayed on a
reader's connection only, writes held and released in order or reversed, connections silenced."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fastpoll_testkit.contract.proxy import (
    FaultProxy,
    ProxyControl,
    classify_memcached,
    classify_redis,
)
from fastpoll_testkit.procs import free_port


@pytest.fixture
def upstream() -> Iterator[tuple[int, list[bytes]]]:
    """Answers every chunk with b"ok <chunk>"; keeps what it received, in order."""
    got: list[bytes] = []
    srv = socket.create_server(("127.0.0.1", 0))

    def serve(c: socket.socket) -> None:
        with c:
            while data := c.recv(4096):
                got.append(data)
                c.sendall(b"ok " + data)

    def accept() -> None:
        with contextlib.suppress(OSError):
            while True:
                threading.Thread(target=serve, args=(srv.accept()[0],), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    yield srv.getsockname()[1], got
    srv.close()


def ask(s: socket.socket, data: bytes) -> tuple[bytes, float]:
    t = time.monotonic()
    s.sendall(data)
    return s.recv(4096), time.monotonic() - t


def test_classify() -> None:
    assert classify_memcached(b"mg /k v k\r\n") == "read"
    assert classify_memcached(b"gets /k\r\n") == "other"  # the app's read before its cas
    assert classify_memcached(b"cas /k 0 300 1 7\r\nx\r\n") == "write"
    assert classify_redis(b"*2\r\n$3\r\nGET\r\n$2\r\n/k\r\n") == "read"
    assert classify_redis(b"*5\r\n$7\r\nevalsha\r\n") == "write"


def test_answers_to_a_reader_are_delayed_not_a_writers(upstream: tuple[int, list[bytes]]) -> None:
    port, got = upstream
    p = FaultProxy(free_port(), port, classify_memcached)
    try:
        p.read_delay = 0.2
        with socket.create_connection(("127.0.0.1", p.port)) as reader:
            answer, took = ask(reader, b"mg /k v\r\n")
            assert answer == b"ok mg /k v\r\n" and took >= 0.2
            assert got == [b"mg /k v\r\n"]  # read at once; only the answer was late
        with socket.create_connection(("127.0.0.1", p.port)) as writer:
            ask(writer, b"gets /k\r\n")
            _, took = ask(writer, b"get /k\r\n")
            assert took < 0.15
    finally:
        p.close()


def test_writes_held_then_released_reversed(upstream: tuple[int, list[bytes]]) -> None:
    port, got = upstream
    p = FaultProxy(free_port(), port, classify_memcached)
    try:
        p.hold = True
        conns = [socket.create_connection(("127.0.0.1", p.port)) for _ in range(2)]
        conns[0].sendall(b"cas /k 1\r\n")
        time.sleep(0.05)
        conns[1].sendall(b"add /k 2\r\n")
        time.sleep(0.05)
        conns[1].sendall(b"mg /k\r\n")  # not a write, but behind its connection's held one
        time.sleep(0.05)
        assert got == []
        conns[0].close()  # the client gave up: its write still lands
        assert p.release(reverse=True) == 3
        deadline = time.monotonic() + 2
        while b"cas /k 1\r\n" not in got and time.monotonic() < deadline:
            time.sleep(0.01)
        # Reversed across connections; in order within one (the server may see its two
        # chunks as one).
        assert got[0].startswith(b"add /k 2\r\n") and got[-1] == b"cas /k 1\r\n"
        assert b"".join(got[:-1]) == b"add /k 2\r\nmg /k\r\n"
        conns[1].close()
    finally:
        p.close()


def test_blackhole_silences_open_connections_only(upstream: tuple[int, list[bytes]]) -> None:
    port, _ = upstream
    p = FaultProxy(free_port(), port, classify_redis)
    try:
        old = socket.create_connection(("127.0.0.1", p.port))
        assert ask(old, b"PING\r\n")[0] == b"ok PING\r\n"
        assert p.blackhole() == 1
        old.settimeout(0.3)
        old.sendall(b"PING\r\n")
        with pytest.raises(TimeoutError):
            old.recv(100)  # no answer, no reset: half-open
        with socket.create_connection(("127.0.0.1", p.port)) as new:
            assert ask(new, b"PING\r\n")[0] == b"ok PING\r\n"
        old.close()
    finally:
        p.close()


def test_a_connection_it_cannot_carry_is_closed_and_counted(
    capfd: pytest.CaptureFixture[str],
) -> None:
    down = free_port()  # nothing listens there: the upstream is down
    p = FaultProxy(free_port(), down, classify_memcached)
    try:
        for _ in range(7):
            with socket.create_connection(("127.0.0.1", p.port)) as c:
                c.settimeout(2)
                assert c.recv(10) == b""  # closed at once, not left hanging
        deadline = time.monotonic() + 2
        while sum(p.failures.values()) < 7 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert list(p.failures.values()) == [7]
        log = capfd.readouterr().err.splitlines()
        assert len(log) == 5  # the first 5 of a kind, then every 1,000th
        assert f"upstream connect to :{down} failed: ConnectionRefusedError" in log[0]
    finally:
        p.close()


def test_the_proxy_process_reports_its_failures(tmp_path: Path) -> None:
    down, listen = free_port(), free_port()
    ctl = ProxyControl({"memcached-0": [listen, down, "memcached"]}, str(tmp_path / "proxy.log"))
    try:
        for _ in range(3):
            with socket.create_connection(("127.0.0.1", listen)) as c:
                c.settimeout(2)
                assert c.recv(10) == b""
        refused = ConnectionRefusedError(111, "Connection refused")
        want = {f"upstream connect to :{down} failed: {refused!r}": 3}
        deadline = time.monotonic() + 2
        while (got := ctl.send("memcached-0", "failures")) != want and time.monotonic() < deadline:
            time.sleep(0.01)
        assert got == want
    finally:
        ctl.close()
    assert "(#3)" in (tmp_path / "proxy.log").read_text()


def test_release_returns_once_the_held_writes_were_sent(upstream: tuple[int, list[bytes]]) -> None:
    """The nemesis records a hold's end when release() returns: the writes must have landed by
    then, not only been queued (20 connections, 10 ms apart)."""
    port, got = upstream
    p = FaultProxy(free_port(), port, classify_memcached)
    conns = [socket.create_connection(("127.0.0.1", p.port)) for _ in range(20)]
    try:
        p.hold = True
        for i, c in enumerate(conns):
            c.sendall(f"cas /k{i} 1\r\n".encode())
        deadline = time.monotonic() + 10  # on a busy machine the proxy's threads start late
        while len(p._held) < 20 and time.monotonic() < deadline:
            time.sleep(0.01)
        t = time.monotonic()
        assert p.release() == 20
        assert time.monotonic() - t >= 0.18
        deadline = time.monotonic() + 0.5
        while len(got) < 20 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(got) == 20
    finally:
        for c in conns:
            c.close()
        p.close()
