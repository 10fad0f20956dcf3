"""PostgreSQL under faults: a user's order held for long fails that
user's requests with 503, not every user's with 500; a hung memcached node no longer takes the
pooled connections of the other nodes' users; connections carry lock and statement timeouts and
TCP keepalives; terminated backends and a real restart give no 500, /healthz says 503 while the
database is down, and a publish whose connection broke after its COMMIT is stored once."""

from __future__ import annotations

import os
import random
import socket
import statistics
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import httpx
import psycopg
import psycopg.sql
import pytest

from fastpoll_app import cache as cache_mod
from fastpoll_app import store as store_mod
from fastpoll_app.cache import make_cache
from fastpoll_app.service import FastPoll
from fastpoll_app.store import ConnectionLost, PgStore, open_store
from fastpoll_testkit.procs import Server, start_memcached

from .conftest import PgServer, app_process, make_settings, postgres

HELD_USER = 4242
HELD_ORDER = (store_mod.PG_ORDER_CLASS, store_mod.order_slot(HELD_USER))  # its lock


def _admin(srv: PgServer) -> psycopg.Connection[tuple[object, ...]]:
    return psycopg.connect(srv.pg.url, password=srv.pg.password, autocommit=True)


@pytest.fixture
def pg(postgres_session: PgServer) -> PgServer:
    postgres_session.empty()
    return postgres_session


def _ini(tmp_path: Path, memcached: Server, srv: PgServer) -> Path:
    ini = tmp_path / "f.ini"
    ini.write_text(
        f"[memcached]\nservers = {memcached.addr}\n[app]\n{srv.app_lines}open_api = true\n"
    )
    return ini


def _publish(base: str, user_id: int, text: str = "t") -> tuple[int, float, httpx.Headers]:
    start = time.perf_counter()
    r = httpx.post(f"{base}/api/messages", json={"user_id": user_id, "text": text}, timeout=60)
    return r.status_code, time.perf_counter() - start, r.headers


def test_a_held_user_lock_fails_only_that_users_requests(
    pg: PgServer, memcached: Server, tmp_path: Path
) -> None:
    """psql holds one user's advisory lock; 40 publishes to that user arrive at once. Before:
    each waited on the lock with a pooled connection, the pool (20) ran dry, and publishes to
    other users failed with 500 after 5 s. Now the user's requests wait in the process (at most
    8) or on the lock (lock_timeout) and get 503 with Retry-After; other users are not held up."""
    with app_process(_ini(tmp_path, memcached, pg)) as base, _admin(pg) as psql:
        psql.execute("SELECT pg_advisory_lock(%s, %s)", HELD_ORDER)
        with ThreadPoolExecutor(40) as pool:
            held = [pool.submit(_publish, base, HELD_USER) for _ in range(40)]
            time.sleep(0.5)  # they are all in
            others = [_publish(base, 1000 + i) for i in range(30)]
            results = [f.result() for f in held]
        psql.execute("SELECT pg_advisory_unlock(%s, %s)", HELD_ORDER)
        assert [s for s, _, _ in others] == [201] * len(others)
        slowest = max(t for _, t, _ in others)
        assert slowest < 2.0, f"another user's publish took {slowest:.2f} s"
        assert {s for s, _, _ in results} == {503}, [s for s, _, _ in results]
        assert all(h.get("retry-after") == "1" for _, _, h in results)
        assert max(t for _, t, _ in results) < store_mod.USER_WAIT_S * 2 + 2
        assert _publish(base, HELD_USER)[0] == 201  # free again


def test_connections_carry_timeouts_and_keepalives(pg: PgServer, tmp_path: Path) -> None:
    settings = make_settings(tmp_path, "", pg.app_lines)
    store = open_store(settings.app)
    assert isinstance(store, PgStore)
    try:
        with store._conn() as conn:
            shown = {
                name: conn.execute(f"SHOW {name}").fetchone()[0]
                for name in ("lock_timeout", "statement_timeout")
            }
            with socket.socket(fileno=os.dup(conn.fileno())) as sock:
                opts = {
                    "keepalive": sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE),
                    "idle": sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE),
                    "interval": sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL),
                    "count": sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT),
                }
    finally:
        store.close()
    assert shown == {"lock_timeout": "3s", "statement_timeout": "10s"}
    # A vanished peer is noticed within idle + interval x count seconds.
    assert opts == {"keepalive": 1, "idle": 5, "interval": 2, "count": 3}


