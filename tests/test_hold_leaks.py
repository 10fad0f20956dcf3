"""Held long polls that all disconnect at once leak nothing.

A lean stack (one memcached, one poll server, no nginx, no app): N polls with wait= and a
matching If-None-Match are held straight on the poll server's unix socket, on one key and
then on N keys. The test checks fastpoll_held_requests == N and that the poll server has a
descriptor per held client, closes every client at once (half with a reset, half with a FIN),
then checks that held is back to 0 and the connection count and /proc/PID/fd back to their
baseline, and that the poll server still answers and still holds. Leaks of memory are what
the ASan run (FP_POLL_SERVER=poll_server/build/poll_server-asan: LeakSanitizer at exit) and
the valgrind run (make -C poll_server valgrind) catch; conftest fails on their reports.

N is FP_HOLD_N: 3,000 by default, 500 under valgrind (FP_POLL_WRAPPER), 15,000 in
`make -C poll_server hold-soak` (docs/security.md)."""

from __future__ import annotations

import os
import socket
import struct
import time
from collections.abc import Iterator

import httpx
import pylibmc
import pytest
import xxhash

from fastpoll_testkit.helpers import poller_metric as metric
from fastpoll_testkit.stack import Stack

VALGRIND = "valgrind" in os.environ.get("FP_POLL_WRAPPER", "")
N = int(os.environ.get("FP_HOLD_N", "500" if VALGRIND else "3000"))
# Connecting and holding N polls; valgrind runs the poll server some 20-50 times slower.
HOLD_DEADLINE = 600.0 if VALGRIND else 120.0
FREE_DEADLINE = 300.0 if VALGRIND else 60.0
BASE_UID = 700_000_000  # far from conftest's new_uid() range: no test shares these keys
# Longer than it takes to hold N polls (the holds must not end before the closes), and a
# re-check that does not re-read N keys every 2 s (under valgrind that alone outruns it).
WAIT_S = 300
RECHECK_MS = 60000 if VALGRIND else 2000


