"""A rolling upgrade keeps the previous release correct, not only running (docs/deploy.md, "A
rolling upgrade"): during an app rollout an earlier release's app shares the database with the
new one, after the new one migrated the schema, and both write and repair. Each release named in
RELEASES runs here beside this tree's app on one PostgreSQL, and its repair loop takes every
outbox row it can see while this tree's app is stopped: what it repairs must be right, and what
it cannot repair must stay for this tree's app.

Every schema change adds the release before it to RELEASES (fastpoll_testkit.releases).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from fastpoll_app import channels, keys
from fastpoll_app.store import ORDERS_REFRESH_S
from fastpoll_testkit.procs import wait_for
from fastpoll_testkit.releases import RELEASES, extract
from fastpoll_testkit.stack import VENV_PYTHON, Stack, memcached_ask

HAS_CHANNELS = {"before-channel-outbox", "before-data"}
HAS_SLOTS = {"before-data"}  # it holds the orders by slot alone, as this tree does (contracted)
ROOM = "lobby"


@pytest.fixture(scope="module", params=sorted(RELEASES))
def stack(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    tree = extract(RELEASES[request.param], tmp_path_factory.mktemp(f"release-{request.param}"))
    s = Stack(
        run_dir=tmp_path_factory.mktemp(f"mixed-{request.param}"),
        n_pollers=1,
        db="postgresql",
        apps=2,
        app_trees={1: tree},
    )
    s.release = request.param  # type: ignore[attr-defined]
    try:
        s.start()
        yield s
    finally:
        s.stop()


def cached(stack: Stack, key: bytes) -> bytes | None:
    raw = memcached_ask(stack.memcached_ports[0], b"get " + key)
    if not raw.startswith(b"VALUE "):
        return None
    head, _, rest = raw.partition(b"\r\n")
    size = int(head.split()[3])
    return rest[:size]


def newest_id(stack: Stack, key: bytes) -> int:
    value = cached(stack, key)
    if not value:
        return 0
    doc = json.loads(value)
    if "messages" in doc:
        return max(m["id"] for m in doc["messages"])
    return int(doc["newest"]["id"]) if doc.get("newest") else 0


def newest_room_id(stack: Stack) -> int:
    value = cached(stack, channels.channel_key(b"/Poll", ROOM.encode()))
    if not value:
        return 0
    return max(m["id"] for m in json.loads(value)["messages"])


def connect(stack: Stack) -> Any:
    import psycopg

    url = stack.ini_sections()["app"]["database"]
    password = (stack.run_dir / "pg.pass").read_text().strip()
    return psycopg.connect(url, password=password, autocommit=True)


def outbox_rows(stack: Stack) -> int:
    """Rows waiting in every outbox table of the schema."""
    with connect(stack) as conn:
        tables = conn.execute(
            "SELECT tablename FROM pg_tables WHERE tablename LIKE '%outbox'"
        ).fetchall()
        return sum(
            int(conn.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0])  # noqa: S608
            for (t,) in tables
        )


def signal_group(stack: Stack, name: str, sig: int) -> None:
    """The app's process group: its master and its workers (started in a session of their own)."""
    os.killpg(stack.procs[name].pid, sig)


def sessions_holding(stack: Stack, name: str) -> int:
    """The app `name`'s database sessions (the stack sets PGAPPNAME) that hold an advisory lock
    or are inside a transaction. A transaction holds row locks: a repair loop frozen between its
    claim's UPDATE and its COMMIT keeps the claimed rows locked, and every other app's claim
    (FOR UPDATE SKIP LOCKED) passes over them until it is thawed."""
    with connect(stack) as conn:
        row = conn.execute(
            "SELECT COUNT(*) FROM pg_stat_activity a WHERE a.application_name = %s AND ("
            " a.xact_start IS NOT NULL OR EXISTS (SELECT 1 FROM pg_locks l"
            " WHERE l.pid = a.pid AND l.locktype = 'advisory' AND l.granted))",
            (name,),
        ).fetchone()
        return int(row[0])