@pytest.fixture
def three_nodes() -> Iterator[list[Server]]:
    nodes = [start_memcached() for _ in range(3)]
    yield nodes
    for n in nodes:
        n.stop()  # SIGCONT first


def test_a_hung_node_slows_only_its_own_users(
    pg: PgServer, three_nodes: list[Server], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """memcached node 0 hangs (SIGSTOP) while 12 threads keep publishing to users with a copy
    on it; a user whose two nodes are healthy publishes meanwhile. Each write to the hung node
    holds the user's order and a pooled connection until the publish timeout (1 s). Before, all
    of them did, the pool (6 here, 20 in production: PG_POOL_MAX) ran dry, and the healthy
    user's publishes waited for a connection (median ~1 s; the issue measured 1,270 ms against
    9 ms). Now at most SUSPECT_IN_FLIGHT writes per client wait on a node that failed; the rest
    are `pending` at once (the outbox rewrites them)."""
    monkeypatch.setattr(store_mod, "PG_POOL_MAX", 6)
    servers = " ".join(n.addr for n in three_nodes)
    settings = make_settings(
        tmp_path, f"[memcached]\nservers = {servers}\nreplicas = 1\n", pg.app_lines
    )
    fp = FastPoll(
        settings, open_store(settings.app), make_cache(settings), make_cache(settings, 1000)
    )
    placement = cache_mod.Placement(tuple(n.addr for n in three_nodes), 1)
    on_hung: list[int] = []
    healthy: list[int] = []
    for uid in range(1, 300):
        nodes = placement.nodes(fp.user_key(uid))
        (on_hung if three_nodes[0].addr in nodes else healthy).append(uid)
    placement.close()
    stop = threading.Event()

    def publish_to_hung(k: int) -> None:
        for i in range(10_000):  # bounded; ends when stopped
            if stop.is_set():
                return
            fp.publish(on_hung[(k + 12 * i) % len(on_hung)], "h")
            time.sleep(0.2)

    def timed(n: int) -> list[float]:
        took = []
        for i in range(n):
            start = time.perf_counter()
            _, written = fp.publish(healthy[i % len(healthy)], "ok")
            took.append(time.perf_counter() - start)
            assert written
        return took

    try:
        before = timed(20)
        three_nodes[0].freeze()
        threads = [threading.Thread(target=publish_to_hung, args=(k,)) for k in range(12)]
        for t in threads:
            t.start()
        try:
            time.sleep(1.5)  # past the first wave: every thread waited for the timeout once
            during = timed(30)
        finally:
            stop.set()
            for t in threads:
                t.join(30)
    finally:
        fp.close()
    med_before, med_during = statistics.median(before), statistics.median(during)
    print(
        f"\nhealthy users' publishes: median {med_before * 1000:.1f} ms before, "
        f"{med_during * 1000:.1f} ms (max {max(during) * 1000:.0f} ms) with node 0 hung"
    )
    assert med_during < max(0.15, 4 * med_before), [round(t * 1000) for t in during]
    assert max(during) < 0.9, [round(t * 1000) for t in during]


def test_pg_terminate_backend_gives_no_500(pg: PgServer, memcached: Server, tmp_path: Path) -> None:
    """Every backend of the app's pools is terminated between two bursts of publishes. Before:
    21 of the next 136 publishes got 500 (pooled connections that had died). Now the pool checks
    a connection before handing it out, and a publish whose connection dies under it is retried
    on a new one: all 201, each message stored once."""
    with app_process(_ini(tmp_path, memcached, pg), workers=2) as base, _admin(pg) as psql:
        with ThreadPoolExecutor(8) as pool:
            warm = list(pool.map(lambda i: _publish(base, i % 17)[0], range(64)))
            assert warm == [201] * 64
            killed = psql.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            ).fetchone()
            assert killed is not None and int(str(killed[0])) >= 2
            after = list(pool.map(lambda i: _publish(base, i % 17, f"m{i}")[0], range(136)))
        assert after.count(500) == 0 and after == [201] * 136, after
        stored = psql.execute("SELECT count(*) FROM messages WHERE text LIKE 'm%'").fetchone()
        assert stored is not None and stored[0] == 136


