"""Fixtures: real memcached, redis-server and PostgreSQL on free loopback ports, a temp SQLite.

Tests that take `settings` (or `client`) run once per cache backend and once per store
(`app_db`: SQLite, PostgreSQL), the same test against both."""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from starlette.testclient import TestClient

from fastpoll_app import config
from fastpoll_app.app import create_app
from fastpoll_testkit.procs import Server, free_port, start_memcached, start_redis
from fastpoll_testkit.stack import PG_BIN, Postgres  # the one harness's PostgreSQL

REPO_ROOT = Path(__file__).resolve().parents[2]


def _need(binary: str) -> str:
    path = shutil.which(binary) or (
        f"/usr/bin/{binary}" if os.path.exists(f"/usr/bin/{binary}") else None
    )
    if path is None:
        pytest.skip(f"{binary} not installed")
    return path


@pytest.fixture(scope="session")
def memcached_session() -> Iterator[Server]:
    srv = start_memcached(binary=_need("memcached"))
    yield srv
    srv.stop()


@pytest.fixture(scope="session")
def redis_session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = start_redis(dir=tmp_path_factory.mktemp("redis"), binary=_need("redis-server"))
    yield srv
    srv.stop()


def _flush(srv: Server, command: bytes) -> None:
    with socket.create_connection(("127.0.0.1", srv.port), timeout=5) as s:
        s.sendall(command)
        s.recv(100)


@pytest.fixture
def memcached(memcached_session: Server) -> Server:
    """The session's memcached, emptied."""
    _flush(memcached_session, b"flush_all\r\n")
    return memcached_session


@pytest.fixture
def redis_server(redis_session: Server) -> Server:
    """The session's redis-server, emptied."""
    _flush(redis_session, b"FLUSHALL\r\n")
    return redis_session


@dataclass
class PgServer:
    pg: Postgres
    password_file: Path
    log: Path

    def __post_init__(self) -> None:
        # Stopped by a fast shutdown (SIGINT): sessions are ended, as in a restart.
        self.server = Server(
            "postgres", self.pg.argv(), self.pg.port, log=self.log, ready=self.pg.ready,
            timeout=30, stop_signal=signal.SIGINT, stop_timeout=30, user=self.pg.run_as, cwd="/",
        )  # fmt: skip

    @property
    def app_lines(self) -> str:
        return f"database = {self.pg.url}\ndatabase_password_file = {self.password_file}\n"

    def start(self) -> None:
        """Start the server (again: the same data directory and port) and wait until ready."""
        self.server.start()

    def stop(self) -> None:
        """Fast shutdown (SIGINT): sessions are ended, as in a restart."""
        self.server.stop()

    def empty(self) -> None:
        import psycopg

        with psycopg.connect(self.pg.url, password=self.pg.password, autocommit=True) as conn:
            conn.execute(
                "TRUNCATE messages, users, outbox, channel_outbox, channels RESTART IDENTITY"
            )


@contextmanager
def postgres(workdir: Path) -> Iterator[PgServer]:
    """A PostgreSQL server of its own, started, its database created and migrated; removed at
    the end."""
    if not (PG_BIN / "postgres").exists():
        pytest.skip(f"PostgreSQL not installed ({PG_BIN})")
    from fastpoll_app.store import PgStore

    pg = Postgres(free_port(), secrets.token_hex(16))
    pg.init()
    pw = workdir / "pg.pass"
    pw.write_text(pg.password + "\n")
    pw.chmod(0o600)
    srv = PgServer(pg, pw, workdir / "postgres.log")
    try:
        srv.start()
        pg.create_db()
        store = PgStore(config.parse(f"[app]\n{srv.app_lines}").app, check_schema=False)
        store.migrate()
        store.close()
        yield srv
    finally:
        srv.stop()
        pg.remove()


@pytest.fixture(scope="session")
def postgres_session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PgServer]:
    """One PostgreSQL for the session, migrated once; `app_db` empties it per test."""
    with postgres(tmp_path_factory.mktemp("pg")) as srv:
        yield srv


@pytest.fixture(params=["sqlite", "postgresql"])
def app_db(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The [app] lines of this test's empty database, once per store."""
    if request.param == "sqlite":
        return f"database = {tmp_path / 'messages.db'}\n"
    srv: PgServer = request.getfixturevalue("postgres_session")
    srv.empty()
    return srv.app_lines


def make_settings(tmp_path: Path, text: str, app_lines: str | None = None) -> config.Settings:
    """Settings on `app_lines`' database (default: a SQLite file in tmp_path)."""
    if app_lines is None:
        app_lines = f"database = {tmp_path / 'messages.db'}\n"
    return config.parse(f"[app]\n{app_lines}{text}", "test.ini")


@pytest.fixture(params=["memcached", "redis"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, Server]]:
    """Each test using it runs once per cache backend."""
    fixture = "memcached" if request.param == "memcached" else "redis_server"
    yield request.param, request.getfixturevalue(fixture)


@pytest.fixture
def settings(backend: tuple[str, Server], app_db: str, tmp_path: Path) -> config.Settings:
    name, srv = backend
    if name == "memcached":
        text = f"[cache]\nbackend = memcached\n[memcached]\nservers = {srv.addr}\n"
    else:
        text = f"[cache]\nbackend = redis\n[redis]\nserver = {srv.addr}\n"
    return make_settings(tmp_path, text, app_db)


@pytest.fixture
def client(settings: config.Settings) -> Iterator[TestClient]:
    with TestClient(create_app(settings)) as c:
        yield c


@contextmanager
def app_process(ini: Path, workers: int = 1, args: tuple[str, ...] = ()) -> Iterator[str]:
    """`python -m fastpoll_app` on `ini` and a free port, until it answers /healthz 200; yields
    its base URL; at the end SIGTERM, which it must exit on cleanly. Its stderr goes to app.log next
    to `ini`."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"}
    base = f"http://127.0.0.1:{port}"
    app = Server(
        "the app",
        [sys.executable, "-m", "fastpoll_app", "-c", str(ini), "--port", str(port),
         "--workers", str(workers), *args],
        port, log=ini.parent / "app.log", stdout=False, env=env, timeout=60, stop_timeout=30,
        ready=lambda: httpx.get(base + "/healthz", timeout=1).status_code == 200,
    )  # fmt: skip
    try:
        app.start()
        yield base
    finally:
        rc = app.stop()
    # uvicorn with one worker re-raises the SIGTERM it handled once it has shut down.
    assert rc in (0, -signal.SIGTERM), f"exit {rc} on SIGTERM (app.log)"
