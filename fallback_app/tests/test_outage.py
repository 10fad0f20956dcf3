"""Cache down or hung: polls and publishes still answer, the cache heals after."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from fastpoll_app.app import create_app

from .conftest import Server, make_settings, start_memcached, start_redis

KEY = b"/Poll/getMessages?user_id=9"


@pytest.fixture(params=["memcached", "redis"])
def own_server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, Server]]:
    """A cache process of this test's own, so the test may stop it."""
    srv = start_memcached() if request.param == "memcached" else start_redis(tmp_path)
    yield request.param, srv
    if srv.proc is not None and srv.proc.poll() is None:
        os.kill(srv.proc.pid, signal.SIGCONT)
    srv.stop()


@pytest.fixture
def outage_client(own_server: tuple[str, Server], tmp_path: Path) -> Iterator[TestClient]:
    name, srv = own_server
    section = (
        f"[memcached]\nservers = {srv.addr}"
        if name == "memcached"
        else (f"[redis]\nserver = {srv.addr}")
    )
    s = make_settings(tmp_path, f"[cache]\nbackend = {name}\n{section}\n")
    with TestClient(create_app(s)) as c:
        yield c


def wait_until(cond: object, seconds: float = 20.0) -> bool:
    """Poll a condition; a bound, not a timing assumption."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if cond():  # type: ignore[operator]
            return True
        time.sleep(0.1)
    return False


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
    assert wait_until(lambda: fp.repair_pending() == 0), "repair never succeeded"
    assert fp._fill.get(KEY) == fp.store.poll_answer(9)
    assert b"while down" in fp._fill.get(KEY)

    # Fills work again without restarting anything.
    def filled() -> bool:
        assert c.get("/Poll/getMessages?user_id=10").status_code == 200
        return fp._fill.get(b"/Poll/getMessages?user_id=10") == b""

    assert wait_until(filled), "fills never resumed"


def test_hung_cache_publish_is_repaired(
    outage_client: TestClient, own_server: tuple[str, Server]
) -> None:
    """A hung node keeps its old value; the repair must overwrite it."""
    c = outage_client
    fp = c.app.state.fastpoll  # type: ignore[attr-defined]
    _, srv = own_server
    c.get("/Poll/getMessages?user_id=9")
    assert fp._fill.get(KEY) == b""
    assert srv.proc is not None
    os.kill(srv.proc.pid, signal.SIGSTOP)
    try:
        r = c.post("/api/messages", json={"user_id": 9, "text": "during hang"})
        assert r.status_code == 201
        assert r.headers["x-cache-publish"] == "pending"
        assert c.get("/Poll/getMessages?user_id=9").status_code == 200
    finally:
        os.kill(srv.proc.pid, signal.SIGCONT)
    assert wait_until(lambda: fp.repair_pending() == 0), "repair never succeeded"
    assert b"during hang" in fp._fill.get(KEY)