def test_a_publish_whose_commit_answer_was_lost_is_stored_once(
    pg: PgServer, memcached: Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The connection breaks after COMMIT reached the server (its answer lost): the retry finds
    the first attempt's message and writes the cache for it, instead of storing it twice."""
    settings = make_settings(tmp_path, f"[memcached]\nservers = {memcached.addr}\n", pg.app_lines)
    fp = FastPoll(settings, open_store(settings.app), make_cache(settings), make_cache(settings))
    real_write = store_mod._PgSession.write
    broken = [0]

    def write_then_lose_the_answer(self: store_mod._PgSession) -> Iterator[store_mod.Tx]:
        with real_write(self) as tx:
            yield tx
        if not broken[0]:
            broken[0] += 1
            raise ConnectionLost("server closed the connection unexpectedly")

    monkeypatch.setattr(store_mod._PgSession, "write", contextmanager(write_then_lose_the_answer))
    try:
        msg, written = fp.publish(7, "once")
        assert broken == [1] and written is True
        assert fp.store.get_message(msg.id) == msg
        one = b'{"id":%d,"text":"once"}' % msg.id
        want = b'{"unread":1,"newest":%s,"messages":[%s]}' % (one, one)
        assert fp.store.poll_answer(7) == want
        assert fp._fill.get(fp.user_key(7)) == fp.store.poll_answer(7)
    finally:
        fp.close()
    with _admin(pg) as psql:
        assert psql.execute("SELECT count(*) FROM messages").fetchone() == (1,)


def test_a_postgresql_restart_gives_503_then_recovers(memcached: Server, tmp_path: Path) -> None:
    """The database is stopped (fast shutdown) for a few seconds and started again. Before: 24
    of 240 publishes got 500 and /healthz stayed 200. Now, while it is down, a publish gets 503
    (Retry-After) and /healthz 503; after, both succeed, with no 500 at any time."""
    with postgres(tmp_path) as srv, app_process(_ini(tmp_path, memcached, srv)) as base:
        assert _publish(base, 1)[0] == 201
        srv.stop()
        down: list[int] = []
        health_down: list[int] = []
        end = time.monotonic() + 4
        while time.monotonic() < end:
            down.append(_publish(base, 2)[0])
            health_down.append(httpx.get(f"{base}/healthz", timeout=30).status_code)
        srv.start()
        up: list[int] = []
        deadline = time.monotonic() + 40
        while time.monotonic() < deadline and up[-3:] != [201, 201, 201]:
            up.append(_publish(base, 3)[0])
        health_up = httpx.get(f"{base}/healthz", timeout=30).status_code
    assert set(down) == {503}, down
    assert set(health_down) == {503}, health_down
    assert up[-3:] == [201, 201, 201] and set(up) <= {201, 503}, up
    assert health_up == 200


def _advisory_locks(psql: psycopg.Connection[tuple[object, ...]], granted: bool = True) -> int:
    """Advisory locks held (or waited for) by every session but `psql`'s."""
    row = psql.execute(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted = %s "
        "AND pid <> pg_backend_pid()",
        (granted,),
    ).fetchone()
    assert row is not None
    return int(str(row[0]))


def _batch(base: str, users: list[int]) -> httpx.Response:
    items = [{"user_id": u, "text": "b"} for u in users]
    return httpx.post(f"{base}/api/messages/batch", json={"items": items}, timeout=60)


def test_a_batch_that_times_out_on_one_order_lets_go_of_the_others(
    pg: PgServer, memcached: Server, tmp_path: Path
) -> None:
    """User 30's order is held from outside (another store, its own connection); a batch to
    users 10, 20 and 30 takes 10's and 20's, waits lock_timeout for 30's and answers 503.
    Before, its connection went back to the pool still holding 10's and 20's locks, and every
    later publish to them answered 503 after 3 s. Now the batch lets go of all it took."""
    outside = PgStore(make_settings(tmp_path, "", pg.app_lines).app)
    with app_process(_ini(tmp_path, memcached, pg)) as base, _admin(pg) as psql:
        try:
            with outside.user(30):
                start = time.perf_counter()
                r = _batch(base, [10, 20, 30])
                took = time.perf_counter() - start
        finally:
            outside.close()
        assert r.status_code == 503 and r.headers.get("retry-after") == "1", r.text
        assert store_mod.USER_WAIT_S <= took < store_mod.USER_WAIT_S + 2, took
        assert _advisory_locks(psql) == 0
        for uid in (10, 20):
            status, t, _ = _publish(base, uid)
            assert status == 201 and t < 1.0, (uid, status, t)
        assert _advisory_locks(psql) == 0


# What a batch may hold, whatever its size: PostgreSQL's lock table is shared by every session.
BATCH_LOCK_BOUND = 1024


def test_a_burst_of_large_batches_holds_a_bounded_number_of_locks(
    pg: PgServer, memcached: Server, tmp_path: Path
) -> None:
    """4 clients send 1,000-user batches for 5 s while another user publishes alone every
    100 ms. Before, every batch held a lock per user: 4 clients held up to 4,000 at once (32
    reached 23,212 and "out of shared memory"). Now the locks held by all sessions together stay
    within BATCH_LOCK_BOUND at every sample, none is left after, and the lone user's publishes
    (whose order may share a slot with a batch's) all succeed."""
    stop = threading.Event()
    peak = [0]

    def sample(psql: psycopg.Connection[tuple[object, ...]]) -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], _advisory_locks(psql))
            time.sleep(0.02)

    def batches(seed: int) -> list[int]:
        rng = random.Random(seed)
        statuses = []
        while not stop.is_set():
            statuses.append(_batch(base, rng.sample(range(1000, 1_000_000), 1000)).status_code)
        return statuses

    def alone() -> list[tuple[int, float]]:
        out = []
        while not stop.is_set():
            status, took, _ = _publish(base, 7)
            out.append((status, took))
            time.sleep(0.1)
        return out

    with app_process(_ini(tmp_path, memcached, pg)) as base, _admin(pg) as psql:
        with _admin(pg) as sampler_conn, ThreadPoolExecutor(6) as pool:
            sampler = pool.submit(sample, sampler_conn)
            clients = [pool.submit(batches, seed) for seed in range(4)]
            lone = pool.submit(alone)
            time.sleep(5)
            stop.set()
            statuses = [s for c in clients for s in c.result()]
            singles = lone.result()
            sampler.result()
        left = _advisory_locks(psql)
    print(
        f"\n{len(statuses)} batches {statuses.count(201)} ok, peak {peak[0]} advisory locks, "
        f"lone user's publishes: {len(singles)}, slowest {max(t for _, t in singles):.2f} s"
    )
    assert peak[0] <= BATCH_LOCK_BOUND, peak[0]
    assert left == 0
    assert set(statuses) <= {201, 503} and statuses.count(201) > 0, statuses
    assert singles and {s for s, _ in singles} == {201}, singles


