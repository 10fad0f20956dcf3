"""Cache down or hung: polls and publishes still answer, the cache heals after."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from fastpoll_app.app import create_app
from fastpoll_testkit.procs import Server, start_memcached, start_redis, wait_for

from .conftest import make_settings

KEY = b"/Poll/getMessages?user_id=9"


@pytest.fixture(params=["memcached", "redis"])
def own_server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, Server]]:
    """A cache process of this test's own, so the test may stop it."""
    srv = start_memcached() if request.param == "memcached" else start_redis(dir=tmp_path)
    yield request.param, srv
    srv.stop()  # SIGCONT first


@pytest.fixture
def outage_client(
    own_server: tuple[str, Server], app_db: str, tmp_path: Path
) -> Iterator[TestClient]:
    name, srv = own_server
    section = (
        f"[memcached]\nservers = {srv.addr}"
        if name == "memcached"
        else (f"[redis]\nserver = {srv.addr}")
    )
    s = make_settings(tmp_path, f"[cache]\nbackend = {name}\n{section}\n", app_db)
    with TestClient(create_app(s)) as c:
        yield c


def test_cache_stopped_then_back(outage_client: TestClient, own_server: tuple[str, Server]) -> None:
    c = outage_client
    fp = c.app.state.fastpoll  # type: ignore[attr-defined]
    _, srv = own_server
    srv.stop()

    for _ in range(10):
        r = c.get("/Poll/getMessages?user_id=9")
        assert r.status_code == 200 and r.content == b""
    r = c.post("/api/messages", json={"user_id": 9, "text": "while down"})
    assert r.status_code == 201
    assert r.headers["x-cache-publish"] == "pending"
    assert fp.store.outbox_backlog() == 1

    srv.start()  # same port, empty cache
    wait_for(
        "the repair to succeed",
        lambda: fp.repair_pending() == 0,
        timeout=20,
        interval=0.1,
        retry_on=(),
    )
    assert fp._fill.get(KEY) == fp.store.poll_answer(9)
    assert b"while down" in fp._fill.get(KEY)

    # Fills work again without restarting anything.
    def filled() -> bool:
        assert c.get("/Poll/getMessages?user_id=10").status_code == 200
        return fp._fill.get(b"/Poll/getMessages?user_id=10") == b""

    wait_for("fills to resume", filled, timeout=20, interval=0.1, retry_on=())


def test_hung_cache_publish_is_repaired(
    outage_client: TestClient, own_server: tuple[str, Server]
) -> None:
    """A hung node keeps its old value; the repair must overwrite it."""
    c = outage_client
    fp = c.app.state.fastpoll  # type: ignore[attr-defined]
    _, srv = own_server
    c.get("/Poll/getMessages?user_id=9")
    assert fp._fill.get(KEY) == b""
    srv.freeze()
    try:
        r = c.post("/api/messages", json={"user_id": 9, "text": "during hang"})
        assert r.status_code == 201
        assert r.headers["x-cache-publish"] == "pending"
        assert c.get("/Poll/getMessages?user_id=9").status_code == 200
    finally:
        srv.thaw()
    wait_for(
        "the repair to succeed",
        lambda: fp.repair_pending() == 0,
        timeout=20,
        interval=0.1,
        retry_on=(),
    )
    assert b"during hang" in fp._fill.get(KEY)


def test_a_hung_node_does_not_hold_up_repairs_on_another(
    app_db: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two nodes, both hung while two users publish; one comes back. One repair round rewrites
    the key on the node that answers although the other user's repair (claimed first) fails."""
    from fastpoll_app import store as store_module
    from fastpoll_app.cache import make_cache
    from fastpoll_app.service import FastPoll
    from fastpoll_app.store import open_store

    monkeypatch.setattr(store_module, "OUTBOX_GRACE", 0.0)  # rows due at once
    nodes = [start_memcached(), start_memcached()]
    try:
        servers = " ".join(n.addr for n in nodes)
        # One copy per key (with replicas every key would live on both nodes).
        s = make_settings(tmp_path, f"[memcached]\nservers = {servers}\nreplicas = 0\n", app_db)
        fp = FastPoll(s, open_store(s.app), make_cache(s), make_cache(s, 300))
        users: dict[int, int] = {}  # node index -> a user whose key lives there
        for uid in range(100, 200):
            fp.poll(uid, fp.user_key(uid))  # fills its empty answer on its node
            for i, n in enumerate(nodes):
                with socket.create_connection(("127.0.0.1", n.port)) as c:
                    c.sendall(b"get " + fp.user_key(uid) + b"\r\n")
                    if c.recv(4096).startswith(b"VALUE"):
                        users.setdefault(i, uid)
            if len(users) == 2:
                break
        for n in nodes:
            n.freeze()
        try:
            fp.publish(users[1], "on the node that stays hung")  # claimed first (older row)
            fp.publish(users[0], "on the node that comes back")
            assert fp.store.outbox_backlog() == 2
            nodes[0].thaw()
            assert fp.repair_pending() == 1  # one round
            assert b"comes back" in (fp._fill.get(fp.user_key(users[0])) or b"")
        finally:
            for n in nodes:
                n.thaw()
        fp.close()
    finally:
        for n in nodes:
            n.stop()
