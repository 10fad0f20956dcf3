"""Fixtures: real memcached and redis-server on free loopback ports, a temp SQLite."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from fastpoll_app import config
from fastpoll_app.app import create_app

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


def make_settings(tmp_path: Path, text: str) -> config.Settings:
    db = tmp_path / "messages.db"
    return config.parse(f"[app]\ndatabase = {db}\n{text}", "test.ini")


@pytest.fixture(params=["memcached", "redis"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, Server]]:
    """Each test using it runs once per cache backend."""
    fixture = "memcached" if request.param == "memcached" else "redis_server"
    yield request.param, request.getfixturevalue(fixture)


@pytest.fixture
def settings(backend: tuple[str, Server], tmp_path: Path) -> config.Settings:
    name, srv = backend
    if name == "memcached":
        text = f"[cache]\nbackend = memcached\n[memcached]\nservers = {srv.addr}\n"
    else:
        text = f"[cache]\nbackend = redis\n[redis]\nserver = {srv.addr}\n"
    return make_settings(tmp_path, text)


@pytest.fixture
def client(settings: config.Settings) -> Iterator[TestClient]:
    with TestClient(create_app(settings)) as c:
        yield c