def freeze_between_repairs(stack: Stack, name: str) -> None:
    """SIGSTOP the app `name` when it holds no owner's lock and no transaction is open. Its
    repair loop holds the owner's lock for a repair's cache write, and its claim locks the rows it
    takes until it commits: frozen in either, it would keep them from every other app until it is
    thawed, which is a test's freeze, not the upgrade's state. The caches must be answering, so
    that a repair in flight ends."""
    deadline = time.monotonic() + 15
    while True:
        signal_group(stack, name, signal.SIGSTOP)
        if sessions_holding(stack, name) == 0:
            return
        signal_group(stack, name, signal.SIGCONT)
        assert time.monotonic() < deadline, f"{name} kept a lock or a transaction for 15 s"
        time.sleep(0.2)


def test_a_room_repaired_beside_an_earlier_release_is_fresh(stack: Stack) -> None:
    with stack.api(0) as api:
        r = api.post(f"/api/channels/{ROOM}/messages", json={"text": "first"})
        assert r.status_code == 201, r.text
    memcached = stack.procs["memcached-0"].pid
    os.kill(memcached, signal.SIGSTOP)
    try:
        with stack.api(0, timeout=30) as api:
            r = api.post(f"/api/channels/{ROOM}/messages", json={"text": "while the cache hangs"})
        assert r.status_code == 201, r.text
        assert r.headers.get("x-cache-publish") == "pending", r.headers
        newest = r.json()["id"]
    finally:
        os.kill(memcached, signal.SIGCONT)
    # This tree's app stops between repairs, before its loop may take the row (OUTBOX_GRACE):
    # only the earlier release's loop runs now.
    freeze_between_repairs(stack, "app")
    try:
        # Long enough for the earlier release to claim and repair every row it sees
        # (grace 2 s, back-off up to 1 s, its loop every 1 s).
        time.sleep(6)
        wrong = keys.derive_key(b"/Poll", b"/getMessages?user_id=-1", [b"user_id"])
        assert cached(stack, wrong) is None, "the earlier release wrote a room as a user's key"
    finally:
        signal_group(stack, "app", signal.SIGCONT)
    wait_for(
        "the room's cached answer to hold the newest message",
        lambda: newest_room_id(stack) == newest,
        timeout=15,
    )
    wait_for("the outbox to drain", lambda: outbox_rows(stack) == 0, timeout=15)


def test_an_earlier_release_publishes_and_the_new_one_serves_it(stack: Stack) -> None:
    """Writes through the earlier release's app are answered through nginx, fresh."""
    uid = 7
    with stack.api(1) as api:
        r = api.post("/api/messages", json={"user_id": uid, "text": "from the earlier release"})
        assert r.status_code in (200, 201), r.text
    url = stack.poll_url(uid)
    with httpx.Client(base_url=stack.base_url, timeout=10) as client:
        body = client.get(url).content
    assert b"from the earlier release" in body


def test_data_is_refused_by_an_earlier_release_and_listed_by_the_new_one(stack: Stack) -> None:
    """docs/deploy.md: a site sends data once every app host is upgraded. Before that, an
    earlier release refuses a publish with data (an unknown field: nothing stored, never
    silently dropped), and what the new one stores is listed through nginx with its data."""
    uid = 13
    body = {"user_id": uid, "text": "with data", "data": {"n": 1, "tags": ["a"]}}
    with stack.api(1) as api:
        r = api.post("/api/messages", json=body)
        assert r.status_code == 400 and "data" in r.json()["error"], r.text
    with stack.api(0) as api:
        r = api.post("/api/messages", json=body)
        assert r.status_code == 201, r.text
    with httpx.Client(base_url=stack.base_url, timeout=10) as client:
        answer = client.get(stack.poll_url(uid)).json()
    assert answer["messages"] == [{"id": r.json()["id"], "text": "with data", "data": body["data"]}]