@pytest.fixture(scope="module")
def lean(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    s = Stack(
        run_dir=tmp_path_factory.mktemp("hold-leaks"),
        backend="memcached",
        n_pollers=1,
        signing=False,
        # Under valgrind N first reads queue up faster than memcheck answers them: a timeout
        # would answer them 503 instead of holding them.
        cache_timeout_ms=30000 if VALGRIND else 1000,
        extra_ini={
            "poll": {"max_wait": str(WAIT_S)},
            "server": {
                "max_held": str(N + 100),
                "recheck_ms": str(RECHECK_MS),
                # At least the cache timeout (the poll server checks).
                "request_timeout_ms": "60000" if VALGRIND else "10000",
            },
        },
    )
    s._allocate_ports()
    s.write_config()
    try:
        s.start_memcached(0)
        s.start_poller(0)
        yield s
    finally:
        s.stop()


def fds(stack: Stack) -> int:
    return len(os.listdir(f"/proc/{stack.procs['poller-0'].pid}/fd"))


def settled_fds(stack: Stack, deadline: float) -> int:
    """The poll server's descriptor count once it stops changing (the admin connection of the
    last /metrics read may still be closing)."""
    last = fds(stack)
    while time.monotonic() < deadline:
        time.sleep(0.2)
        now = fds(stack)
        if now == last:
            return now
        last = now
    return last


def connect(sk: socket.socket, path: str, deadline: float) -> None:
    """A unix socket's connect fails with EAGAIN while the listener's backlog is full (a poll
    server under valgrind accepts slowly): try again until the deadline."""
    sk.settimeout(10)
    while True:
        try:
            sk.connect(path)
            return
        except BlockingIOError:
            assert time.monotonic() < deadline, "the poll server stopped accepting"
            time.sleep(0.01)


def request(uid: int, tag: str, wait: int = WAIT_S) -> bytes:
    return (
        f"GET /getMessages?user_id={uid}&wait={wait} HTTP/1.1\r\nHost: x\r\n"
        f"If-None-Match: {tag}\r\n\r\n"
    ).encode()


def hold_then_drop(stack: Stack, uids: list[int]) -> None:
    mc = pylibmc.Client([f"127.0.0.1:{stack.memcached_ports[0]}"], behaviors={"ketama": True})
    values = {f"/Poll/getMessages?user_id={u}": f'{{"unread":{u}}}'.encode() for u in uids}
    assert not mc.set_multi(values)  # the keys that failed: none
    tags = {u: '"' + xxhash.xxh3_64_hexdigest(values[f"/Poll/getMessages?user_id={u}"]) + '"'
            for u in uids}  # fmt: skip
    path = str(stack.poller_socket(0))
    port = stack.poller_ports[0]
    # One poll first: the poll server's cache connection exists before the baseline.
    r = httpx.get(f"http://127.0.0.1:{port}/getMessages?user_id={uids[0]}", timeout=30)
    assert r.status_code == 200 and r.headers["etag"] == tags[uids[0]]
    assert metric(stack, "fastpoll_held_requests") == 0
    base_conns = metric(stack, "fastpoll_open_connections")
    base_fds = settled_fds(stack, time.monotonic() + 10)
    nm = metric(stack, 'fastpoll_requests_total{method="GET",outcome="not_modified"}')
    be = metric(stack, 'fastpoll_requests_total{method="GET",outcome="backend_error"}')
    socks: list[socket.socket] = []
    deadline = time.monotonic() + HOLD_DEADLINE
    try:
        for i in range(N):
            uid = uids[i % len(uids)]
            sk = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            socks.append(sk)
            connect(sk, path, deadline)
            sk.sendall(request(uid, tags[uid]))
        while (held := metric(stack, "fastpoll_held_requests")) < N:
            assert time.monotonic() < deadline, f"{held} of {N} polls held"
            time.sleep(0.2)
        assert held == N
        # None answered meanwhile (a 503 from a cache read that failed, a wait that ended).
        assert metric(stack, 'fastpoll_requests_total{method="GET",outcome="not_modified"}') == nm
        assert metric(stack, 'fastpoll_requests_total{method="GET",outcome="backend_error"}') == be
        # Every held client has its descriptor (the check below can see a leak).
        assert fds(stack) >= base_fds + N
        assert metric(stack, "fastpoll_open_connections") == base_conns + N
    finally:
        # All at once: every other one with a reset (SO_LINGER 0), the rest with a FIN.
        for i, sk in enumerate(socks):
            if i % 2 == 0:
                sk.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            sk.close()
    t0 = time.monotonic()
    deadline = t0 + FREE_DEADLINE
    while (
        metric(stack, "fastpoll_held_requests") != 0
        or metric(stack, "fastpoll_open_connections") != base_conns
    ):
        assert time.monotonic() < deadline, "held slots or connections were not freed"
        time.sleep(0.1)
    now_fds = settled_fds(stack, deadline)
    assert now_fds == base_fds, f"descriptors: {base_fds} before, {now_fds} after"
    print(f"{N} held on {len(uids)} key(s): freed in {time.monotonic() - t0:.2f} s")
    # Still serving, and still holding: a held poll ends with 304 after its wait (1 s).
    uid = uids[0]
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sk:
        sk.settimeout(60)
        sk.connect(path)
        sk.sendall(request(uid, tags[uid], wait=1))
        got = b""
        while b"\r\n\r\n" not in got:
            chunk = sk.recv(4096)
            assert chunk, "closed without an answer"
            got += chunk
    assert got.startswith(b"HTTP/1.1 304 "), got[:200]


def test_held_polls_on_one_key_all_disconnect(lean: Stack) -> None:
    hold_then_drop(lean, [BASE_UID])


def test_held_polls_on_many_keys_all_disconnect(lean: Stack) -> None:
    # One key per poll: N key entries, more than the 1,024 hold.c recycles.
    hold_then_drop(lean, list(range(BASE_UID + 1, BASE_UID + 1 + N)))
