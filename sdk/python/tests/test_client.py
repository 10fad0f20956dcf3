"""fastpoll_client against a real stack (fastpoll_testkit's Stack: nginx, a poll server,
memcached, the app on SQLite): what the SDK writes, polls through nginx with the URL the SDK
got, show; its errors are the app's; a real 503 (the user's order held) is retried."""

from __future__ import annotations

import fcntl
import json
import logging
import os
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest

from fastpoll_client import (
    BadRequest,
    BatchItem,
    Client,
    Conflict,
    Unauthorized,
    Unavailable,
)
from fastpoll_testkit.helpers import new_uid
from fastpoll_testkit.stack import Stack


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    # One app worker: the user's order is waited for in that process (docs/api.md, 503).
    s = Stack(
        run_dir=tmp_path_factory.mktemp("sdk-stack"), n_pollers=1, app_workers=1, announce=False
    )
    s.start()
    yield s
    s.stop()


@pytest.fixture
def fp(stack: Stack) -> Iterator[Client]:
    with Client(stack.app_url(), stack.api_token, public_url=stack.base_url) as c:
        yield c


def poll(url: str) -> dict[str, object] | None:
    """The poll answer through nginx (None: nothing unread)."""
    r = httpx.get(url, timeout=10)
    assert r.status_code == 200, (r.status_code, r.text)
    return json.loads(r.content) if r.content else None


def test_publish_then_poll_through_nginx(fp: Client) -> None:
    uid = new_uid()
    url = fp.poll_url(uid)
    assert url.startswith("http://") and "&sig=" in url
    assert poll(url) is None
    msg = fp.publish(uid, "hi ☃")
    assert (msg.user_id, msg.text, msg.read, msg.replayed) == (uid, "hi ☃", False, False)
    assert msg.cache_publish == "ok"
    one = {"id": msg.id, "text": "hi ☃"}
    assert poll(url) == {"unread": 1, "newest": one, "messages": [one]}
    info = fp.poll_url_info(uid)
    assert info.expires is not None and info.expires > time.time()


def test_mark_read(fp: Client) -> None:
    uid = new_uid()
    first = fp.publish(uid, "one")
    second = fp.publish(uid, "two")
    done = fp.mark_read(uid, up_to_id=first.id)
    assert (done.user_id, done.marked_read, done.cache_publish) == (uid, 1, "ok")
    two = {"id": second.id, "text": "two"}
    assert poll(fp.poll_url(uid)) == {"unread": 1, "newest": two, "messages": [two]}
    assert fp.mark_read(uid, up_to_id=second.id).marked_read == 1
    assert poll(fp.poll_url(uid)) is None


def test_batch(fp: Client) -> None:
    uid, room = new_uid(), f"room.b{uuid.uuid4().hex[:8]}"
    ids = fp.publish_batch(
        [
            BatchItem("b1", user_id=uid),
            BatchItem("to the room", channel=room),
            {"user_id": uid, "text": "b3"},
        ]
    )
    assert len(ids) == 3 and ids == sorted(ids)
    b1, b3 = {"id": ids[0], "text": "b1"}, {"id": ids[2], "text": "b3"}
    assert poll(fp.poll_url(uid)) == {"unread": 2, "newest": b3, "messages": [b1, b3]}
    answer = poll(fp.poll_url(uid, channels=[room]))
    assert answer is not None and "to the room" in json.dumps(answer["channels"])
    with pytest.raises(ValueError):
        fp.publish_batch([BatchItem("x", user_id=uid, channel=room)])
    with pytest.raises(BadRequest, match="exactly one of user_id and channel"):
        fp.publish_batch([{"user_id": uid, "channel": room, "text": "x"}])


def test_channel(fp: Client) -> None:
    uid, room = new_uid(), f"room.c{uuid.uuid4().hex[:8]}"
    url = fp.poll_url(uid, channels=[room])
    assert f"ch={room}" in url
    msg = fp.publish_channel(room, "hello room")
    assert (msg.channel, msg.text, msg.cache_publish) == (room, "hello room", "ok")
    answer = poll(url)
    assert answer is not None and answer["user"] is None
    assert isinstance(answer["channels"], dict) and str(msg.id) in json.dumps(answer["channels"])
    assert "hello room" in json.dumps(answer["channels"])
    with pytest.raises(BadRequest, match="channel name"):
        fp.publish_channel("bad name!", "x")


def test_data_travels_with_every_publish(fp: Client) -> None:
    """docs/api.md, "Data": a JSON value beside or instead of the text, in the typed results
    and in the poll answers through nginx."""
    uid, room = new_uid(), f"room.d{uuid.uuid4().hex[:8]}"
    data = {"order": 991, "tags": ["parcel", "☃"], "paid": True}
    both = fp.publish(uid, "shipped", data=data)
    only = fp.publish(uid, data=[1, 2], idempotency_key=f"d-{uid}")
    assert (both.text, both.data, only.text, only.data) == ("shipped", data, "", [1, 2])
    assert fp.publish(uid, data=[1, 2], idempotency_key=f"d-{uid}").replayed
    with pytest.raises(Conflict):
        fp.publish(uid, data=[1, 3], idempotency_key=f"d-{uid}")
    plain = fp.publish(uid, "plain")
    assert plain.data is None
    ids = fp.publish_batch([BatchItem(user_id=uid, data={"b": 1}), BatchItem("t", channel=room)])
    listed = [
        {"id": both.id, "text": "shipped", "data": data},
        {"id": only.id, "text": "", "data": [1, 2]},
        {"id": plain.id, "text": "plain"},
        {"id": ids[0], "text": "", "data": {"b": 1}},
    ]
    answer = poll(fp.poll_url(uid, channels=[room]))
    assert answer is not None and answer["user"] == {
        "unread": 4,
        "newest": listed[-1],
        "messages": listed,
    }
    msg = fp.publish_channel(room, data={"k": [None]})
    assert (msg.text, msg.data) == ("", {"k": [None]})
    answer = poll(fp.poll_url(uid, channels=[room]))
    assert answer is not None and answer["channels"] == {
        room: {
            "messages": [
                {"id": ids[1], "text": "t"},
                {"id": msg.id, "text": "", "data": {"k": [None]}},
            ]
        }
    }
    with pytest.raises(ValueError, match="text, data or both"):
        fp.publish(uid)
    with pytest.raises(BadRequest, match="data: "):
        fp.publish(uid, data="x" * 9000)


