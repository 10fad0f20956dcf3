"""Fixtures: real memcached, redis-server and PostgreSQL on free loopback ports, a temp SQLite.

Tests that take `settings` (or `client`) run once per cache backend and once per store
(`app_db`: SQLite, PostgreSQL), the same test against both."""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from starlette.testclient import TestClient

from fastpoll_app import config
from fastpoll_app.app import create_app
from fastpoll_testkit.procs import freeze  # noqa: F401  (a SIGSTOP that has taken effect)
from fastpoll_testkit.stack import PG_BIN, Postgres  # the one harness's PostgreSQL

REPO_ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, proc: subprocess.Popen[bytes], deadline: float = 10.0) -> None:
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.02)
    raise RuntimeError(f"port {port} not ready")


@dataclass
class Server:
    argv: list[str]
    port: int
    proc: subprocess.Popen[bytes] | None = None

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        self.proc = subprocess.Popen(self.argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        wait_port(self.port, self.proc)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.proc = None


def _need(binary: str) -> str:
    path = shutil.which(binary) or (
        f"/usr/bin/{binary}" if os.path.exists(f"/usr/bin/{binary}") else None
    )
    if path is None:
        pytest.skip(f"{binary} not installed")
    return path


def start_memcached() -> Server:
    port = free_port()
    argv = [_need("memcached"), "-l", "127.0.0.1", "-p", str(port), "-U", "0", "-m", "16"]
    if os.geteuid() == 0:
        argv += ["-u", "root"]  # memcached refuses to run as root without -u
    srv = Server(argv, port)
    srv.start()
    return srv


def start_redis(workdir: Path) -> Server:
    port = free_port()
    srv = Server(
        [
            _need("redis-server"),
            "--bind", "127.0.0.1",
            "--port", str(port),
            "--save", "",
            "--appendonly", "no",
            "--dir", str(workdir),
        ],
        port,
    )  # fmt: skip
    srv.start()
    return srv


@pytest.fixture(scope="session")
def memcached_session() -> Iterator[Server]:
    srv = start_memcached()
    yield srv
    srv.stop()


@pytest.fixture(scope="session")
def redis_session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = start_redis(tmp_path_factory.mktemp("redis"))
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
    proc: subprocess.Popen[bytes] | None = None

    @property
    def app_lines(self) -> str:
        return f"database = {self.pg.url}\ndatabase_password_file = {self.password_file}\n"

    def start(self) -> None:
        """Start the server (again: the same data directory and port) and wait until ready."""
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                self.pg.argv(), user=self.pg.run_as, cwd="/", stdout=log, stderr=log
            )
        end = time.monotonic() + 30
        while not self.pg.ready():
            if self.proc.poll() is not None or time.monotonic() > end:
                raise RuntimeError(f"postgres did not start (see {self.log})")
            time.sleep(0.1)

    def stop(self) -> None:
        """Fast shutdown (SIGINT): sessions are ended, as in a restart."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            self.proc.wait(30)
        self.proc = None

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
    with open(ini.parent / "app.log", "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "fastpoll_app", "-c", str(ini), "--port", str(port),
             "--workers", str(workers), *args],
            env=env, stdout=subprocess.DEVNULL, stderr=log,
        )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        end = time.monotonic() + 60
        while True:
            try:
                if httpx.get(base + "/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if proc.poll() is not None or time.monotonic() > end:
                raise RuntimeError(f"the app did not come up (see {ini.parent / 'app.log'})")
            time.sleep(0.1)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    # uvicorn with one worker re-raises the SIGTERM it handled once it has shut down.
    assert proc.returncode in (0, -signal.SIGTERM), f"exit {proc.returncode} on SIGTERM (app.log)"
