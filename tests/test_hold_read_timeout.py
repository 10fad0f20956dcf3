"""A held poll's change is not lost when the read of its announcement times out.

A lean stack (the cache, Redis for announcements, one poll server; no nginx, no app) with the
contract checker's fault proxy (fastpoll_testkit.contract.proxy) on the poll server's path to
the cache; the announcements go to Redis directly. A poll is held on v1. The proxy then delays
the cache's answers past [cache] timeout_ms while other polls keep the cache connection
answering (so a late answer is a lone TIMEOUT, not a silent server to reconnect to), v2 is
written and announced: the hold's read of the announcement times out. The delay then ends. The
held poll must be answered with v2 within about a second of the announcement, not at the
re-check ([server] recheck_subscribed_ms, 10 s here) or at the end of its wait.

The whole stack (nginx, the app, one poll server) with the same proxy on the cache path
(`behind`): a held poll whose read of a change keeps failing, because the cache stalls (silent
for 450 ms, under the 500 ms hang line) or answers every read late (150 ms, over [cache]
timeout_ms), reaches the app as a plain poll does (503, nginx's @fallback) and gets the message
within docs/api.md's bound, not at the re-check or the end of its wait."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Iterator

import httpx
import pytest
import redis

from fastpoll_testkit.contract.proxy import FaultProxy, classify_memcached, classify_redis
from fastpoll_testkit.helpers import Cache, new_uid, poll_key, poller_metric
from fastpoll_testkit.procs import free_port
from fastpoll_testkit.stack import Stack

TIMEOUT_MS = 200  # [cache] timeout_ms
DELAY_S = 0.4  # the cache's answers while the fault lasts: past the timeout
FAULT_S = 0.25  # the fault ends this long after the announcement (its read timed out by then)
WAIT_S = 6  # the held poll's wait: shorter than the re-check
BOUND_S = 1.5  # after the announcement


def cache_behind_proxy(s: Stack) -> FaultProxy:
    """s's ports, its cache reached through a fault proxy; announcements on its Redis directly."""
    s._allocate_ports()
    if s.backend == "memcached":
        proxy = FaultProxy(free_port(), s.memcached_ports[0], classify_memcached)
        s.extra_ini["memcached"] = {"servers": f"127.0.0.1:{proxy.port}"}
    else:
        proxy = FaultProxy(free_port(), s.redis_port, classify_redis)
        s.extra_ini["redis"] = {"server": f"127.0.0.1:{proxy.port}"}
        s.extra_ini["announce"] = {
            "server": f"127.0.0.1:{s.redis_port}",
            "password_file": str(s.run_dir / "redis.pass"),
        }
    return proxy


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
    proxy = cache_behind_proxy(s)
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


@pytest.fixture(params=["memcached", "redis"])
def behind(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Stack, FaultProxy]]:
    """The whole stack, its cache behind the fault proxy (the app's connections write, so only
    the poll server's answers are ever delayed); announcements on the stack's Redis directly."""
    backend = str(request.param)
    s = Stack(
        run_dir=tmp_path_factory.mktemp(f"hold-fallback-{backend}"),
        backend=backend,
        n_pollers=1,
        extra_ini={"server": {"recheck_subscribed_ms": "10000"}},
    )
    proxy = cache_behind_proxy(s)
    try:
        s.start()
        yield s, proxy
    finally:
        s.stop()
        proxy.close()


# docs/api.md ("Conditional and long polls"): with the default timeout_ms (100) and one node,
# a held poll whose read of a change fails is sent to the app within 0.3 s + 5 x 100 ms of the
# announcement (sent before the publish returns); the app's answer and this shared machine's
# scheduling get the rest.
FALLBACK_BOUND_S = 2.5


def publish(stack: Stack, uid: int, text: str) -> int:
    with stack.api() as api:
        r = api.post("/api/messages", json={"user_id": uid, "text": text})
    assert r.status_code == 201, r.text
    return int(r.json()["id"])


def held_on_current(
    stack: Stack, c: httpx.Client
) -> tuple[int, threading.Thread, list[tuple[httpx.Response, float]]]:
    """A new user with a message, a poll of its answer from the cache, then one held on its tag
    (wait=15): the user, the holding thread and where it puts the answer and its time."""
    uid = new_uid()
    publish(stack, uid, "before")
    url = stack.poll_url(uid)
    deadline = time.monotonic() + 10
    while (r := c.get(url)).headers.get("x-poll-source") != "cache":
        assert time.monotonic() < deadline, f"never from the cache: {r.status_code} {r.headers}"
        time.sleep(0.1)
    tag = r.headers["etag"]
    out: list[tuple[httpx.Response, float]] = []

    def held() -> None:
        with httpx.Client(base_url=stack.base_url, timeout=30) as hc:
            got = hc.get(f"{url}&wait=15", headers={"If-None-Match": tag})
        out.append((got, time.monotonic()))

    t = threading.Thread(target=held)
    t.start()
    deadline = time.monotonic() + 5
    while poller_metric(stack, "fastpoll_held_requests") < 1:
        assert time.monotonic() < deadline and not out, f"not held: {out}"
        time.sleep(0.05)
    return uid, t, out


def newest(r: httpx.Response) -> int:
    assert r.status_code == 200, (r.status_code, r.headers, r.text)
    return int(json.loads(r.content)["newest"]["id"]) if r.content else 0


def delivered(answer: list[tuple[httpx.Response, float]], sent: float, mid: int) -> httpx.Response:
    """The held poll's answer: message mid, within FALLBACK_BOUND_S of `sent`."""
    assert answer, "the held poll got no answer"
    r, at = answer[0]
    got = (r.status_code, r.headers.get("x-poll-source"), round(at - sent, 2))
    assert r.status_code == 200 and at - sent < FALLBACK_BOUND_S, f"(status, source, s): {got}"
    assert newest(r) == mid, (r.headers, r.text)
    return r


def test_held_poll_gets_the_message_through_a_short_cache_stall(
    behind: tuple[Stack, FaultProxy],
) -> None:
    """The cache path silent for 450 ms from the publish on (a stall, not a hang): the read of
    the announced change times out, the node is stalled and its retries fail fast."""
    stack, proxy = behind
    with httpx.Client(base_url=stack.base_url, timeout=10) as c:
        uid, t, answer = held_on_current(stack, c)
        proxy.read_delay = 0.45
        try:
            mid = publish(stack, uid, "in the stall")
            sent = time.monotonic()  # its announcement went out before it returned
            time.sleep(0.1)
        finally:
            proxy.read_delay = 0.0
        t.join(20)
    delivered(answer, sent, mid)


def test_held_poll_falls_back_while_every_cache_read_is_late(
    behind: tuple[Stack, FaultProxy],
) -> None:
    """Every cache answer 150 ms late (over timeout_ms, 100): a plain poll goes to the app, and
    so must a held poll whose read of the announced change fails, the message with it."""
    stack, proxy = behind
    with httpx.Client(base_url=stack.base_url, timeout=10) as c:
        uid, t, answer = held_on_current(stack, c)
        proxy.read_delay = 0.15
        try:
            time.sleep(0.3)
            mid = publish(stack, uid, "while slow")
            sent = time.monotonic()  # its announcement went out before it returned
            plain = c.get(stack.poll_url(uid))
            assert plain.headers["x-poll-source"] == "app" and newest(plain) == mid
            t.join(20)
        finally:
            proxy.read_delay = 0.0
    r = delivered(answer, sent, mid)
    assert r.headers["x-poll-source"] == "app", r.headers