def test_idempotent_retry_stores_one_message(fp: Client) -> None:
    uid = new_uid()
    first = fp.publish(uid, "once", idempotency_key="k-1")
    again = fp.publish(uid, "once", idempotency_key="k-1")
    assert again.id == first.id and again.replayed and again.cache_publish is None
    once = {"id": first.id, "text": "once"}
    assert poll(fp.poll_url(uid)) == {"unread": 1, "newest": once, "messages": [once]}
    with pytest.raises(Conflict) as exc:
        fp.publish(uid, "another text", idempotency_key="k-1")
    assert exc.value.status == 409
    # Without a key given, each call has its own: two calls, two messages.
    assert fp.publish(uid, "twice").id != fp.publish(uid, "twice").id


def test_errors_carry_the_apps_answer(stack: Stack, fp: Client) -> None:
    with Client(stack.app_url(), "not-the-token") as bad, pytest.raises(Unauthorized) as exc:
        bad.publish(new_uid(), "x")
    assert exc.value.status == 401 and "bearer token" in exc.value.message
    with pytest.raises(BadRequest) as bad_request:
        fp.publish(new_uid(), "   ")
    assert bad_request.value.status == 400
    assert bad_request.value.message == "text: Value error, must not be only whitespace"
    with pytest.raises(BadRequest, match="2000"):
        fp.publish(new_uid(), "x" * 2001)


@contextmanager
def order_taken(stack: Stack, uid: int, release_after: float | None = None) -> Iterator[None]:
    """The user's order held, as a write stuck on a hung cache node holds it: the user's byte
    of the SQLite store's lock file taken here, and one publish of the user waiting for it in
    the app (holding the user's place in the process), so the next write of the user is 503
    after 3 s. The order is let go `release_after` seconds from the start, or at the end."""
    fd = os.open(str(stack.run_dir / "fastpoll.db.locks"), os.O_RDWR)
    fcntl.lockf(fd, fcntl.LOCK_EX, 1, uid % 1024)
    answers: list[int] = []

    def stuck() -> None:
        with stack.api(timeout=30) as api:
            r = api.post("/api/messages", json={"user_id": uid, "text": "first"})
            answers.append(r.status_code)

    def release() -> None:
        fcntl.lockf(fd, fcntl.LOCK_UN, 1, uid % 1024)

    blocker = threading.Thread(target=stuck)
    blocker.start()
    timer = threading.Timer(release_after or 0, release)
    try:
        time.sleep(0.5)  # it reached the app and waits there
        assert not answers
        if release_after is not None:
            timer.start()
        yield
    finally:
        timer.cancel()
        release()
        blocker.join(30)
        os.close(fd)
        assert answers == [201]


def test_a_503_is_retried(stack: Stack, fp: Client, caplog: pytest.LogCaptureFixture) -> None:
    uid = new_uid()
    caplog.set_level(logging.INFO, logger="fastpoll_client")
    started = time.monotonic()
    # Let go 3.5 s from the publish: after its first attempt's 503 (at 3 s), before its retry
    # (Retry-After: 1, waited 1-1.25 s with the jitter).
    with order_taken(stack, uid, release_after=3.5):
        msg = fp.publish(uid, "after a 503")
    took = time.monotonic() - started
    assert msg.text == "after a 503" and not msg.replayed
    retries = [r.getMessage() for r in caplog.records if "503" in r.getMessage()]
    assert len(retries) == 1 and "busy" in retries[0], retries
    assert 3.9 < took < 8, took
    answer = poll(fp.poll_url(uid))
    newest = {"id": msg.id, "text": "after a 503"}
    assert answer is not None and answer["unread"] == 2 and answer["newest"] == newest
    assert isinstance(answer["messages"], list) and answer["messages"][-1] == newest


def test_unavailable_after_the_retries(stack: Stack) -> None:
    uid = new_uid()
    with (
        Client(stack.app_url(), stack.api_token, retries=0) as once,
        order_taken(stack, uid),
        pytest.raises(Unavailable) as exc,
    ):
        once.publish(uid, "refused")
    assert exc.value.status == 503 and exc.value.retry_after == 1.0
    assert "busy" in exc.value.message


def test_no_connection_is_unavailable() -> None:
    with Client("http://127.0.0.1:9", "t", retries=1, backoff=0.01) as nobody:
        with pytest.raises(Unavailable) as exc:
            nobody.publish(1, "x")
        assert exc.value.status is None
        with pytest.raises(Unavailable):
            nobody.publish_batch([BatchItem("x", user_id=1)])
