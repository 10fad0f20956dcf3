"""Conditional and long polls, the app's half (docs/api.md, "Conditional and long polls"):
ETag = XXH3-64 of the body, 304 on a weak If-None-Match match, `wait` checked and clamped,
Poll-Interval-Ms, and every write announced on Redis pub/sub (both backends)."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
import xxhash
from prometheus_client import REGISTRY
from starlette.testclient import TestClient

from fastpoll_app import announce, conditional
from fastpoll_app.app import create_app
from fastpoll_app.config import ConfigError, PollSettings
from fastpoll_testkit.procs import Server, free_port, start_memcached

from .conftest import make_settings

URL = "/Poll/getMessages?user_id=42"
CHANNEL = "fastpoll:announce"


@pytest.fixture
def plain(memcached: Server, tmp_path: Path) -> Iterator[TestClient]:
    """One app on SQLite and memcached: the HTTP rules do not depend on the backend."""
    text = (
        f"[memcached]\nservers = {memcached.addr}\n"
        "[poll]\ninterval_ms = 500\nfallback_interval_ms = 2000\njitter_pct = 10\nmax_wait = 25\n"
    )
    with TestClient(create_app(make_settings(tmp_path, text))) as c:
        yield c


def publish(c: TestClient, text: str = "hi ☃", uid: int = 42) -> dict[str, object]:
    r = c.post("/api/messages", json={"user_id": uid, "text": text})
    assert r.status_code == 201, r.text
    return r.json()  # type: ignore[no-any-return]


def etag(body: bytes) -> str:
    return '"' + xxhash.xxh3_64(body).hexdigest() + '"'


def test_etag_is_xxh3_64_of_the_body(plain: TestClient) -> None:
    r = plain.get(URL)
    assert r.content == b"" and r.headers["etag"] == '"2d06800538d394c2"' == etag(b"")
    publish(plain)
    r = plain.get(URL)
    assert r.content.startswith(b'{"unread":1')
    assert r.headers["etag"] == etag(r.content)
    assert len(r.headers["etag"]) == 18 and r.headers["etag"] == r.headers["etag"].lower()
    head = plain.head(URL)
    assert head.headers["etag"] == r.headers["etag"] and head.content == b""
    post = plain.post(URL, content=b"x", headers={"If-None-Match": r.headers["etag"]})
    assert post.status_code == 200 and post.content == r.content  # POST: never evaluated
    assert post.headers["etag"] == r.headers["etag"]


def _not_modified_count() -> float:
    return REGISTRY.get_sample_value("fastpoll_app_not_modified_total") or 0.0


def test_304_on_a_match_and_200_after_a_publish(plain: TestClient) -> None:
    tag = plain.get(URL).headers["etag"]
    before = _not_modified_count()
    r = plain.get(URL, headers={"If-None-Match": tag})
    assert r.status_code == 304 and r.content == b""
    assert r.headers["etag"] == tag and r.headers["x-poll-source"] == "app"
    assert "content-length" not in r.headers or r.headers["content-length"] == "0"
    assert 2000 <= int(r.headers["poll-interval-ms"]) <= 2200
    assert plain.head(URL, headers={"If-None-Match": tag}).status_code == 304
    assert _not_modified_count() == before + 2
    publish(plain)
    r = plain.get(URL, headers={"If-None-Match": tag})
    assert r.status_code == 200 and r.content.startswith(b'{"unread":1')
    assert r.headers["etag"] == etag(r.content) != tag


@pytest.mark.parametrize(
    "inm",
    [
        "W/{tag}",  # nginx's gzip makes the strong tag weak: weak comparison
        '"nope", {tag}',  # a list
        'W/"nope",W/{tag} ,',  # a list without spaces, an empty element
        "*",
        "  *  ",
    ],
)
def test_weak_list_and_star_match(plain: TestClient, inm: str) -> None:
    tag = plain.get(URL).headers["etag"]
    assert plain.get(URL, headers={"If-None-Match": inm.format(tag=tag)}).status_code == 304


def test_several_header_lines_form_one_list(plain: TestClient) -> None:
    tag = plain.get(URL).headers["etag"]
    headers = [("If-None-Match", '"a"'), ("If-None-Match", tag)]
    assert plain.get(URL, headers=headers).status_code == 304


@pytest.mark.parametrize(
    "inm",
    [
        '"nope"',
        "{bare}",  # no quotes: malformed, ignored
        "w/{tag}",  # the weak prefix is case-sensitive
        "W/ {tag}",
        '*, "x"',  # `*` only alone
        "{tag}x",
        '"a"b", {tag}',
        "{tag}" + ", " + '"' + "f" * 1020 + '"',  # over 1024 bytes: ignored
        "",
    ],
)
def test_no_match_malformed_or_huge_is_ignored(plain: TestClient, inm: str) -> None:
    tag = plain.get(URL).headers["etag"]
    value = inm.format(tag=tag, bare=tag.strip('"'))
    r = plain.get(URL, headers={"If-None-Match": value})
    assert r.status_code == 200 and r.headers["etag"] == tag


def test_if_none_match_unit() -> None:
    tag = conditional.etag_of(b"abc")
    assert conditional.not_modified([tag.encode()], tag)
    assert conditional.not_modified([b"W/" + tag.encode()], tag)
    assert not conditional.not_modified([b"\x00" + tag.encode()], tag)
    assert not conditional.not_modified([b'"' + b"\xff" * 2000 + b'"'], tag)
    assert conditional.not_modified([b'"\xff"', tag.encode()], tag)  # obs-text is an etagc
    assert not conditional.not_modified([], tag)


@pytest.mark.parametrize(
    ("query", "want"),
    [("", 0), ("&wait=0", 0), ("&wait=20", 20), ("&wait=25", 25), ("&wait=26", 25),
     ("&wait=999999", 25), ("&w%61it=abc", 0), ("&wait2=x&await=y", 0), ("&WAIT=7", 7),
     ("&Wait=000030", 25), ("&wait%3D5=x", 0), ("&x=wait&wait_=1", 0)],
)  # fmt: skip
def test_wait_is_clamped(query: str, want: int) -> None:
    s = PollSettings(max_wait=25)
    assert conditional.wait_seconds(f"user_id=1{query}".encode(), s) == want


@pytest.mark.parametrize(
    "query",
    ["wait=", "wait", "wait=-1", "wait=1.5", "wait=abc", "wait=1000000", "wait=1&wait=2",
     "wait=%31", "wait=+1", "wait=1&wait=%31", "WAIT=0&wait=30", "wait=0&WAIT", "Wait&wait=1",
     "wAiT=1&WaIt=1", "wait=1 ", "wait=%EF%BC%91", "wait=\uff11"],
)  # fmt: skip
def test_bad_wait_is_400(plain: TestClient, query: str) -> None:
    r = plain.get(f"{URL}&{query}")
    assert r.status_code == 400 and "wait" in r.json()["error"]


def test_wait_is_answered_at_once_and_paced(plain: TestClient) -> None:
    tag = plain.get(URL).headers["etag"]
    t0 = time.monotonic()
    r = plain.get(f"{URL}&wait=25", headers={"If-None-Match": tag})
    assert r.status_code == 304 and time.monotonic() - t0 < 1.0  # the app never holds
    assert 2000 <= int(r.headers["poll-interval-ms"]) <= 2200
    r = plain.get(f"{URL}&wait=9999")
    assert r.status_code == 200 and r.headers["etag"] == tag  # clamped, not part of the key


def test_pace_jitter_spreads() -> None:
    seen = {conditional.pace_ms(1000, 20) for _ in range(200)}
    assert min(seen) >= 1000 and max(seen) <= 1200 and len(seen) > 50
    assert conditional.pace_ms(1000, 0) == 1000


def test_poll_and_announce_config(tmp_path: Path) -> None:
    s = make_settings(tmp_path, "")
    assert s.poll == PollSettings() and s.announce.server is None
    assert s.announce.channel == CHANNEL
    s = make_settings(tmp_path, "[announce]\nserver = unix:/run/r.sock\nchannel = a:b\n")
    assert s.announce.server == "unix:/run/r.sock" and s.announce.channel == "a:b"
    for text, msg in [
        ("[poll]\nmax_wait = 301\n", "max_wait"),
        ("[poll]\njitter_pct = 101\n", "jitter_pct"),
        ("[poll]\ninterval_ms = -1\n", "interval_ms"),
        ("[announce]\nserver = nowhere\n", "server"),
        ("[announce]\nusername = u\n", "username"),
        ("[announce]\nchannel = a b\n", "channel"),
        ("[keys]\nparams = user_id wait\n", "wait is reserved"),
        ("[keys]\nparams = user_id WAIT\n", "wait is reserved"),
    ]:
        with pytest.raises(ConfigError, match=msg):
            make_settings(tmp_path, text)


# ---- announcements ---------------------------------------------------------------------


def _announced(r: str) -> float:
    return REGISTRY.get_sample_value("fastpoll_app_announcements_total", {"result": r}) or 0.0


def _subscriber(srv: Server) -> redis.client.PubSub:
    sub = redis.Redis(host="127.0.0.1", port=srv.port).pubsub(ignore_subscribe_messages=True)
    sub.subscribe(CHANNEL)
    assert sub.get_message(timeout=2) is None  # the subscribe confirmation, skipped
    return sub


def _next(sub: redis.client.PubSub) -> bytes | None:
    """The key of the next announcement, after checking its publish time is now's."""
    msg = sub.get_message(timeout=2)
    if msg is None:
        return None
    key, sep, ms = msg["data"].partition(b" ")
    assert sep and ms.isdigit() and abs(int(ms) - time.time() * 1000) < 5000, msg["data"]
    return key  # type: ignore[no-any-return]


