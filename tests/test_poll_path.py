"""The request path end to end, through nginx, on both backends (the `stack` fixture is per
backend)."""

from __future__ import annotations

import hashlib
import os

import httpx
import pytest

from fastpoll_testkit.helpers import Cache, new_uid, poll_key


def poll(client: httpx.Client, uid: int, method: str = "GET", **kw) -> httpx.Response:
    return client.request(method, f"/Poll/getMessages?user_id={uid}", **kw)


def test_hit_is_served_from_cache(client: httpx.Client, cache: Cache) -> None:
    uid = new_uid()
    cache.set(poll_key(uid), b'{"unread":1}')
    r = poll(client, uid)
    assert r.status_code == 200
    assert r.content == b'{"unread":1}'
    assert r.headers["x-poll-source"] == "cache"
    assert r.headers["content-type"] == "application/json"
    assert r.headers["content-length"] == str(len(b'{"unread":1}'))


def test_miss_falls_back_and_fills_the_cache(
    client: httpx.Client, cache: Cache
) -> None:
    uid = new_uid()
    first = poll(client, uid)
    assert first.status_code == 200
    assert first.headers["x-poll-source"] == "app"
    assert cache.get(poll_key(uid)) == first.content  # the app filled it
    second = poll(client, uid)
    assert second.status_code == 200
    assert second.headers["x-poll-source"] == "cache"
    assert second.content == first.content  # byte for byte


def test_post_body_reaches_the_fallback_intact(client: httpx.Client) -> None:
    body = os.urandom(20000) + b"\x00\r\n\r\nend"
    r = poll(client, new_uid(), "POST", content=body)
    assert r.status_code == 200
    assert r.headers["x-poll-source"] == "app"
    assert r.headers["x-request-body-length"] == str(len(body))
    assert r.headers["x-request-body-sha256"] == hashlib.sha256(body).hexdigest()


def test_post_hit_is_served_from_cache(client: httpx.Client, cache: Cache) -> None:
    uid = new_uid()
    cache.set(poll_key(uid), b"posted")
    r = poll(client, uid, "POST", content=b"a=1&b=2")
    assert (r.status_code, r.content, r.headers["x-poll-source"]) == (
        200,
        b"posted",
        "cache",
    )


def test_keys_are_per_user(client: httpx.Client, cache: Cache) -> None:
    a, b = new_uid(), new_uid()
    cache.set(poll_key(a), b"for a")
    cache.set(poll_key(b), b"for b")
    assert poll(client, a).content == b"for a"
    assert poll(client, b).content == b"for b"


def test_cache_buster_is_ignored(client: httpx.Client, cache: Cache) -> None:
    uid = new_uid()
    cache.set(poll_key(uid), b"same key")
    for buster in ("_=1699999", "_=1700000&x=y"):
        r = client.get(f"/Poll/getMessages?user_id={uid}&{buster}")
        assert (r.content, r.headers["x-poll-source"]) == (b"same key", "cache")


def test_empty_value_is_a_hit(client: httpx.Client, cache: Cache) -> None:
    uid = new_uid()
    cache.set(poll_key(uid), b"")
    r = poll(client, uid)
    assert (r.status_code, r.content, r.headers["x-poll-source"]) == (200, b"", "cache")
    assert r.headers["content-length"] == "0"


def test_binary_value_with_nul_bytes(client: httpx.Client, cache: Cache) -> None:
    uid = new_uid()
    value = b"\x00start\x00\xff\xfe middle \r\nEND\r\n\x00"
    cache.set(poll_key(uid), value)
    r = poll(client, uid)
    assert (r.status_code, r.content) == (200, value)
    assert r.headers["content-length"] == str(len(value))


def test_head_has_headers_and_no_body(client: httpx.Client, cache: Cache) -> None:
    uid = new_uid()
    cache.set(poll_key(uid), b"12345")
    r = poll(client, uid, "HEAD")
    assert r.status_code == 200
    assert r.content == b""
    assert r.headers["content-length"] == "5"
    assert r.headers["x-poll-source"] == "cache"


@pytest.mark.parametrize("method", ["PUT", "DELETE", "PATCH", "OPTIONS"])
def test_other_methods_get_405(
    client: httpx.Client, poller: httpx.Client, method: str
) -> None:
    direct = poller.request(method, "/getMessages?user_id=1")
    assert direct.status_code == 405
    assert set(direct.headers["allow"].replace(" ", "").split(",")) == {
        "GET",
        "HEAD",
        "POST",
    }
    assert client.request(method, "/Poll/getMessages?user_id=1").status_code == 405


def test_direct_miss_is_an_empty_404(poller: httpx.Client) -> None:
    r = poller.get(f"/getMessages?user_id={new_uid()}")
    assert (r.status_code, r.content) == (404, b"")


