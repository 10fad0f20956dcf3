"""Conditional polls through nginx (docs/api.md, "Conditional and long polls"), on the real
stack: a fallback answer's ETag (XXH3-64 of the body) and pacing, a 304 from the app via nginx,
gzip keeping a usable (weak) ETag, and wait= polls taking @poll_held with the raw target
(these make the app answer by deleting the user's key first: a miss).

Then the poll server's half, on both backends: ETag, pace and 304 on a hit, bad
If-None-Match and wait= values, long polls answered within a second of a publish through the
app's API (the announcement), by the re-check when a write is not announced, at the end of
their wait, and a few thousand held clients that all disconnect at once (FP_HELD_CLIENTS: the
documented longer run uses 15,000)."""

from __future__ import annotations

import gzip
import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis
import xxhash

from fastpoll_testkit.helpers import Cache, http_client, new_uid, poll_key, start_stack
from fastpoll_testkit.helpers import poller_metric as metric
from fastpoll_testkit.procs import free_port
from fastpoll_testkit.stack import Stack


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


def pace(r: httpx.Response) -> int:
    return int(r.headers["poll-interval-ms"])


def test_fallback_answer_has_the_etag_and_a_pace(gz_stack: Stack, client: httpx.Client) -> None:
    cache, uid = Cache(gz_stack), new_uid()
    r = miss(cache, client, uid, **{"Accept-Encoding": "identity"})
    assert r.status_code == 200 and r.content == b""
    assert r.headers["etag"] == tag_of(b"")
    assert 1000 <= pace(r) <= 1200  # a miss the app filled: the pace of a hit
    publish(gz_stack, uid, "hello")
    r = miss(cache, client, uid, **{"Accept-Encoding": "identity"})
    assert r.content.startswith(b'{"unread":1') and r.headers["etag"] == tag_of(r.content)


def test_a_filled_miss_is_paced_as_a_hit(gz_stack: Stack, client: httpx.Client) -> None:
    """The first poll of a fresh user is a miss the app fills: paced as the poll server paces a
    hit ([poll] interval_ms 1000 here, not fallback_interval_ms 2000), and a long poll's as a
    long poll's hit (0 plus the jitter), so its next poll, with the tag, is held at once."""
    uid = new_uid()
    first = client.get(f"/Poll/getMessages?user_id={uid}")
    assert first.headers["x-poll-source"] == "app" and 1000 <= pace(first) <= 1200
    hit = client.get(f"/Poll/getMessages?user_id={uid}")
    assert hit.headers["x-poll-source"] == "cache" and 1000 <= pace(hit) <= 1200
    uid = new_uid()
    first = client.get(f"/Poll/getMessages?user_id={uid}&wait=5")
    assert first.status_code == 200 and first.headers["x-poll-source"] == "app"
    assert pace(first) <= 200, first.headers
    # The next poll is held on the poll server and answered by a publish, not by its wait.
    answers: list[httpx.Response] = []
    held = threading.Thread(
        target=lambda: answers.append(
            client.get(
                f"/Poll/getMessages?user_id={uid}&wait=5",
                headers={"If-None-Match": first.headers["etag"]},
            )
        )
    )
    t0 = time.monotonic()
    held.start()
    time.sleep(0.5)
    publish(gz_stack, uid, "soon")
    held.join(10)
    assert answers and answers[0].status_code == 200, answers
    assert answers[0].headers["x-poll-source"] == "cache" and time.monotonic() - t0 < 4
    assert answers[0].content.startswith(b'{"unread":1')


def test_an_answer_the_cache_could_not_give_is_stretched(gz_stack: Stack) -> None:
    """The app answers a poll whose key is cached (the poll server could not read it: a 503, a
    poller down or hung): its fill finds the key, and the pace stays fallback_interval_ms."""
    uid = new_uid()
    url = gz_stack.app_url() + gz_stack.poll_url(uid)
    assert httpx.get(url, timeout=10).status_code == 200  # fills the key
    r = httpx.get(url, timeout=10)
    assert r.headers["x-poll-source"] == "app" and 2000 <= pace(r) <= 2400, r.headers


