"""Polls with channels through nginx, the poll server's side (docs/channels.md), on
memcached and on Redis: the composed answer from the cache (the app's bytes, its ETag), 304,
wait= polls woken by a room's publish (every member, one watch of the room's key) and by the
user's own, the fallback when a part misses, refused inputs answered 4xx with nothing sent to
the cache and no poller marked failed, and the scope of a URL's signature.

URLs come from the app's POST /api/poll-url (the site's backend asks for them); the ones the
app would never sign are signed here with the stack's secret, as an attacker holding it could
not but a client with a stale or edited URL would try."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import unquote_plus

import httpx
import pytest

from fastpoll_app import channels
from fastpoll_app.conditional import etag_of
from fastpoll_app.signing import load_secrets, signed_query
from fastpoll_testkit.helpers import Cache, new_uid, poll_key, poller_metric, start_stack
from fastpoll_testkit.stack import Stack, memcached_stats

# nginx's words when proxying to a poller failed or timed out (a mark that takes it out).
UPSTREAM_FAILURES = ("upstream server temporarily disabled", "upstream timed out",
                     "no live upstreams", "upstream prematurely closed")


@pytest.fixture(scope="module", params=["memcached", "redis"])
def stack(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    """One poller; two memcached nodes, so that a poll's parts are on different servers. Held
    keys re-checked every second (an eviction is not announced)."""
    run_dir: Path = tmp_path_factory.mktemp(f"channels-{request.param}")
    recheck = {"server": {"recheck_subscribed_ms": "1000"}}
    s = start_stack(run_dir, request.param, n_pollers=1, n_memcached=2, extra_ini=recheck)
    yield s
    s.stop()


@pytest.fixture()
def client(stack: Stack) -> Iterator[httpx.Client]:
    """A plain client of nginx: the URLs it gets are signed already."""
    with httpx.Client(base_url=stack.base_url, timeout=30) as c:
        yield c


def url_for(stack: Stack, uid: int, rooms: list[str]) -> str:
    with stack.api() as api:
        r = api.post("/api/poll-url", json={"user_id": uid, "channels": rooms})
        assert r.status_code == 200, r.text
        return str(r.json()["url"])


def signed(stack: Stack, uid: int, query: str, ch: str | None) -> str:
    """/Poll/getMessages?user_id=uid&<query>, signed for the user's key and `ch` (the decoded
    value a signature covers; None: a plain URL's signature)."""
    secret = load_secrets(stack.secret_path)[0]
    key = poll_key(uid).encode()
    if ch is not None:
        key = channels.signed_key(key, ch.encode("latin-1"))
    sig = signed_query(secret, key, int(time.time()) + 3600).decode()
    return f"/Poll/getMessages?user_id={uid}{'&' + query if query else ''}&{sig}"


def say(stack: Stack, room: str, text: str) -> None:
    with stack.api() as api:
        r = api.post(f"/api/channels/{room}/messages", json={"text": text})
        assert r.status_code == 201 and r.headers["x-cache-publish"] == "ok", r.text


def tell(stack: Stack, uid: int, text: str) -> None:
    with stack.api() as api:
        r = api.post("/api/messages", json={"user_id": uid, "text": text})
        assert r.status_code == 201 and r.headers["x-cache-publish"] == "ok", r.text


def rooms() -> list[str]:
    """Two fresh channel names, ascending."""
    n = new_uid()
    return [f"r{n}.a", f"r{n}.b"]


