"""Event streams (docs/api.md, "Event streams") through nginx, on both backends: a poll with
Accept: text/event-stream on the same signed URL gets its answer as an event, then an event per
change; Last-Event-ID is If-None-Match; a miss ends the stream and its client's reconnect goes to
the app, which answers one event; heartbeats, the lifetime, a drain, a slow reader and the
[stream] max bound each stream's life. Real nginx, poll server, cache, app."""

from __future__ import annotations

import json
import re
import signal
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from fastpoll_app.conditional import etag_of
from fastpoll_testkit.helpers import Cache, new_uid, start_stack
from fastpoll_testkit.procs import wait_for
from fastpoll_testkit.sse import Event, EventStreamClient, read_first_event
from fastpoll_testkit.stack import Stack

STREAM_INI = {
    # Short, so that each bound shows within a test: heartbeats every second, a stream's life
    # 3-3.3 s, at most 12 streams per poller, 16 KiB a reader may leave unread.
    "stream": {
        "heartbeat_ms": "1000",
        "lifetime_s": "3",
        "retry_spread_ms": "300",
        "max": "12",
        "max_buffered": "16384",
    },
    # An eviction is not announced: held keys are read again every 500 ms.
    "server": {"recheck_subscribed_ms": "500"},
}


@pytest.fixture(scope="module", params=["memcached", "redis"])
def stack(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    run_dir: Path = tmp_path_factory.mktemp(f"streams-{request.param}")
    s = start_stack(run_dir, request.param, n_pollers=1, extra_ini=STREAM_INI)
    yield s
    s.stop()


class Collector:
    """A stream client's events, waited on."""

    def __init__(self, stack: Stack, url: str, **kw: object) -> None:
        self.events: list[Event] = []
        self._cv = threading.Condition()
        self.client = EventStreamClient(stack.base_url + url, self._on, **kw)  # type: ignore[arg-type]

    def _on(self, e: Event) -> None:
        with self._cv:
            self.events.append(e)
            self._cv.notify_all()

    def __enter__(self) -> Collector:
        self.client.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.client.stop()

    def wait(self, pred: object, timeout: float = 5.0) -> Event:
        """The first event (in order) for which pred(event) holds, waiting for it."""
        deadline = time.monotonic() + timeout
        with self._cv:
            while True:
                for e in self.events:
                    if pred(e):  # type: ignore[operator]
                        return e
                left = deadline - time.monotonic()
                assert left > 0, f"no such event in {timeout} s: {self.events!r}"
                self._cv.wait(left)


def newest(e: Event) -> int:
    """The newest message id an event's answer shows (0: none)."""
    if not e.answer:
        return 0
    body = json.loads(e.answer)
    body = body.get("user", body) if "user" in body else body
    return int((body.get("newest") or {}).get("id", 0))


def publish(stack: Stack, uid: int, text: str) -> int:
    with stack.api() as api:
        r = api.post("/api/messages", json={"user_id": uid, "text": text})
        assert r.status_code == 201, r.text
        return int(r.json()["id"])


def metric(stack: Stack, name: str) -> float:
    text = httpx.get(f"http://127.0.0.1:{stack.admin_ports[0]}/metrics", timeout=5).text
    m = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


def test_each_publish_is_an_event_in_order(stack: Stack) -> None:
    uid = new_uid()
    with Collector(stack, stack.poll_url(uid)) as c:
        c.wait(lambda e: True)  # the first answer (from the app: a miss)
        wait_for(
            "a stream held", lambda: metric(stack, "fastpoll_streams") >= 1, 5
        )  # then the poller's stream
        for i in range(3):
            mid = publish(stack, uid, f"m{i}")
            e = c.wait(lambda e, m=mid: newest(e) == m)
            assert e.source == "cache", e
        shown = [newest(e) for e in c.events]
        assert shown == sorted(shown), shown  # never older than an earlier event
        for e in c.events:
            assert e.id == etag_of(e.answer), e  # the id is the answer's ETag
        last = json.loads(c.events[-1].answer)
        assert [m["text"] for m in last["messages"]] == ["m0", "m1", "m2"]


def test_last_event_id_is_if_none_match(stack: Stack) -> None:
    uid = new_uid()
    publish(stack, uid, "seen")
    with httpx.Client(base_url=stack.base_url, timeout=10) as h:
        url = stack.poll_url(uid)
        assert h.get(url).status_code == 200
        tag = h.get(url).headers["etag"]
    with Collector(stack, url, last_event_id=tag) as c:
        time.sleep(0.5)
        assert c.events == [], c.events  # the answer it has seen is not sent again
        mid = publish(stack, uid, "new")
        e = c.wait(lambda e: newest(e) == mid)
        assert e.source == "cache" and e.connection == 0


def test_a_room_stream_gets_the_room_and_the_user(stack: Stack) -> None:
    uid, room = new_uid(), f"r{new_uid()}"
    with stack.api() as api:
        r = api.post("/api/poll-url", json={"user_id": uid, "channels": [room]})
        assert r.status_code == 200, r.text
        url = str(r.json()["url"])
    with Collector(stack, url) as c:
        c.wait(lambda e: True)
        with stack.api() as api:
            assert (
                api.post(f"/api/channels/{room}/messages", json={"text": "hi all"}).status_code
                == 201
            )
        e = c.wait(lambda e: b"hi all" in e.answer)
        assert e.source == "cache", e
        mid = publish(stack, uid, "just you")
        e = c.wait(lambda e: b"just you" in e.answer)
        assert b"hi all" in e.answer and e.id == etag_of(e.answer) and mid > 0


def test_a_rooms_members_share_its_value_and_keep_their_own(stack: Stack) -> None:
    """Two members' streams of one room hold one copy of the room's answer (chpoll.c's shared
    values): a room message reaches both, a member's own message only that member, and the
    room's next message both again, each with its own part as it was."""
    room = f"r{new_uid()}"
    a, b = new_uid(), new_uid()
    urls = {}
    with stack.api() as api:
        for uid in (a, b):
            r = api.post("/api/poll-url", json={"user_id": uid, "channels": [room]})
            assert r.status_code == 200, r.text
            urls[uid] = str(r.json()["url"])

    def room_post(text: str) -> None:
        with stack.api() as api:
            r = api.post(f"/api/channels/{room}/messages", json={"text": text})
            assert r.status_code == 201, r.text

    with Collector(stack, urls[a]) as ca, Collector(stack, urls[b]) as cb:
        ca.wait(lambda e: True)
        cb.wait(lambda e: True)
        wait_for("two streams held", lambda: metric(stack, "fastpoll_streams") >= 2, 5)
        room_post("to all 1")
        for c in (ca, cb):
            assert c.wait(lambda e: b"to all 1" in e.answer).source == "cache"
        publish(stack, a, "just a")
        ca.wait(lambda e: b"just a" in e.answer)
        room_post("to all 2")
        ea = ca.wait(lambda e: b"to all 2" in e.answer)
        eb = cb.wait(lambda e: b"to all 2" in e.answer)
        assert b"just a" in ea.answer and b"to all 1" in ea.answer, ea
        assert b"just a" not in eb.answer and b"to all 1" in eb.answer, eb
        assert all(b"just a" not in e.answer for e in cb.events), cb.events


def test_a_miss_ends_the_stream_and_the_app_answers(stack: Stack) -> None:
    uid = new_uid()
    mid = publish(stack, uid, "before")
    ends = metric(stack, 'fastpoll_stream_ends_total{reason="cache"}')
    with Collector(stack, stack.poll_url(uid)) as c:
        first = c.wait(lambda e: newest(e) == mid)
        conn = c.wait(lambda e: e.source == "cache" or e.connection > first.connection)
        key = f"/Poll/getMessages?user_id={uid}"
        Cache(stack).delete(key)
        # Seen at the re-check: the stream ends, the reconnect misses, the app answers and
        # fills, and the next reconnect streams from the cache again.
        wait_for(
            "a stream ended by its cache",
            lambda: metric(stack, 'fastpoll_stream_ends_total{reason="cache"}') > ends,
            5,
        )
        later = publish(stack, uid, "after")
        e = c.wait(lambda e: newest(e) == later, timeout=8)
        # The stream ended and its client resumed (through the app while the key was gone).
        assert e.connection > conn.connection, c.events
        assert c.client.alive  # never failed: it reconnected each time


def test_heartbeats_and_the_lifetime(stack: Stack) -> None:
    uid = new_uid()
    publish(stack, uid, "x")
    with httpx.Client(base_url=stack.base_url, timeout=10) as h:
        url = stack.poll_url(uid)
        h.get(url)
        t0 = time.monotonic()
        with h.stream("GET", url, headers={"Accept": "text/event-stream"}) as r:
            assert r.status_code == 200 and r.headers["x-poll-source"] == "cache"
            assert r.headers["content-type"].startswith("text/event-stream")
            body = b"".join(r.iter_raw())  # until the poll server ends it
        took = time.monotonic() - t0
    assert 2.9 <= took <= 4.5, took  # lifetime_s 3 plus 0..10 %
    assert body.count(b"\n:\n") >= 2, body  # heartbeats, every second
    m = re.search(rb"retry: (\d+)\n\n$", body)
    assert m and int(m.group(1)) <= 300, body[-80:]  # the end's hint within retry_spread_ms


def raw_stream(port: int, target: str, rcvbuf: int = 0) -> socket.socket:
    s = socket.socket()
    if rcvbuf:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    s.connect(("127.0.0.1", port))
    s.sendall(f"GET {target} HTTP/1.1\r\nHost: x\r\nAccept: text/event-stream\r\n\r\n".encode())
    return s


def direct(stack: Stack, uid: int) -> str:
    """uid's signed target on a poll server itself (no nginx, no route: Accept decides)."""
    return stack.sign(f"/getMessages?user_id={uid}")


def test_past_max_a_stream_is_one_event(stack: Stack) -> None:
    uid = new_uid()
    publish(stack, uid, "y")
    httpx.get(stack.base_url + stack.poll_url(uid), timeout=5)
    socks = []
    try:
        wait_for("no stream held", lambda: metric(stack, "fastpoll_streams") == 0, 10)
        for _ in range(12):
            s = raw_stream(stack.poller_ports[0], direct(stack, uid))
            assert b"id: " in read_first_event(s)
            socks.append(s)
        over = metric(stack, 'fastpoll_stream_ends_total{reason="over_cap"}')
        s = raw_stream(stack.poller_ports[0], direct(stack, uid))
        socks.append(s)
        s.settimeout(3)
        got = b""
        while chunk := s.recv(65536):
            got += chunk
        assert b"id: " in got and b"retry: " in got, got  # its answer, a pace, the end
        assert metric(stack, 'fastpoll_stream_ends_total{reason="over_cap"}') == over + 1
    finally:
        for s in socks:
            s.close()


def test_a_slow_reader_is_dropped(stack: Stack) -> None:
    uid = new_uid()
    publish(stack, uid, "z")
    httpx.get(stack.base_url + stack.poll_url(uid), timeout=5)
    slow = metric(stack, 'fastpoll_stream_ends_total{reason="slow"}')
    s = raw_stream(stack.poller_ports[0], direct(stack, uid), rcvbuf=4096)
    try:
        assert b"id: " in read_first_event(s)
        # Each event is the whole answer (10 messages of ~1,900 bytes): the reader reads
        # nothing more, and the poll server may not buffer past max_buffered for it.
        for i in range(60):
            publish(stack, uid, f"{i:04d}" + "w" * 1900)
        wait_for(
            "a slow stream dropped",
            lambda: metric(stack, 'fastpoll_stream_ends_total{reason="slow"}') > slow,
            10,
        )
    finally:
        s.close()


def test_a_drain_ends_streams_with_a_spread_retry(stack: Stack) -> None:
    uid = new_uid()
    publish(stack, uid, "d")
    httpx.get(stack.base_url + stack.poll_url(uid), timeout=5)
    s = raw_stream(stack.poller_ports[0], direct(stack, uid))
    try:
        assert b"id: " in read_first_event(s)
        proc = stack.procs["poller-0"]
        import os

        os.kill(proc.pid, signal.SIGTERM)
        s.settimeout(5)
        got = b""
        while chunk := s.recv(65536):
            got += chunk
        m = re.search(rb"retry: (\d+)\n\n$", got)
        assert m and int(m.group(1)) <= 300, got
    finally:
        s.close()
        stack.stop_proc("poller-0")
        stack.start_poller(0)


def test_what_a_stream_is_sent_after_its_request_is_dropped(stack: Stack) -> None:
    """A held stream keeps no input buffer: what its client sends after the request (a
    pipelined poll, then junk) is read and dropped, never answered, while its events go on; once
    it is closed, the next connections (their recycled objects given a buffer again) are served."""
    uid = new_uid()
    publish(stack, uid, "before")
    httpx.get(stack.base_url + stack.poll_url(uid), timeout=5)  # the key cached
    target = direct(stack, uid)
    s = raw_stream(stack.poller_ports[0], target)
    try:
        got = read_first_event(s)
        assert b"id: " in got, got
        s.sendall(f"GET {target} HTTP/1.1\r\nHost: x\r\n\r\n".encode() + b"x" * 5000)
        mid = publish(stack, uid, "after")
        s.settimeout(5)
        while f'"id":{mid}'.encode() not in got:
            chunk = s.recv(65536)
            assert chunk, got
            got += chunk
        assert got.count(b"HTTP/1.1 ") == 1, got  # the pipelined poll is not answered
    finally:
        s.close()
    wait_for("the stream let go", lambda: metric(stack, "fastpoll_streams") == 0, 5)
    for _ in range(5):
        with socket.create_connection(("127.0.0.1", stack.poller_ports[0]), timeout=5) as c:
            c.sendall(f"GET {target} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
            answer = b""
            while chunk := c.recv(65536):
                answer += chunk
            assert answer.startswith(b"HTTP/1.1 200 ") and b'"after"' in answer, answer