def test_rows_an_earlier_release_left_are_repaired_by_the_new_one(stack: Stack) -> None:
    """The earlier release's writes that missed the cache, repaired by this tree's app alone."""
    uid = 11
    targets = [
        (
            "/api/messages",
            {"user_id": uid},
            keys.derive_key(b"/Poll", f"/getMessages?user_id={uid}".encode(), [b"user_id"]),
        )
    ]
    if stack.release in HAS_CHANNELS:  # type: ignore[attr-defined]
        room = "patio"
        targets.append(
            (f"/api/channels/{room}/messages", {}, channels.channel_key(b"/Poll", room.encode()))
        )
    memcached = stack.procs["memcached-0"].pid
    newest: list[int] = []
    os.kill(memcached, signal.SIGSTOP)
    try:
        with stack.api(1, timeout=30) as api:
            for path, body, _ in targets:
                r = api.post(path, json={**body, "text": "while the cache hangs"})
                assert r.status_code == 201, r.text
                newest.append(r.json()["id"])
    finally:
        os.kill(memcached, signal.SIGCONT)
    freeze_between_repairs(stack, "app-1")
    try:
        for (_, _, key), want in zip(targets, newest, strict=True):

            def repaired(key: bytes = key, want: int = want) -> bool:
                return newest_id(stack, key) == want

            wait_for(f"{key!r} repaired by this tree's app", repaired, timeout=15)
        wait_for("the outbox to drain", lambda: outbox_rows(stack) == 0, timeout=15)
    finally:
        signal_group(stack, "app-1", signal.SIGCONT)


def publish_while_held(stack: Stack, uid: int, hold_s: float) -> tuple[float, int]:
    """A publish of `uid` through this tree's app while the user id's own advisory lock (the
    order as an earlier release holds it) is taken for hold_s: (its latency, its status)."""
    with connect(stack) as conn:
        conn.execute("SELECT pg_advisory_lock(%s)", (uid,))
        out: dict[str, Any] = {}

        def publish() -> None:
            t0 = time.monotonic()
            with stack.api(0) as api:
                r = api.post("/api/messages", json={"user_id": uid, "text": "ordered"})
            out["took"], out["status"] = time.monotonic() - t0, r.status_code

        th = threading.Thread(target=publish)
        th.start()
        th.join(hold_s)
        conn.execute("SELECT pg_advisory_unlock(%s)", (uid,))
        th.join(15)
    return out["took"], out["status"]


def test_a_user_is_ordered_against_the_earlier_releases_lock_until_contracted(
    stack: Stack,
) -> None:
    """Until `migrate --contract`, a write of this tree's app waits for the lock an earlier
    release takes on the user id; after it, the user's slot alone orders it."""
    if stack.release in HAS_SLOTS:  # type: ignore[attr-defined]
        pytest.skip("this release takes no lock on the user id: nothing to order against")
    took, status = publish_while_held(stack, 23, 1.0)
    assert status == 201 and took >= 1.0, (
        f"the publish did not wait for the earlier release's order ({took:.2f} s, {status})"
    )
    migrate(stack, "--contract", "contracted: orders held as slot")
    took, status = publish_while_held(stack, 23, 1.0)
    assert status == 201 and took < 1.0, f"contracted, the publish still waited ({took:.2f} s)"
    # Before a rollback to such a release: both again.
    migrate(stack, "--expand", "expanded: orders held as user+slot")
    took, status = publish_while_held(stack, 23, 1.0)
    assert status == 201 and took >= 1.0, f"expanded, the publish did not wait ({took:.2f} s)"


def migrate(stack: Stack, flag: str, says: str) -> None:
    """This tree's migrate with `flag`, then long enough for every worker to read the result."""
    r = subprocess.run(
        [str(VENV_PYTHON), "-m", "fastpoll_app", "migrate", flag, "--config", str(stack.ini_path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert r.returncode == 0 and says in r.stderr, r.stderr
    time.sleep(ORDERS_REFRESH_S + 0.5)
