"""The app alone, against a temp SQLite and a real memcached / redis-server."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Iterator

import pytest
from starlette.testclient import TestClient

from fastpoll_app import config
from fastpoll_app.app import create_app
from fastpoll_app.config import KeySettings
from fastpoll_app.service import FastPoll

KEY42 = b"/Poll/getMessages?user_id=42"


def fp_of(client: TestClient) -> FastPoll:
    return client.app.state.fastpoll  # type: ignore[attr-defined]


def cached(client: TestClient, key: bytes = KEY42) -> bytes | None:
    return fp_of(client)._fill.get(key)


def test_poll_miss_answers_empty_and_fills(client: TestClient) -> None:
    r = client.get("/Poll/getMessages?user_id=42")
    assert r.status_code == 200
    assert r.content == b""
    assert r.headers["content-type"] == "application/json"
    assert r.headers["x-poll-source"] == "app"
    assert r.headers["content-length"] == "0"
    assert cached(client) == b""


def test_publish_then_poll_then_read(client: TestClient) -> None:
    client.get("/Poll/getMessages?user_id=42")  # fill the empty answer first
    r = client.post("/api/messages", json={"user_id": 42, "text": "hi ☃"})
    assert r.status_code == 201
    msg = r.json()
    assert msg["user_id"] == 42 and msg["text"] == "hi ☃" and msg["read"] is False
    assert r.headers["x-cache-publish"] == "ok"
    one = {"id": msg["id"], "text": "hi ☃"}
    want = json.dumps(
        {"unread": 1, "newest": one, "messages": [one]},
        separators=(",", ":"),
        ensure_ascii=False,
    ).encode()
    assert cached(client) == want  # publish overwrote the filled empty value
    assert client.get("/Poll/getMessages?user_id=42").content == want
    r2 = client.post("/api/messages", json={"user_id": 42, "text": "second"})
    i1, i2 = msg["id"], r2.json()["id"]
    assert cached(client) == (
        f'{{"unread":2,"newest":{{"id":{i2},"text":"second"}},'
        f'"messages":[{{"id":{i1},"text":"hi ☃"}},{{"id":{i2},"text":"second"}}]}}'
    ).encode()

    r = client.post("/api/messages/read", json={"user_id": 42, "up_to_id": r2.json()["id"]})
    assert r.status_code == 200
    assert r.json() == {"user_id": 42, "marked_read": 2}
    assert cached(client) == b""
    assert client.get("/Poll/getMessages?user_id=42").content == b""


def _bounded(settings: config.Settings, listed: int) -> config.Settings:
    return dataclasses.replace(
        settings, app=dataclasses.replace(settings.app, answer_messages=listed)
    )


def test_the_answer_lists_the_newest_unread_messages_in_order(
    settings: config.Settings,
) -> None:
    """Three publishes: all three listed, ascending; with [app] answer_messages = 2 the two
    newest, and "before" names the one left out. The batch path writes the same answer."""
    with TestClient(create_app(settings)) as c:
        ids = [c.post("/api/messages", json={"user_id": 42, "text": t}).json()["id"] for t in "abc"]
        doc = json.loads(c.get("/Poll/getMessages?user_id=42").content)
        assert doc["messages"] == [{"id": i, "text": t} for i, t in zip(ids, "abc", strict=True)]
        assert doc["unread"] == 3 and doc["newest"] == doc["messages"][-1] and "before" not in doc
    with TestClient(create_app(_bounded(settings, 2))) as c:
        assert json.loads(c.get("/Poll/getMessages?user_id=42").content) == {
            "unread": 3,
            "newest": {"id": ids[2], "text": "c"},
            "messages": [{"id": ids[1], "text": "b"}, {"id": ids[2], "text": "c"}],
            "before": ids[0],
        }
        r = c.post("/api/messages/batch", json={"items": [{"user_id": 42, "text": "d"}]})
        d = r.json()["ids"][0]
        want = {
            "unread": 4,
            "newest": {"id": d, "text": "d"},
            "messages": [{"id": ids[2], "text": "c"}, {"id": d, "text": "d"}],
            "before": ids[1],
        }
        assert json.loads(cached(c) or b"") == want  # the batch's cache write
        assert json.loads(c.get("/Poll/getMessages?user_id=42").content) == want
        # Read up to the second: two unread, both listed, no "before".
        c.post("/api/messages/read", json={"user_id": 42, "up_to_id": ids[1]})
        doc = json.loads(cached(c) or b"")
        assert [m["id"] for m in doc["messages"]] == [ids[2], d] and "before" not in doc


def test_answers_are_per_user(client: TestClient) -> None:
    client.post("/api/messages", json={"user_id": 1, "text": "for one"})
    assert b"for one" in client.get("/Poll/getMessages?user_id=1").content
    assert client.get("/Poll/getMessages?user_id=2").content == b""
    assert cached(client, b"/Poll/getMessages?user_id=2") == b""


def test_fill_never_overwrites(client: TestClient) -> None:
    fp_of(client)._fill.put(KEY42, b"already there", 0)
    r = client.get("/Poll/getMessages?user_id=42")
    assert r.content == b""  # the app answers from SQLite ...
    assert cached(client) == b"already there"  # ... and its add did not overwrite


def test_cache_buster_and_escapes_fill_the_canonical_key(client: TestClient) -> None:
    client.get("/Poll/get%4Dessages?_=123&user%5Fid=42")
    assert cached(client) == b""


def test_non_canonical_key_is_answered_not_filled(client: TestClient) -> None:
    client.post("/api/messages", json={"user_id": 7, "text": "x"})
    r = client.get("/Poll/getMessages?user_id=007")
    assert r.status_code == 200 and b'"unread":1' in r.content
    assert cached(client, b"/Poll/getMessages?user_id=007") is None


@pytest.fixture
def channel_client(settings: config.Settings) -> Iterator[TestClient]:
    s = dataclasses.replace(settings, keys=KeySettings(b"/Poll", (b"channel", b"user_id")))
    with TestClient(create_app(s)) as c:
        yield c


def test_extra_keyed_params_are_answered_not_filled(channel_client: TestClient) -> None:
    c = channel_client
    for query, key in [
        ("user_id=5&channel=news", b"/Poll/getMessages?channel=news&user_id=5"),
        ("user_id=5&channel=%0A", None),  # invalid key: never sent to a cache
    ]:
        r = c.get("/Poll/getMessages?" + query)
        assert r.status_code == 200 and r.content == b""
        if key is not None:
            assert cached(c, key) is None
    assert cached(c, b"/Poll/getMessages?user_id=5") is None
    c.get("/Poll/getMessages?user_id=5")
    assert cached(c, b"/Poll/getMessages?user_id=5") == b""


def test_head(client: TestClient) -> None:
    client.post("/api/messages", json={"user_id": 42, "text": "hello"})
    get = client.get("/Poll/getMessages?user_id=42")
    r = client.head("/Poll/getMessages?user_id=42")
    assert r.status_code == 200
    assert r.content == b""
    assert r.headers["content-length"] == str(len(get.content))
    assert r.headers["x-poll-source"] == "app"


def test_post_poll_reports_body(client: TestClient) -> None:
    body = b"a=1&b=\x00\xff" * 100
    r = client.post("/Poll/getMessages?user_id=42", content=body)
    assert r.status_code == 200
    assert r.headers["x-request-body-length"] == str(len(body))
    assert r.headers["x-request-body-sha256"] == hashlib.sha256(body).hexdigest()
    assert cached(client) == b""


def test_post_poll_too_large(client: TestClient) -> None:
    r = client.post("/Poll/getMessages?user_id=42", content=b"x" * 65537)
    assert r.status_code == 413
    assert "error" in r.json()


@pytest.mark.parametrize(
    "query",
    ["", "user_id=", "user_id=-1", "user_id=abc", "user_id=1&user_id=2", "user_id=+1",
     "user_id=99999999999999999999", "user_id=1.0"],
)  # fmt: skip
def test_poll_bad_user_id(client: TestClient, query: str) -> None:
    r = client.get("/Poll/getMessages?" + query)
    assert r.status_code == 400
    assert "user_id" in r.json()["error"]


def test_unknown_routes_and_methods_are_json(client: TestClient) -> None:
    r = client.get("/Poll/other?user_id=1")
    assert r.status_code == 404 and r.json() == {"error": "Not Found"}
    r = client.delete("/Poll/getMessages?user_id=1")
    assert r.status_code == 405 and "error" in r.json()
    r = client.get("/api/messages")
    assert r.status_code == 405


def test_no_slash_redirect_before_the_signature_check(client: TestClient) -> None:
    """Starlette's redirect_slashes answered /Poll/getMessages/ with a 307 to the request's
    Host, before any signature check; a path that is not a route is 404."""
    r = client.get(
        "/Poll/getMessages/?user_id=1", headers={"host": "evil.example"}, follow_redirects=False
    )
    assert r.status_code == 404 and "location" not in r.headers


def test_healthz(client: TestClient) -> None:
    r = client.get("/healthz")
    assert r.status_code == 200 and r.json()["status"] == "ok"
    assert r.json()["config_sha256"] == fp_of(client).settings.sha256


@pytest.mark.parametrize(
    ("body", "status"),
    [
        (b"{", 400),
        (b"[]", 400),
        (b'"x"', 400),
        (b"\xff\xfe", 400),
        (b"{}", 400),
        (b'{"user_id": 1}', 400),
        (b'{"text": "x"}', 400),
        (b'{"user_id": true, "text": "x"}', 400),
        (b'{"user_id": "1", "text": "x"}', 400),
        (b'{"user_id": 1.0, "text": "x"}', 400),
        (b'{"user_id": -1, "text": "x"}', 400),
        (b'{"user_id": 9223372036854775808, "text": "x"}', 400),
        (b'{"user_id": 1, "text": ""}', 400),
        (b'{"user_id": 1, "text": "   "}', 400),
        (b'{"user_id": 1, "text": 5}', 400),
        (b'{"user_id": 1, "text": null}', 400),
        (b'{"user_id": 1, "text": "\\ud800"}', 400),
        (b'{"user_id": 1, "text": "a\\u0000b"}', 400),  # NUL: PostgreSQL's text cannot hold it
        (b'{"user_id": 1, "text": "x", "extra": 1}', 400),
        (b'{"user_id": 1, "text": "' + b"x" * 2001 + b'"}', 400),
        (b'{"user_id": 1, "text": "' + b"x" * 70000 + b'"}', 413),
    ],
)
def test_publish_validation_stores_nothing(client: TestClient, body: bytes, status: int) -> None:
    r = client.post("/api/messages", content=body, headers={"content-type": "application/json"})
    assert r.status_code == status, r.text
    assert isinstance(r.json()["error"], str)
    assert fp_of(client).store.get_message(1) is None
    assert cached(client, b"/Poll/getMessages?user_id=1") is None


def test_publish_limits(client: TestClient) -> None:
    r = client.post("/api/messages", json={"user_id": 2**63 - 1, "text": "x" * 2000})
    assert r.status_code == 201


def test_content_length_checked_before_reading(client: TestClient) -> None:
    r = client.post(
        "/api/messages",
        content=b"{}",
        headers={"content-length": "999999999", "content-type": "application/json"},
    )
    assert r.status_code == 413


@pytest.mark.parametrize(
    "body",
    [
        b"{",
        b"{}",
        b'{"user_id": 1}',  # up_to_id is required
        b'{"user_id": false, "up_to_id": 9}',
        b'{"user_id": 1, "up_to_id": 9, "x": 2}',
        b'{"user_id": "1", "up_to_id": 9}',
        b'{"user_id": 1, "up_to_id": "9"}',
        b'{"user_id": 1, "up_to_id": -1}',
    ],
)
def test_read_validation(client: TestClient, body: bytes) -> None:
    client.post("/api/messages", json={"user_id": 1, "text": "keep"})
    r = client.post(
        "/api/messages/read", content=body, headers={"content-type": "application/json"}
    )
    assert r.status_code == 400
    assert b"keep" in client.get("/Poll/getMessages?user_id=1").content