def cache_reads(stack: Stack) -> int:
    """Keys the cache servers were asked for, every node, gets and multi-gets."""
    if stack.backend == "memcached":
        return sum(memcached_stats(p)["cmd_get"] for p in stack.memcached_ports)
    info = Cache(stack).r.info("commandstats")
    return sum(int(info.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in ("get", "mget"))


def upstream_failures(stack: Stack, since: int) -> list[str]:
    with open(stack.run_dir / "nginx" / "error.log", "rb") as f:
        f.seek(since)
        log = f.read().decode(errors="replace")
    return [line for line in log.splitlines() if any(m in line for m in UPSTREAM_FAILURES)]


def cached_poll(client: httpx.Client, url: str, **headers: str) -> httpx.Response:
    """The poll answered by the poll server (its parts filled by the app first if need be)."""
    for _ in range(3):
        r = client.get(url, headers=headers)
        if r.headers.get("x-poll-source") == "cache":
            return r
    raise AssertionError(f"never from the cache: {r.status_code} {r.headers}")


def test_composed_answer_is_the_apps_bytes(stack: Stack, client: httpx.Client) -> None:
    uid, (a, b) = new_uid(), rooms()
    tell(stack, uid, "hello")
    say(stack, a, 'caf\u00e9 "quoted"')
    url = url_for(stack, uid, [a, b])
    # b has no message: its part is empty (null); a part missing in the cache: the app answers.
    Cache(stack).delete(f"/Poll#{a}")
    app = client.get(url)
    assert app.status_code == 200 and app.headers["x-poll-source"] == "app", app.headers
    hit = cached_poll(client, url)
    assert hit.status_code == 200 and hit.content == app.content
    assert hit.headers["etag"] == app.headers["etag"] == etag_of(hit.content)
    cache = Cache(stack)
    user, part_a = cache.get(poll_key(uid)), cache.get(f"/Poll#{a}")
    assert user and part_a and cache.get(f"/Poll#{b}") == b""
    assert hit.content == channels.compose(user, [(a.encode(), part_a), (b.encode(), b"")])
    assert b'"%s":null' % b.encode() in hit.content
    # The same user without ch: exactly the plain answer, as before channels.
    plain = client.get(stack.poll_url(uid))
    assert plain.headers["x-poll-source"] == "cache" and plain.content == user
    assert plain.headers["etag"] == etag_of(user)


def test_not_modified_until_a_part_changes(stack: Stack, client: httpx.Client) -> None:
    uid, (a, b) = new_uid(), rooms()
    say(stack, a, "one")
    url = url_for(stack, uid, [a, b])
    tag = cached_poll(client, url).headers["etag"]
    r = client.get(url, headers={"If-None-Match": tag})
    assert r.status_code == 304 and r.headers["x-poll-source"] == "cache"
    assert r.headers["etag"] == tag
    say(stack, b, "two")
    r = client.get(url, headers={"If-None-Match": tag})
    assert r.status_code == 200 and r.headers["etag"] != tag and b'"text":"two"' in r.content


class Held:
    """One wait=20 poll per URL, each in its own thread, held by the poll server once this
    returns; `answers` gets (seconds taken, answer) as they come."""

    def __init__(self, stack: Stack, client: httpx.Client, urls: list[str], tags: list[str]):
        self.stack = stack
        self.before = poller_metric(stack, "fastpoll_held_requests")
        self.answers: list[tuple[float, httpx.Response]] = []
        self.threads = [
            threading.Thread(target=self._one, args=(client, u, t))
            for u, t in zip(urls, tags, strict=True)
        ]
        for t in self.threads:
            t.start()
        deadline = time.monotonic() + 10
        while poller_metric(stack, "fastpoll_held_requests") < self.before + len(urls):
            assert time.monotonic() < deadline, "the polls were never held"
            time.sleep(0.05)

    def _one(self, client: httpx.Client, url: str, tag: str) -> None:
        t0 = time.monotonic()
        r = client.get(url + "&wait=20", headers={"If-None-Match": tag})
        self.answers.append((time.monotonic() - t0, r))

    def join(self) -> list[tuple[float, httpx.Response]]:
        for t in self.threads:
            t.join(30)
        assert len(self.answers) == len(self.threads)
        return self.answers


def test_held_members_woken_by_a_room_publish(stack: Stack, client: httpx.Client) -> None:
    """Three members of a room, each polling its own key and the room: one publish to the
    room answers all three with the new message; a held poll counts once however many keys."""
    a, b = rooms()
    uids = [new_uid() for _ in range(3)]
    urls = [url_for(stack, u, [a, b]) for u in uids]
    tags = [cached_poll(client, u).headers["etag"] for u in urls]
    held = Held(stack, client, urls, tags)
    time.sleep(0.3)
    assert poller_metric(stack, "fastpoll_held_requests") == held.before + 3
    t0 = time.monotonic()
    say(stack, b, "to the room")
    for took, r in held.join():
        assert r.status_code == 200 and r.headers["x-poll-source"] == "cache", r.headers
        assert b'"text":"to the room"' in r.content and r.headers["etag"] not in tags
        assert took < 20 - 1
    assert time.monotonic() - t0 < 5, "not woken by the announcement"
    assert poller_metric(stack, "fastpoll_held_requests") == held.before


def test_held_poll_woken_by_the_users_own_publish(stack: Stack, client: httpx.Client) -> None:
    """The user's poll with channels and its plain poll, held on the same key (one watch)."""
    uid, (a, b) = new_uid(), rooms()
    url, plain = url_for(stack, uid, [a, b]), stack.poll_url(uid)
    tags = [cached_poll(client, u).headers["etag"] for u in (url, plain)]
    held = Held(stack, client, [url, plain], tags)
    t0 = time.monotonic()
    tell(stack, uid, "just for you")
    answers = sorted(held.join(), key=lambda a: a[1].content.startswith(b'{"user"'))
    assert time.monotonic() - t0 < 5
    assert [r.status_code for _, r in answers] == [200, 200]
    assert b"just for you" in answers[0][1].content
    took, r = answers[1]
    assert r.content.startswith(b'{"user":' + answers[0][1].content + b',"channels":')
    # A wait= poll with the tag from before the publish: the answer at once, paced as a held
    # poll that ends (0 plus the jitter of 1000 ms), not as a plain poll (1000 ms and more).
    t0 = time.monotonic()
    again = client.get(url + "&wait=5", headers={"If-None-Match": tags[0]})
    assert again.status_code == 200 and again.content == r.content
    assert time.monotonic() - t0 < 2 and int(again.headers["poll-interval-ms"]) <= 200
    # The wait ends with 304 when nothing changes.
    tag = r.headers["etag"]
    t0 = time.monotonic()
    r = client.get(url + "&wait=1", headers={"If-None-Match": tag})
    assert r.status_code == 304 and 0.9 < time.monotonic() - t0 < 5


def test_a_missing_part_falls_back_and_is_filled(stack: Stack, client: httpx.Client) -> None:
    uid, (a, b) = new_uid(), rooms()
    say(stack, a, "kept")
    url = url_for(stack, uid, [a, b])
    want = cached_poll(client, url).content
    cache = Cache(stack)
    for key in (f"/Poll#{b}", poll_key(uid)):
        cache.delete(key)
        r = client.get(url)
        assert r.status_code == 200 and r.headers["x-poll-source"] == "app", key
        assert r.content == want
        assert cache.get(key) is not None, f"{key} not filled by the app"
        assert cached_poll(client, url).content == want


def test_a_held_poll_whose_part_goes_falls_back(stack: Stack, client: httpx.Client) -> None:
    """A part deleted while the poll is held (an eviction): the poll is answered by the app."""
    uid, (a, b) = new_uid(), rooms()
    url = url_for(stack, uid, [a, b])
    tag = cached_poll(client, url).headers["etag"]
    held = Held(stack, client, [url], [tag])
    Cache(stack).delete(f"/Poll#{a}")
    # No announcement for an eviction: the re-check (recheck_subscribed_ms, 1 s) reads it.
    took, r = held.join()[0]
    assert r.status_code in (200, 304) and r.headers["x-poll-source"] == "app", r.headers
    assert took < 10, "not seen by the re-check"


def bad_queries() -> list[tuple[str, str | None]]:
    """(query after user_id, ch as a client would sign it) of every refused ch in the shared
    vectors, with this test's user."""
    vectors = json.loads(
        (Path(__file__).parent / "vectors" / "channels.json").read_text()
    )
    out: list[tuple[str, str | None]] = []
    for case in vectors["ch"]:
        if "error" not in case or case["max"] != 16:
            continue
        query = case["query"].replace("user_id=1&", "").replace("&user_id=1", "")
        raw = [p.partition("=")[2] for p in query.split("&") if p.partition("=")[0].lower() == "ch"]
        out.append((query, unquote_plus(raw[0], encoding="latin-1") if len(raw) == 1 else None))
    assert len(out) > 15
    return out


def test_refused_inputs_are_4xx_and_never_reach_the_cache(
    stack: Stack, client: httpx.Client
) -> None:
    uid, (a, b) = new_uid(), rooms()
    good = url_for(stack, uid, [a, b])
    cached_poll(client, good)
    log_at = (stack.run_dir / "nginx" / "error.log").stat().st_size
    reads = cache_reads(stack)
    for query, ch in bad_queries():
        # Signed for its ch: the poll server refuses it (404) and the app says why (400).
        for url in (signed(stack, uid, query, ch), signed(stack, uid, query, None)):
            for extra in ("", "&wait=5"):
                r = client.get(url + extra)
                assert r.status_code in (400, 403), (query, extra, r.status_code, r.text)
                assert r.headers.get("x-poll-source") != "cache"
                assert "error" in r.json()
    # Signed for the user's key and a valid ch, then another set (the signature's scope).
    r = client.get(signed(stack, uid, f"ch={a},{b}x", f"{a},{b}"))
    assert r.status_code == 403, r.text
    assert cache_reads(stack) == reads, "a refused poll was read from the cache"
    assert upstream_failures(stack, log_at) == []
    r = client.get(good)
    assert r.status_code == 200 and r.headers["x-poll-source"] == "cache"


def test_a_signature_covers_exactly_its_channels(stack: Stack, client: httpx.Client) -> None:
    uid, (a, b) = new_uid(), rooms()
    c = f"{b}.c"
    good = url_for(stack, uid, [a, b])
    assert cached_poll(client, good).status_code == 200
    sig = good[good.index("&exp="):]
    plain = stack.poll_url(uid)
    edited = [
        f"/Poll/getMessages?user_id={uid}&ch={a},{c}{sig}",  # another set
        f"/Poll/getMessages?user_id={uid}&ch={a}{sig}",  # a subset
        f"/Poll/getMessages?user_id={uid}{sig}",  # ch dropped
        f"/Poll/getMessages?user_id={new_uid()}&ch={a},{b}{sig}",  # another user
        plain + f"&ch={a}",  # a plain URL given channels
    ]
    reads = cache_reads(stack)
    for url in edited:
        r = client.get(url)
        assert r.status_code == 403, (url, r.status_code)
        assert r.json()["error"] == "missing, invalid or expired signature"
    assert cache_reads(stack) == reads
    # The name in another case is the same parameter: the same URL, still valid.
    r = client.get(good.replace("&ch=", "&CH="))
    assert r.status_code == 200 and r.headers["x-poll-source"] == "cache"


def test_a_signed_poll_over_the_poll_servers_max_goes_to_the_app(
    stack: Stack, client: httpx.Client
) -> None:
    """A URL validly signed for more channels than the poll server's [channels] max (the app's
    may be larger) is a 404 there, so nginx asks the app, which answers it; the same URL with a
    bad signature is still a 403."""
    uid, n = new_uid(), new_uid()
    names = ",".join(f"r{n}.{i:02d}" for i in range(17))  # [channels] max: 16
    url = signed(stack, uid, f"ch={names}", names)
    direct = url.removeprefix("/Poll")  # the poll server's target: nginx strips the prefix
    reads = cache_reads(stack)
    r = httpx.get(f"http://127.0.0.1:{stack.poller_ports[0]}{direct}", timeout=10)
    assert r.status_code == 404, (r.status_code, r.text)
    r = client.get(url)  # the app's words (the poll server sends no body with a 404)
    assert (r.status_code, r.json()) == (400, {"error": "ch names more than 16 channels"})
    forged = url.replace("&sig=", "&sig=0")
    for target in (
        f"http://127.0.0.1:{stack.poller_ports[0]}{forged.removeprefix('/Poll')}",
        f"{stack.base_url}{forged}",
    ):
        r = httpx.get(target, timeout=10)
        assert r.status_code == 403, (target, r.status_code, r.text)
        assert r.json()["error"] == "missing, invalid or expired signature"
    assert cache_reads(stack) == reads, "a refused poll was read from the cache"