def test_the_announcement_carries_the_publish_time() -> None:
    assert announce.message(b"/Poll/getMessages?user_id=42", 1795000000123) == (
        b"/Poll/getMessages?user_id=42 1795000000123"
    )


@pytest.mark.parametrize("name", ["memcached", "redis"])
def test_every_write_is_announced(
    name: str, memcached: Server, redis_server: Server, tmp_path: Path
) -> None:
    if name == "memcached":  # the cache is memcached; announcements go to [announce] server
        text = f"[memcached]\nservers = {memcached.addr}\n"
        text += f"[announce]\nserver = {redis_server.addr}\n"
    else:  # the cache's own Redis
        text = f"[cache]\nbackend = redis\n[redis]\nserver = {redis_server.addr}\n"
    sub = _subscriber(redis_server)
    try:
        with TestClient(create_app(make_settings(tmp_path, text))) as c:
            sent = _announced("sent")
            c.get(URL)  # a fill is not announced: nothing held can wait on a missing key
            msg = publish(c)
            assert _next(sub) == b"/Poll/getMessages?user_id=42"
            r = c.post("/api/messages/read", json={"user_id": 42, "up_to_id": msg["id"]})
            assert r.status_code == 200
            assert _next(sub) == b"/Poll/getMessages?user_id=42"
            publish(c, uid=7)
            assert _next(sub) == b"/Poll/getMessages?user_id=7"
            assert sub.get_message(timeout=0.2) is None
            assert _announced("sent") == sent + 3
    finally:
        sub.close()