def test_a_poll_while_the_cache_is_down_is_stretched(tmp_path: Path) -> None:
    """With memcached stopped the poll server answers 503 and the app's fill fails: the app's
    answer keeps fallback_interval_ms (a fresh user's miss before it has the pace of a hit)."""
    stack = start_stack(
        tmp_path,
        "memcached",
        n_pollers=1,
        extra_ini={"poll": {"fallback_interval_ms": "2000", "jitter_pct": "20"}},
    )
    try:
        with http_client(stack) as c:
            assert 1000 <= pace(c.get(f"/Poll/getMessages?user_id={new_uid()}")) <= 1200
            stack.stop_proc("memcached-0")
            for _ in range(3):
                r = c.get(f"/Poll/getMessages?user_id={new_uid()}")
                assert r.status_code == 200 and r.headers["x-poll-source"] == "app"
                assert 2000 <= pace(r) <= 2400, r.headers
    finally:
        stack.stop()


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
    # The poll location, @poll_held and @poll_stream each pass it to the poller.
    assert conf.count("proxy_set_header If-None-Match $http_if_none_match;") == 3
    assert "proxy_read_timeout 40s;" in conf  # [poll] max_wait 30 + 10
    assert "error_page 418 = @poll_held;" in conf
    assert "error_page 421 = @poll_stream;" in conf
    assert "proxy_read_timeout 35s;" in conf  # [stream] heartbeat_ms 15000: twice it + 5 s


# ---- the poll server's half ----------------------------------------------------------------

RECHECK_MS = 2000  # while subscribed (recheck_subscribed_ms)
RECHECK_DOWN_MS = 500  # while not (recheck_ms)
Answers = list[tuple[float, httpx.Response]]  # (time.monotonic() when answered, answer)
HELD_CLIENTS = int(os.environ.get("FP_HELD_CLIENTS", "2000"))