def test_publish_then_read(stack, client: httpx.Client) -> None:
    uid = new_uid()
    assert poll(client, uid).content == b""  # nothing yet; now cached as empty
    assert poll(client, uid).headers["x-poll-source"] == "cache"
    with stack.api() as api:  # the site's backend, on the app's own listener
        r = api.post("/api/messages", json={"user_id": uid, "text": "hi"})
        assert r.status_code == 201
        msg = r.json()
        seen = poll(client, uid)
        assert seen.headers["x-poll-source"] == "cache"  # the publish rewrote the key
        one = {"id": msg["id"], "text": "hi"}
        assert seen.json() == {"unread": 1, "newest": one, "messages": [one]}
        second = api.post("/api/messages", json={"user_id": uid, "text": "second"})
        assert poll(client, uid).json()["unread"] == 2
        r = api.post(
            "/api/messages/read",
            json={"user_id": uid, "up_to_id": second.json()["id"]},
        )
        assert r.status_code == 200
    after = poll(client, uid)
    assert (after.status_code, after.content, after.headers["x-poll-source"]) == (
        200,
        b"",
        "cache",
    )


@pytest.mark.parametrize(
    "body",
    [
        b"{not json",
        b'{"user_id": 1}',
        b'{"text": "x"}',
        b'{"user_id": "1", "text": "x"}',
        b'{"user_id": true, "text": "x"}',
        b'{"user_id": 1, "text": ""}',
        b"[]",
    ],
)
def test_bad_publish_is_rejected_and_stores_nothing(
    stack, client: httpx.Client, body: bytes
) -> None:
    uid = new_uid()
    body = body.replace(b'"user_id": 1', f'"user_id": {uid}'.encode())
    with stack.api() as api:
        r = api.post(
            "/api/messages", content=body, headers={"Content-Type": "application/json"}
        )
    assert 400 <= r.status_code < 500
    assert "error" in r.json()
    assert poll(client, uid).content == b""


def test_oversized_publish_is_rejected(stack, client: httpx.Client) -> None:
    uid = new_uid()
    body = b'{"user_id": %d, "text": "%s"}' % (uid, b"x" * 200_000)
    with stack.api() as api:
        r = api.post(
            "/api/messages", content=body, headers={"Content-Type": "application/json"}
        )
    assert r.status_code == 413
    assert poll(client, uid).content == b""


def test_app_answers_are_not_held_back_by_nagle(stack, client: httpx.Client) -> None:
    """The app sends a response's head and body in two writes: without TCP_NODELAY on its
    accepted sockets, the body of every keep-alive answer waited ~40 ms for the peer's delayed
    ACK of the head (nginx's fallback connections are keep-alive). That wait is deterministic,
    so a median far below it shows it is gone; the app's own work here takes about 1 ms."""
    import statistics
    import time

    uid = new_uid()
    with stack.api() as api:
        r = api.post("/api/messages", json={"user_id": uid, "text": "hi"})
        assert r.status_code == 201
    target = stack.sign(f"/Poll/getMessages?user_id={uid}")
    took = []
    with httpx.Client(base_url=f"http://127.0.0.1:{stack.app_port}") as app:
        for _ in range(15):
            start = time.perf_counter()
            r = app.get(target)
            took.append(time.perf_counter() - start)
            assert r.status_code == 200 and r.json()["unread"] == 1
    assert statistics.median(took[1:]) < 0.030, [round(t * 1000, 1) for t in took]


def test_big_client_headers_do_not_reach_the_poller(
    client: httpx.Client, cache: Cache
) -> None:
    """nginx sends the pollers the request line only: a client whose cookies and headers add up
    to more than the poller's max_header_size (8 KiB) still gets its hit from the cache (the
    poller would answer 431), and a miss still reaches the app with every header."""
    uid = new_uid()
    cache.set(poll_key(uid), b'{"n":1}')
    big = {f"X-Pad-{i}": "v" * 2500 for i in range(3)} | {"Cookie": "s=" + "c" * 2000}
    r = poll(client, uid, headers=big)
    assert (r.status_code, r.content, r.headers["x-poll-source"]) == (
        200,
        b'{"n":1}',
        "cache",
    )
    miss = poll(client, new_uid(), headers=big)
    assert (miss.status_code, miss.headers["x-poll-source"]) == (200, "app")


def test_the_client_module_is_served_but_not_the_package_tree(client: httpx.Client) -> None:
    """/fastpoll-client/ serves the browser module and its demo, not the npm package's
    development files (node_modules/ after npm ci, check/)."""
    assert client.get("/fastpoll-client/fastpoll.js").status_code == 200
    assert client.get("/fastpoll-client/demo.html").status_code == 200
    assert client.get("/fastpoll-client/check/usage.ts").status_code == 404
    assert client.get("/fastpoll-client/node_modules/.package-lock.json").status_code == 404
