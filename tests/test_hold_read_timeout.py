"""A held poll's change is not lost when the read of its announcement times out (issue 20).

A lean stack (the cache, Redis for announcements, one poll server; no nginx, no app) with the
contract checker's fault proxy (fastpoll_testkit.contract.proxy) on the poll server's path to
the cache; the announcements go to Redis directly. A poll is held on v1. The proxy then delays
the cache's answers past [cache] timeout_ms while other polls keep the cache connection
answering (so a late answer is a lone TIMEOUT, not a silent server to reconnect to), v2 is
written and announced: the hold's read of the announcement times out. The delay then ends. The
held poll must be answered with v2 within about a second of the announcement, not at the
re-check ([server] recheck_subscribed_ms, 10 s here) or at the end of its wait."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator

import httpx
import pytest
import redis

from fastpoll_testkit.contract.proxy import FaultProxy, classify_memcached, classify_redis
from fastpoll_testkit.helpers import Cache, new_uid, poll_key
from fastpoll_testkit.stack import Stack, free_port

TIMEOUT_MS = 200  # [cache] timeout_ms
DELAY_S = 0.4  # the cache's answers while the fault lasts: past the timeout
FAULT_S = 0.25  # the fault ends this long after the announcement (its read timed out by then)
WAIT_S = 6  # the held poll's wait: shorter than the re-check
BOUND_S = 1.5  # after the announcement


@pytest.fixture(params=["memcached", "redis"])
def lean(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Stack, FaultProxy]]:
    backend = str(request.param)
    s = Stack(
        run_dir=tmp_path_factory.mktemp(f"hold-timeout-{backend}"),
        backend=backend,
        n_pollers=1,
        signing=False,
        cache_timeout_ms=TIMEOUT_MS,
        extra_ini={"server": {"recheck_subscribed_ms": "10000"}},
    )
    s._allocate_ports()
    if backend == "memcached":
        proxy = FaultProxy(free_port(), s.memcached_ports[0], classify_memcached)
        s.extra_ini["memcached"] = {"servers": f"127.0.0.1:{proxy.port}"}
    else:
        proxy = FaultProxy(free_port(), s.redis_port, classify_redis)
        s.extra_ini["redis"] = {"server": f"127.0.0.1:{proxy.port}"}
        s.extra_ini["announce"] = {
            "server": f"127.0.0.1:{s.redis_port}",
            "password_file": str(s.run_dir / "redis.pass"),
        }
    s.write_config()
    try:
        if backend == "memcached":
            s.start_memcached(0)
        s.start_redis()
        s.start_poller(0)
        s.wait_subscribed()
        yield s, proxy
    finally:
        s.stop()
        proxy.close()


def background_polls(port: int, stop: threading.Event) -> None:
    """A poll of a fresh key every 20 ms (no coalescing): while the answers are delayed, one
    reaches the poll server every 20 ms, so the cache is never silent for a timeout."""
    socks: list[socket.socket] = []
    uid = 900_000_000 + new_uid() * 1000
    try:
        while not stop.is_set() and len(socks) < 500:
            with contextlib.suppress(OSError):
                c = socket.create_connection(("127.0.0.1", port), timeout=2)
                path = poll_key(uid + len(socks)).removeprefix("/Poll")
                c.sendall(f"GET {path} HTTP/1.1\r\nHost: t\r\n\r\n".encode())
                socks.append(c)
            time.sleep(0.02)
    finally:
        for c in socks:
            c.close()


def test_held_poll_answered_after_its_announcement_read_times_out(
    lean: tuple[Stack, FaultProxy],
) -> None:
    stack, proxy = lean
    cache = Cache(stack)
    key = poll_key(new_uid())
    cache.set(key, b'{"v":1}')
    port = stack.poller_ports[0]
    path = key.removeprefix("/Poll")  # the poll server's target: nginx strips [keys] prefix
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=WAIT_S + 10) as c:
        first = c.get(path)
        assert first.status_code == 200, (first.status_code, first.text)
        etag = first.headers["etag"]
        answer: list[tuple[httpx.Response, float]] = []

        def held() -> None:
            r = c.get(f"{path}&wait={WAIT_S}", headers={"If-None-Match": etag})
            answer.append((r, time.monotonic()))

        t = threading.Thread(target=held)
        t.start()
        time.sleep(0.5)  # held on v1
        stop = threading.Event()
        bg = threading.Thread(target=background_polls, args=(port, stop))
        bg.start()
        try:
            # Raised in steps: a jump would leave the connection without an answer for longer
            # than the timeout (a silent server: the poll server would reconnect).
            for step in range(1, 9):
                time.sleep(0.08)
                proxy.read_delay = DELAY_S * step / 8
            time.sleep(DELAY_S + 0.1)  # delayed answers arrive all the time now
            cache.set(key, b'{"v":2}')
            password = (stack.run_dir / "redis.pass").read_text().strip()
            message = f"{key} {int(time.time() * 1000)}".encode()
            with redis.Redis(host="127.0.0.1", port=stack.redis_port, password=password) as rd:
                rd.publish("fastpoll:announce", message)
            announced = time.monotonic()
            time.sleep(FAULT_S)
            proxy.read_delay = 0.0
        finally:
            stop.set()
            bg.join()
        t.join(WAIT_S + 15)
    assert answer, "the held poll got no answer"
    r, at = answer[0]
    timeouts = sum(
        float(line.rsplit(" ", 1)[1])
        for line in httpx.get(f"http://127.0.0.1:{stack.admin_ports[0]}/metrics").text.splitlines()
        if line.startswith("fastpoll_backend_gets_total{") and 'result="timeout"' in line
    )
    assert timeouts > 0, "no cache read timed out: the test did not make the fault it is about"
    assert (r.status_code, r.content) == (200, b'{"v":2}'), (r.status_code, r.content)
    assert at - announced < BOUND_S, f"answered {at - announced:.2f} s after the announcement"