@pytest.fixture(scope="module", params=["memcached", "redis"])
def held_stack(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    """One poller (its metrics are the stack's), paced answers, long polls up to 10 s. With
    memcached the app and the poller use the stack's Redis for announcements ([announce]
    server); with Redis, the cache's own."""
    redis_port = free_port()
    run_dir = tmp_path_factory.mktemp(f"held-{request.param}")
    extra: dict[str, dict[str, str]] = {
        "poll": {"interval_ms": "1000", "jitter_pct": "20", "max_wait": "10"},
        "server": {
            "recheck_ms": str(RECHECK_DOWN_MS),
            "recheck_subscribed_ms": str(RECHECK_MS),
            "max_held": str(HELD_CLIENTS + 100),
        },
    }
    if request.param == "memcached":
        extra["announce"] = {
            "server": f"127.0.0.1:{redis_port}",
            "password_file": str(run_dir / "redis.pass"),
        }
    # cache_timeout_ms 1000: a cold poller under valgrind (make valgrind) must still hit.
    s = start_stack(
        run_dir, request.param, n_pollers=1, redis_port=redis_port, extra_ini=extra,
        cache_timeout_ms=1000,
    )  # fmt: skip
    wait_subscribed(s)
    yield s
    s.stop()


def wait_subscribed(stack: Stack) -> None:
    deadline = time.monotonic() + 10
    while metric(stack, "fastpoll_announce_subscribed") != 1:
        assert time.monotonic() < deadline, "the poller never subscribed to announcements"
        time.sleep(0.05)


def hit(client: httpx.Client, uid: int, **headers: str) -> httpx.Response:
    r = client.get(f"/Poll/getMessages?user_id={uid}", headers=headers)
    assert r.headers["x-poll-source"] == "cache", r.headers
    return r


def published(stack: Stack, text: str) -> tuple[int, httpx.Response]:
    """A new user with one message published, and its first poll (a hit)."""
    uid = new_uid()
    publish(stack, uid, text)
    with http_client(stack) as c:
        return uid, hit(c, uid)


def test_hit_has_the_etag_and_the_pace(held_stack: Stack) -> None:
    _, r = published(held_stack, "tagged")
    assert r.status_code == 200 and r.content.startswith(b'{"unread":1')
    assert r.headers["etag"] == tag_of(r.content)  # the app's tag of the same bytes
    assert 1000 <= int(r.headers["poll-interval-ms"]) <= 1200


def test_304_on_a_hit(held_stack: Stack) -> None:
    uid = new_uid()
    publish(held_stack, uid, "once")
    before = metric(held_stack, 'fastpoll_requests_total{method="GET",outcome="not_modified"}')
    with http_client(held_stack) as c:
        tag = hit(c, uid).headers["etag"]
        for inm in (tag, "W/" + tag, f'"other", W/{tag}', "*"):
            r = hit(c, uid, **{"If-None-Match": inm})
            assert r.status_code == 304 and r.content == b"", inm
            assert r.headers["etag"] == tag and "content-type" not in r.headers
            assert 1000 <= int(r.headers["poll-interval-ms"]) <= 1200
        # Several If-None-Match lines form one list (sent straight to the poller: nginx
        # passes the first line only).
        with socket.create_connection(("127.0.0.1", held_stack.poller_ports[0])) as sk:
            target = held_stack.sign(f"/getMessages?user_id={uid}")
            sk.sendall(
                f'GET {target} HTTP/1.1\r\nHost: x\r\nIf-None-Match: "a"\r\n'
                f"If-None-Match: {tag}\r\nConnection: close\r\n\r\n".encode()
            )
            assert recv_all(sk).startswith(b"HTTP/1.1 304 ")
        # However many lines (up to the head's 100), as the app joins them: the tag on the
        # 12th of 12 lines still matches.
        with socket.create_connection(("127.0.0.1", held_stack.poller_ports[0])) as sk:
            target = held_stack.sign(f"/getMessages?user_id={uid}")
            lines = "".join(f'If-None-Match: "x{i}"\r\n' for i in range(11))
            sk.sendall(
                f"GET {target} HTTP/1.1\r\nHost: x\r\n{lines}"
                f"If-None-Match: {tag}\r\nConnection: close\r\n\r\n".encode()
            )
            assert recv_all(sk).startswith(b"HTTP/1.1 304 ")
        # HEAD too; a POST poll is never evaluated.
        head = c.head(f"/Poll/getMessages?user_id={uid}", headers={"If-None-Match": tag})
        assert head.status_code == 304
    with http_client(held_stack, held_stack.poller_ports[0]) as direct:
        r = direct.post(f"/getMessages?user_id={uid}", headers={"If-None-Match": tag})
        assert r.status_code == 200 and r.headers["etag"] == tag
    after = metric(held_stack, 'fastpoll_requests_total{method="GET",outcome="not_modified"}')
    assert after - before == 6


def recv_all(sk: socket.socket, timeout: float = 5) -> bytes:
    sk.settimeout(timeout)
    out = b""
    while chunk := sk.recv(65536):
        out += chunk
    return out


def test_bad_if_none_match_is_ignored(held_stack: Stack) -> None:
    uid, full = published(held_stack, "full")
    tag = full.headers["etag"]
    with http_client(held_stack) as c:
        huge = ", ".join([tag] + ['"' + "x" * 60 + '"'] * 20)  # > 1,024 bytes, holds the tag
        assert len(huge) > 1024
        for inm in (huge, tag[1:-1], f"w/{tag}", f"W/ {tag}", f"*, {tag}", '"a"b"', '"a b"'):
            r = hit(c, uid, **{"If-None-Match": inm})
            assert r.status_code == 200 and r.content == full.content, inm
            assert r.headers["etag"] == tag


def test_wait_out_of_range(held_stack: Stack) -> None:
    uid = new_uid()
    publish(held_stack, uid, "w")
    with http_client(held_stack, held_stack.poller_ports[0]) as direct:
        # Raw, never percent-decoded (the app reads it the same way): %31 is not a digit.
        bad_waits = ("wait=x", "wait=-1", "wait=1234567", "wait=", "wait", "wait=1&wait=1",
                     "wait=%31", "wait=+1")  # fmt: skip
        for bad in bad_waits + ("wait=1.5",):
            r = direct.get(f"/getMessages?user_id={uid}&{bad}")
            assert r.status_code == 400, bad
        # Above max_wait (10 s) it is clamped: without a matching tag, answered at once.
        t0 = time.monotonic()
        r = direct.get(f"/getMessages?user_id={uid}&wait=999999")
        assert r.status_code == 200 and time.monotonic() - t0 < 2
        assert direct.get(f"/getMessages?user_id={uid}&w%61it=x").status_code == 200


def held_poll(stack: Stack, uid: int, tag: str, wait: int, out: Answers) -> None:
    with http_client(stack, timeout=wait + 15) as c:
        url = f"/Poll/getMessages?user_id={uid}&wait={wait}"
        r = c.get(url, headers={"If-None-Match": tag})
        out.append((time.monotonic(), r))


def start_held(
    stack: Stack, uid: int, tag: str, wait: int, n: int = 1
) -> tuple[list[threading.Thread], Answers]:
    """n polls with wait and the current tag, through nginx, each on its own thread; returns
    once the poller holds them all."""
    out: Answers = []
    threads = [
        threading.Thread(target=held_poll, args=(stack, uid, tag, wait, out)) for _ in range(n)
    ]
    before = metric(stack, "fastpoll_held_requests")
    for t in threads:
        t.start()
    deadline = time.monotonic() + 5
    while metric(stack, "fastpoll_held_requests") < before + n:
        assert time.monotonic() < deadline, "the polls were not held"
        time.sleep(0.02)
    return threads, out


def test_held_poll_answered_within_a_second_of_a_publish(held_stack: Stack) -> None:
    uid, first = published(held_stack, "first")
    tag = first.headers["etag"]
    woken = metric(held_stack, 'fastpoll_held_wakeups_total{cause="announcement"}')
    timed, timed_s = delivered(held_stack), delivered(held_stack, "_sum")
    timed_1s = delivered(held_stack, '_bucket{le="1"}')
    threads, out = start_held(held_stack, uid, tag, 10, n=3)  # 3 polls, one watch
    t0 = time.monotonic()
    publish(held_stack, uid, "second")
    for t in threads:
        t.join(15)
    assert len(out) == 3
    for t_done, r in out:
        assert r.status_code == 200 and r.headers["x-poll-source"] == "cache"
        assert b"second" in r.content and r.headers["etag"] == tag_of(r.content)
        assert t_done - t0 < 1.0, f"answered {t_done - t0:.2f} s after the publish"
        assert int(r.headers["poll-interval-ms"]) <= 200  # 0 + the jitter of 1000 ms
    # The announcement woke them, not the re-check (RECHECK_MS is 2 s).
    assert metric(held_stack, 'fastpoll_held_wakeups_total{cause="announcement"}') - woken == 3
    assert metric(held_stack, "fastpoll_held_requests") == 0
    # The app's announcement carried its publish time: three deliveries timed, each < 1 s.
    assert delivered(held_stack) - timed == 3
    assert delivered(held_stack, "_sum") - timed_s < 3.0
    assert delivered(held_stack, '_bucket{le="1"}') - timed_1s == 3


def delivered(stack: Stack, series: str = "_count") -> float:
    return metric(stack, "fastpoll_publish_to_delivery_seconds" + series)


def announce_raw(stack: Stack, message: bytes) -> None:
    """PUBLISH on the channel the poller subscribes to (the stack's Redis in both set-ups)."""
    password = (stack.run_dir / "redis.pass").read_text().strip()
    with redis.Redis(host="127.0.0.1", port=stack.redis_port, password=password) as r:
        assert r.publish("fastpoll:announce", message) == 1  # the poller is subscribed


def test_announcement_times_parsed_strictly(held_stack: Stack) -> None:
    """An announcement from an app clock ahead of ours is clamped to 0 s and counted; a
    malformed time is counted and ignored, and its key is still read; a bare key (an app from
    before the time suffix) wakes the polls without timing them."""
    cache = Cache(held_stack)
    cases = [  # (suffix, negative, malformed, timed)
        (f" {int(time.time() * 1000) + 600_000}".encode(), 1, 0, 1),
        (b" 12x", 0, 1, 0),
        (b" ", 0, 1, 0),
        (b" 1234567890123456", 0, 1, 0),  # 16 digits
        (b"", 0, 0, 0),
    ]
    for suffix, negative, malformed, timed in cases:
        uid, first = published(held_stack, "t")
        before = (
            metric(held_stack, "fastpoll_publish_to_delivery_negative_total"),
            metric(held_stack, "fastpoll_announcements_malformed_total"),
            delivered(held_stack),
            delivered(held_stack, '_bucket{le="0.001"}'),
        )
        threads, out = start_held(held_stack, uid, first.headers["etag"], 10)
        cache.set(poll_key(uid), b'{"new":1}')  # not announced by the app
        t0 = time.monotonic()
        announce_raw(held_stack, poll_key(uid).encode() + suffix)
        threads[0].join(15)
        assert out and out[0][1].status_code == 200 and out[0][1].content == b'{"new":1}'
        assert out[0][0] - t0 < 1.0, suffix  # the announcement, not the 2 s re-check
        after = (
            metric(held_stack, "fastpoll_publish_to_delivery_negative_total"),
            metric(held_stack, "fastpoll_announcements_malformed_total"),
            delivered(held_stack),
            delivered(held_stack, '_bucket{le="0.001"}'),
        )
        want = [negative, malformed, timed, negative]
        assert [a - b for a, b in zip(after, before, strict=True)] == want, suffix


def test_unannounced_write_is_found_by_the_recheck(held_stack: Stack) -> None:
    uid = new_uid()
    publish(held_stack, uid, "first")
    cache = Cache(held_stack)
    with http_client(held_stack) as c:
        tag = hit(c, uid).headers["etag"]
    woken = metric(held_stack, 'fastpoll_held_wakeups_total{cause="recheck"}')
    threads, out = start_held(held_stack, uid, tag, 10)
    t0 = time.monotonic()
    cache.set(poll_key(uid), b'{"written":"behind the app\'s back"}')  # no announcement
    threads[0].join(15)
    t_done, r = out[0]
    assert r.status_code == 200 and r.content.startswith(b'{"written"')
    # Subscribed: the re-check's period is recheck_subscribed_ms, not the shorter recheck_ms.
    assert RECHECK_MS / 1000 - 0.8 <= t_done - t0 < RECHECK_MS / 1000 + 1
    assert metric(held_stack, 'fastpoll_held_wakeups_total{cause="recheck"}') - woken == 1


def test_recheck_is_faster_while_unsubscribed(tmp_path: Path) -> None:
    """Announcements from a Redis that is not there: held keys are re-read every recheck_ms
    (recheck_subscribed_ms, a minute, would never find the write within the wait)."""
    extra = {
        "server": {"recheck_ms": str(RECHECK_DOWN_MS), "recheck_subscribed_ms": "60000"},
        "announce": {"server": f"127.0.0.1:{free_port()}"},  # nothing listens there
    }
    s = start_stack(tmp_path, "memcached", n_pollers=1, extra_ini=extra, cache_timeout_ms=1000)
    try:
        assert metric(s, "fastpoll_announce_subscribed") == 0
        uid = new_uid()
        cache = Cache(s)
        cache.set(poll_key(uid), b'{"v":1}')
        with http_client(s) as c:
            tag = hit(c, uid).headers["etag"]
        threads, out = start_held(s, uid, tag, 10)
        t0 = time.monotonic()
        cache.set(poll_key(uid), b'{"v":2}')
        threads[0].join(15)
        t_done, r = out[0]
        assert r.status_code == 200 and r.content == b'{"v":2}'
        assert t_done - t0 < RECHECK_DOWN_MS / 1000 + 1
    finally:
        s.stop()


def test_long_poll_answered_at_once_is_paced_as_a_held_one(held_stack: Stack) -> None:
    """A wait= poll whose tag is not the answer's gets the answer at once, with the pace of a
    held poll that ends (0 plus the jitter): its next poll, with the new tag, is held. A plain
    poll's answer keeps the interval."""
    uid, first = published(held_stack, "one")
    publish(held_stack, uid, "two")
    with http_client(held_stack) as c:
        for headers in ({"If-None-Match": first.headers["etag"]}, {}):
            t0 = time.monotonic()
            r = c.get(f"/Poll/getMessages?user_id={uid}&wait=5", headers=headers)
            assert r.status_code == 200 and b"two" in r.content and time.monotonic() - t0 < 2
            assert int(r.headers["poll-interval-ms"]) <= 200, r.headers
        r = hit(c, uid, **{"If-None-Match": first.headers["etag"]})
        assert r.status_code == 200 and 1000 <= int(r.headers["poll-interval-ms"]) <= 1200


def test_held_poll_ends_with_304_after_its_wait(held_stack: Stack) -> None:
    uid, first = published(held_stack, "still")
    tag = first.headers["etag"]
    t0 = time.monotonic()
    threads, out = start_held(held_stack, uid, tag, 1)
    threads[0].join(10)
    t_done, r = out[0]
    assert r.status_code == 304 and r.headers["etag"] == tag and r.content == b""
    assert 0.9 <= t_done - t0 < 3
    assert int(r.headers["poll-interval-ms"]) <= 200


def test_many_held_clients_disconnect_at_once(held_stack: Stack) -> None:
    """HELD_CLIENTS polls held straight on the poller (signed), then every client closes:
    every slot is freed, no connection is left open, and the poller still answers."""
    uid, first = published(held_stack, "crowd")
    tag = first.headers["etag"]
    port = held_stack.poller_ports[0]
    target = held_stack.sign(f"/getMessages?user_id={uid}&wait=10")
    req = f"GET {target} HTTP/1.1\r\nHost: x\r\nIf-None-Match: {tag}\r\n\r\n".encode()
    base_conns = metric(held_stack, "fastpoll_open_connections")
    socks: list[socket.socket] = []
    try:
        for _ in range(HELD_CLIENTS):
            sk = socket.create_connection(("127.0.0.1", port))
            sk.sendall(req)
            socks.append(sk)
        deadline = time.monotonic() + 120  # valgrind (make valgrind) is slow
        while (held := metric(held_stack, "fastpoll_held_requests")) < HELD_CLIENTS:
            assert time.monotonic() < deadline, f"{held} of {HELD_CLIENTS} polls held"
            time.sleep(0.1)
    finally:
        for sk in socks:
            sk.close()
    deadline = time.monotonic() + 60
    while (
        metric(held_stack, "fastpoll_held_requests") != 0
        or metric(held_stack, "fastpoll_open_connections") > base_conns
    ):
        assert time.monotonic() < deadline, "held slots or connections were not freed"
        time.sleep(0.1)
    with http_client(held_stack) as c:
        assert hit(c, uid, **{"If-None-Match": tag}).status_code == 304
