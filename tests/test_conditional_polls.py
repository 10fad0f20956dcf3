"""Conditional polls through nginx (docs/api.md, "Conditional and long polls"), on the real
stack: a fallback answer's ETag (XXH3-64 of the body) and pacing, a 304 from the app via nginx,
gzip keeping a usable (weak) ETag, and wait= polls taking @poll_held with the raw target.

The poll server's half (ETag and 304 on a hit, holding) comes later; these tests make the
app answer by deleting the user's key first (a miss)."""

from __future__ import annotations

import gzip
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import xxhash
from conftest import Cache, http_client, new_uid, poll_key, start_stack
from stack import Stack


@pytest.fixture(scope="module")
def gz_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """One poller, memcached, nginx with gzip on for answers of 20 bytes and more."""
    s = start_stack(
        tmp_path_factory.mktemp("conditional"),
        "memcached",
        n_pollers=1,
        nginx_vars={"fastpoll_gzip": True, "fastpoll_gzip_min_length": 20},
        extra_ini={"poll": {"fallback_interval_ms": "2000", "jitter_pct": "20"}},
    )
    yield s
    s.stop()


@pytest.fixture()
def client(gz_stack: Stack) -> Iterator[httpx.Client]:
    with http_client(gz_stack) as c:
        yield c


def tag_of(body: bytes) -> str:
    return '"' + xxhash.xxh3_64_hexdigest(body) + '"'


def publish(stack: Stack, uid: int, text: str) -> None:
    with stack.api() as api:
        r = api.post("/api/messages", json={"user_id": uid, "text": text})
        assert r.status_code == 201, r.text


def miss(cache: Cache, client: httpx.Client, uid: int, **headers: str) -> httpx.Response:
    """A poll the app answers: the user's key is deleted first."""
    cache.delete(poll_key(uid))
    r = client.get(f"/Poll/getMessages?user_id={uid}", headers=headers)
    assert r.headers["x-poll-source"] == "app", r.headers
    return r


def test_fallback_answer_has_the_etag_and_a_pace(gz_stack: Stack, client: httpx.Client) -> None:
    cache, uid = Cache(gz_stack), new_uid()
    r = miss(cache, client, uid, **{"Accept-Encoding": "identity"})
    assert r.status_code == 200 and r.content == b""
    assert r.headers["etag"] == tag_of(b"")
    assert 2000 <= int(r.headers["poll-interval-ms"]) <= 2400
    publish(gz_stack, uid, "hello")
    r = miss(cache, client, uid, **{"Accept-Encoding": "identity"})
    assert r.content.startswith(b'{"unread":1') and r.headers["etag"] == tag_of(r.content)


def test_304_from_the_app_through_nginx(gz_stack: Stack, client: httpx.Client) -> None:
    cache, uid = Cache(gz_stack), new_uid()
    publish(gz_stack, uid, "once")
    full = miss(cache, client, uid, **{"Accept-Encoding": "identity"})
    tag = full.headers["etag"]
    for inm in (tag, f'"other", {tag}', "*"):
        r = miss(cache, client, uid, **{"If-None-Match": inm})
        assert r.status_code == 304 and r.content == b"", inm
        assert r.headers["etag"] == tag and "poll-interval-ms" in r.headers
    r = miss(cache, client, uid, **{"If-None-Match": '"stale"'})
    assert r.status_code == 200 and r.content == full.content


def test_gzip_keeps_a_usable_etag(gz_stack: Stack, client: httpx.Client) -> None:
    cache, uid = Cache(gz_stack), new_uid()
    publish(gz_stack, uid, "a message long enough for gzip_min_length")
    r = miss(cache, client, uid, **{"Accept-Encoding": "gzip"})
    assert r.headers["content-encoding"] == "gzip"
    body = r.content  # httpx decodes it
    assert body.startswith(b'{"unread":1')
    # nginx 1.22's gzip filter turns the strong tag weak; the opaque part is unchanged.
    assert r.headers["etag"] == "W/" + tag_of(body)
    assert "Accept-Encoding" in r.headers.get("vary", "")
    for inm in (r.headers["etag"], tag_of(body)):
        again = miss(cache, client, uid, **{"Accept-Encoding": "gzip", "If-None-Match": inm})
        assert again.status_code == 304 and again.content == b"", inm
        assert again.headers["etag"] == tag_of(body)  # a 304 is not compressed: strong
    # Without gzip the same answer has the strong tag: one answer, one tag.
    plain = miss(cache, client, uid, **{"Accept-Encoding": "identity"})
    assert "content-encoding" not in plain.headers and plain.headers["etag"] == tag_of(body)
    assert gzip.compress(body)  # the body itself is what the tag hashes


def test_wait_polls_take_the_held_location_with_the_raw_target(
    gz_stack: Stack, client: httpx.Client
) -> None:
    cache, uid = Cache(gz_stack), new_uid()
    publish(gz_stack, uid, "held")
    first = miss(cache, client, uid)  # fills the key
    # A hit through @poll_held: the poller derived the key and checked the signature from
    # the raw target (a non-key parameter with an escape must not be normalised away).
    t0 = time.monotonic()
    r = client.get(f"/Poll/getMessages?user_id={uid}&_=%41b&wait=25")
    assert r.status_code == 200 and r.headers["x-poll-source"] == "cache"
    assert r.content == first.content and time.monotonic() - t0 < 5
    # A miss there falls back to the app, which answers at once (it never holds).
    cache.delete(poll_key(uid))
    r = client.get(f"/Poll/getMessages?user_id={uid}&wait=25")
    assert r.headers["x-poll-source"] == "app" and r.content == first.content
    cache.delete(poll_key(uid))
    r = client.get(f"/Poll/getMessages?user_id={uid}&wait=x")
    assert r.status_code == 400 and r.headers.get("x-poll-source") != "cache"


def test_the_rendered_config_routes_waits_and_passes_if_none_match(gz_stack: Stack) -> None:
    conf = (Path(gz_stack.run_dir) / "nginx" / "fastpoll.conf").read_text()
    assert conf.count("proxy_set_header If-None-Match $http_if_none_match;") == 2
    assert "proxy_read_timeout 40s;" in conf  # [poll] max_wait 30 + 10
    assert "error_page 418 = @poll_held;" in conf