def test_a_database_that_refuses_writes_is_unavailable_until_it_takes_them(
    pg: PgServer, memcached: Server, tmp_path: Path
) -> None:
    """default_transaction_read_only is turned on (as a standby behind a VIP, or maintenance)
    and the backends terminated so that new sessions take it. Before, every publish answered
    500 and /healthz 200. Now a publish is 503 with Retry-After and /healthz 503; once it is
    off again, publishes succeed within a few seconds and /healthz is 200."""
    with app_process(_ini(tmp_path, memcached, pg)) as base, _admin(pg) as psql:
        assert _publish(base, 1)[0] == 201
        row = psql.execute("SELECT current_database()").fetchone()
        assert row is not None
        db = psycopg.sql.Identifier(str(row[0]))
        terminate = (
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        read_only = psycopg.sql.SQL("ALTER DATABASE {} SET default_transaction_read_only = on")
        writable = psycopg.sql.SQL("ALTER DATABASE {} RESET default_transaction_read_only")
        try:
            psql.execute(read_only.format(db))
            psql.execute(terminate)
            refused = [_publish(base, 2) for _ in range(3)]
            health = httpx.get(f"{base}/healthz", timeout=30)
        finally:
            psql.execute(writable.format(db))
        assert [s for s, _, _ in refused] == [503] * 3, refused
        assert all(h.get("retry-after") for _, _, h in refused)
        assert health.status_code == 503, health.text
        start = time.monotonic()
        up: list[int] = []
        while time.monotonic() - start < 10 and up[-1:] != [201]:
            up.append(_publish(base, 3)[0])
            time.sleep(0.1)
        took = time.monotonic() - start
        assert up[-1:] == [201] and set(up) <= {201, 503} and took < 5, (up, took)
        assert httpx.get(f"{base}/healthz", timeout=30).status_code == 200
