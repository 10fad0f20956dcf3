"""Channels on the app side: the vectors shared with the poll server (channels.json)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from fastpoll_app import channels, config, signing
from fastpoll_app.app import create_app
from fastpoll_app.conditional import etag_of
from fastpoll_app.service import FastPoll
from fastpoll_testkit.procs import Server

from .conftest import REPO_ROOT, make_settings

VECTORS: dict[str, Any] = json.loads(
    (REPO_ROOT / "tests" / "vectors" / "channels.json").read_text(encoding="utf-8")
)


def test_names() -> None:
    for c in VECTORS["names"]:
        assert channels.valid_name(c["name"].encode()) == c["valid"], c["why"]


@pytest.mark.parametrize("case", VECTORS["ch"], ids=lambda c: c["why"][:50])
def test_ch(case: dict[str, Any]) -> None:
    query = case["query"].encode()
    if "error" in case:
        with pytest.raises(channels.BadChannels) as exc:
            channels.parse_ch(query, case["max"])
        assert str(exc.value) == case["error"]
        return
    got = channels.parse_ch(query, case["max"])
    if case["ch"] is None:
        assert got is None and case["channels"] is None
    else:
        assert got == (case["ch"].encode(), [n.encode() for n in case["channels"]])


def test_keys_signatures_bodies_values() -> None:
    for c in VECTORS["keys"]:
        assert channels.channel_key(c["prefix"].encode(), c["name"].encode()).decode() == c["key"]
    for c in VECTORS["sign"]:
        ch = None if c["ch"] is None else c["ch"].encode()
        signed = channels.signed_key(c["key"].encode(), ch)
        assert c["exp"].encode() + b":" + signed == c["message"].encode()
        assert signing.sign(c["secret"].encode(), c["exp"].encode(), signed).decode() == c["sig"]
    for c in VECTORS["compose"]:
        parts = [(n.encode(), v.encode()) for n, v in c["channels"]]
        body = channels.compose(c["user"].encode(), parts)
        assert body.decode() == c["body"], c["why"]
        assert etag_of(body) == c["etag"]
    for c in VECTORS["values"]:
        every, h = [(i, t) for i, t in c["messages"]], c["history"]
        before = every[-h - 1][0] if len(every) > h else None
        assert channels.encode_channel(every[-h:], before).decode() == c["value"], c["why"]


def test_vectors_cover_refusals_and_acceptances() -> None:
    kinds = {("error" in c) for c in VECTORS["ch"]}
    assert kinds == {True, False}
    assert len({c["sig"] for c in VECTORS["sign"]}) == len(VECTORS["sign"])


# -- the app: both stores, both caches --------------------------------------------------------

ROOM = b"/Poll#room.a"


def fp_of(client: TestClient) -> FastPoll:
    return client.app.state.fastpoll  # type: ignore[attr-defined]


def cached(client: TestClient, key: bytes) -> bytes | None:
    return fp_of(client)._fill.get(key)


def room_value(*msgs: tuple[int, str], before: int | None = None) -> bytes:
    return channels.encode_channel(list(msgs), before)


@pytest.fixture
def room_client(settings: config.Settings) -> Iterator[TestClient]:
    s = dataclasses.replace(settings, channels=config.ChannelSettings(max=4, history=3))
    with TestClient(create_app(s)) as c:
        yield c


def test_channel_publish_writes_the_room_and_polls_compose(room_client: TestClient) -> None:
    c = room_client
    r = c.get("/Poll/getMessages?user_id=1&ch=room.a,room.b")
    assert r.status_code == 200
    assert r.content == b'{"user":null,"channels":{"room.a":null,"room.b":null}}'
    assert r.headers["etag"] == etag_of(r.content)
    assert cached(c, ROOM) == b"" and cached(c, b"/Poll#room.b") == b""  # filled, empty
    ids = []
    for text in ("one", "two", "three", "four"):
        r = c.post("/api/channels/room.a/messages", json={"text": text})
        assert r.status_code == 201, r.text
        assert r.json()["channel"] == "room.a" and r.headers["x-cache-publish"] == "ok"
        ids.append(r.json()["id"])
    # history 3: the newest three, ascending, and "before" the one before them
    want_a = room_value((ids[1], "two"), (ids[2], "three"), (ids[3], "four"), before=ids[0])
    assert cached(c, ROOM) == want_a
    p = c.get("/Poll/getMessages?user_id=1&ch=room.a,room.b")
    assert p.content == b'{"user":null,"channels":{"room.a":%s,"room.b":null}}' % want_a
    # the ETag of the composed body; 304 on it
    r304 = c.get(
        "/Poll/getMessages?user_id=1&ch=room.a,room.b", headers={"If-None-Match": p.headers["etag"]}
    )
    assert r304.status_code == 304
    # a room message is nobody's unread state
    assert cached(c, b"/Poll/getMessages?user_id=1") == b""


def test_a_poll_fills_every_missing_part(room_client: TestClient) -> None:
    c = room_client
    mid = c.post("/api/channels/room.a/messages", json={"text": "hi"}).json()["id"]
    c.post("/api/messages", json={"user_id": 7, "text": "dm"})
    fp = fp_of(c)
    for key in (ROOM, b"/Poll/getMessages?user_id=7"):
        fp._fill.delete(key)
    body = c.get("/Poll/getMessages?user_id=7&ch=room.a").content
    assert body.startswith(b'{"user":{"unread":1,') and room_value((mid, "hi")) in body
    assert cached(c, ROOM) == room_value((mid, "hi"))
    assert cached(c, b"/Poll/getMessages?user_id=7") is not None


@pytest.mark.parametrize(
    "case",
    # The app here runs the default max (16); test_ch covers the other maxima.
    [c for c in VECTORS["ch"] if "error" in c and c["max"] == 16],
    ids=lambda c: c["why"][:40],
)
def test_bad_ch_is_400_naming_the_problem(client: TestClient, case: dict[str, Any]) -> None:
    r = client.get("/Poll/getMessages?" + case["query"])
    assert r.status_code == 400
    assert r.json() == {"error": case["error"]}


def test_channel_publish_idempotency_and_bad_names(client: TestClient) -> None:
    h = {"Idempotency-Key": "k1"}
    a = client.post("/api/channels/room.a/messages", json={"text": "x"}, headers=h)
    b = client.post("/api/channels/room.a/messages", json={"text": "x"}, headers=h)
    assert a.status_code == b.status_code == 201 and a.json()["id"] == b.json()["id"]
    assert b.headers["idempotent-replayed"] == "true"
    assert (
        client.post("/api/channels/room.a/messages", json={"text": "y"}, headers=h).status_code
        == 409
    )
    # the same key in another room is another message
    other = client.post("/api/channels/room.b/messages", json={"text": "x"}, headers=h)
    assert other.status_code == 201 and other.json()["id"] != a.json()["id"]
    for name in ("room%20a", "x" * 65, "caf%C3%A9", "a%23b"):
        r = client.post(f"/api/channels/{name}/messages", json={"text": "x"})
        assert r.status_code == 400, name
        assert r.json() == {"error": channels.NAME_RULE}


def test_batch_publish_users_and_channels(client: TestClient) -> None:
    items: list[dict[str, object]] = [{"user_id": u, "text": f"to {u}"} for u in (1, 2, 3)]
    items += [{"channel": "room.a", "text": "r1"}, {"channel": "room.a", "text": "r2"}]
    items += [{"user_id": 1, "text": "again"}]
    r = client.post("/api/messages/batch", json={"items": items})
    assert r.status_code == 201, r.text
    ids = r.json()["ids"]
    assert len(ids) == 6 and ids == sorted(ids)
    assert r.headers["x-cache-publish"] == "ok"
    assert cached(client, ROOM) == room_value((ids[3], "r1"), (ids[4], "r2"))
    u1 = cached(client, b"/Poll/getMessages?user_id=1") or b""
    assert json.loads(u1) == {
        "unread": 2,
        "newest": {"id": ids[5], "text": "again"},
        "messages": [{"id": ids[0], "text": "to 1"}, {"id": ids[5], "text": "again"}],
    }
    assert json.loads(cached(client, b"/Poll/getMessages?user_id=3") or b"")["unread"] == 1
    assert fp_of(client).store.outbox_backlog() == 0
    for bad, why in [
        ({"items": []}, "items"),
        ({"items": [{"text": "x"}]}, "exactly one"),
        ({"items": [{"user_id": 1, "channel": "a", "text": "x"}]}, "exactly one"),
        ({"items": [{"channel": "a b", "text": "x"}]}, "channel name"),
        ({"items": [{"user_id": 1, "text": "x"}] * 1001}, "items"),
    ]:
        r = client.post("/api/messages/batch", json=bad)
        assert r.status_code in (400, 413), why
        if r.status_code == 400:
            assert why in r.json()["error"], r.json()


def test_repair_rewrites_a_channel_key(client: TestClient) -> None:
    mid = client.post("/api/channels/room.a/messages", json={"text": "kept"}).json()["id"]
    fp = fp_of(client)
    fp._fill.delete(ROOM)
    assert fp.repair(fp.channel_owner("room.a")) == "rewritten"
    assert cached(client, ROOM) == room_value((mid, "kept"))


def test_signed_channel_urls_cover_the_exact_set(memcached: Server, tmp_path: Path) -> None:
    key = tmp_path / "signing.key"
    key.write_text("0123456789abcdef0123456789abcdef\n")
    key.chmod(0o600)
    settings = make_settings(
        tmp_path,
        f"[cache]\nbackend = memcached\n[memcached]\nservers = {memcached.addr}\n"
        f"[signing]\nsecret_file = {key}\nttl = 600\n[channels]\nmax = 3\n",
    )
    with TestClient(create_app(settings)) as c:
        r = c.post("/api/poll-url", json={"user_id": 42, "channels": ["room.b", "room.a"]})
        assert r.status_code == 200, r.text
        doc = r.json()
        assert doc["channels"] == ["room.a", "room.b"]
        url = doc["url"]
        assert url.startswith("/Poll/getMessages?user_id=42&ch=room.a,room.b&exp=")
        assert c.get(url).status_code == 200
        assert c.get(url.replace("ch=room.a,room.b", "CH=room.a,room.b")).status_code == 200
        for other in ("ch=room.a,room.c", "ch=room.a", "ch=room.b", "ch=room.a,room.b,room.c"):
            assert c.get(url.replace("ch=room.a,room.b", other)).status_code == 403, other
        assert c.get(url.replace("&ch=room.a,room.b", "")).status_code == 403  # not a plain URL
        plain = c.post("/api/poll-url", json={"user_id": 42}).json()["url"]
        assert c.get(plain + "&ch=room.a").status_code == 403  # a plain URL reads no room
        assert "channels" not in c.post("/api/poll-url", json={"user_id": 42}).json()
        for bad, why in [
            (["room.a", "room.a"], "twice"),
            ([], "1 to 3"),
            (["a", "b", "c", "d"], "1 to 3"),
            (["room a"], "channel name"),
            ("room.a", "list"),
        ]:
            r = c.post("/api/poll-url", json={"user_id": 42, "channels": bad})
            assert r.status_code == 400 and why in r.json()["error"], (bad, r.text)


def test_memcached_put_many_pipelined_on_replicas(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every key on each of its nodes (primary and replica), absent keys added, present ones
    replaced by their `cas`; a key whose pipelined write lost a race is written again alone."""
    from fastpoll_app import mcpipe
    from fastpoll_app.cache import MemcachedCache
    from fastpoll_testkit.procs import start_memcached

    nodes = [start_memcached() for _ in range(3)]
    try:
        cache = MemcachedCache(tuple(n.addr for n in nodes), 300, 1000, replicas=1)
        keys = [b"/Poll/getMessages?user_id=%d" % i for i in range(150)]
        cache.put(keys[0], b"old", 1)

        def on_every_node(value_of: Callable[[bytes], bytes]) -> None:
            for k in keys:
                for addr in cache.nodes(k):
                    with cache._client(addr) as mc:
                        assert mc.get(k) == value_of(k), (k, addr)

        cache.put_many([(k, b"v" + k, 2) for k in keys])
        on_every_node(lambda k: b"v" + k)
        real = mcpipe.put_node

        def racing(
            addr: str, items: Sequence[tuple[bytes, bytes]], ttl: int, timeout: float
        ) -> list[bytes]:
            real(addr, items, ttl, timeout)
            with cache._client(addr) as mc:  # another write lands after the pipeline's
                for k, _ in items:
                    mc.set(k, b"late")
            return [k for k, _ in items]  # as if every `cas` had lost

        monkeypatch.setattr(mcpipe, "put_node", racing)
        cache.put_many([(k, b"w" + k, 3) for k in keys])
        on_every_node(lambda k: b"w" + k)
        cache.close()
    finally:
        for n in nodes:
            n.stop()