def _silent_listener() -> socket.socket:
    """A port whose kernel accepts connections that nothing ever answers: a hung Redis."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(16)
    return s


def test_a_failed_announcement_does_not_fail_the_write(memcached: Server, tmp_path: Path) -> None:
    hung = _silent_listener()
    try:
        text = (
            f"[memcached]\nservers = {memcached.addr}\n"
            f"[announce]\nserver = 127.0.0.1:{hung.getsockname()[1]}\n"
        )
        with TestClient(create_app(make_settings(tmp_path, text))) as c:
            failed = _announced("failed")
            t0 = time.monotonic()
            r = c.post("/api/messages", json={"user_id": 42, "text": "still stored"})
            took = time.monotonic() - t0
            assert r.status_code == 201 and r.headers["x-cache-publish"] == "ok"
            assert took < 2.0  # bounded by the announce timeout, twice (one retry)
            assert _announced("failed") == failed + 1
            assert b"still stored" in c.get(URL).content
    finally:
        hung.close()
    # Nothing listening at all: refused at once.
    port = free_port()  # nothing listens there
    text = f"[memcached]\nservers = {memcached.addr}\n[announce]\nserver = 127.0.0.1:{port}\n"
    (tmp_path / "b").mkdir()
    with TestClient(create_app(make_settings(tmp_path / "b", text))) as c:
        failed = _announced("failed")
        assert c.post("/api/messages", json={"user_id": 5, "text": "x"}).status_code == 201
        assert _announced("failed") == failed + 1


def test_a_repaired_write_is_announced(redis_server: Server, tmp_path: Path) -> None:
    """A publish whose cache write failed is not announced (the cache still has the old
    answer); the repair that rewrites the key announces it."""
    mc = start_memcached()
    sub = _subscriber(redis_server)
    try:
        text = f"[memcached]\nservers = {mc.addr}\n[announce]\nserver = {redis_server.addr}\n"
        with TestClient(create_app(make_settings(tmp_path, text))) as c:
            mc.stop()
            r = c.post("/api/messages", json={"user_id": 42, "text": "pending"})
            assert r.status_code == 201 and r.headers["x-cache-publish"] == "pending"
            assert sub.get_message(timeout=0.3) is None
            mc.start()
            fp = c.app.state.fastpoll  # type: ignore[attr-defined]
            deadline = time.monotonic() + 10
            while fp.repair(42) != "rewritten" and time.monotonic() < deadline:
                time.sleep(0.1)
            assert _next(sub) == b"/Poll/getMessages?user_id=42"
    finally:
        sub.close()
        mc.stop()
