"""Fixtures: real stacks (tools/stack.py, the harness `make up` uses) on free loopback ports."""

from __future__ import annotations

import itertools
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import cast

import httpx
import pylibmc
import pytest
import redis

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))  # the stack harness

from stack import SANITIZER_REPORT, Stack, memcached_stats

_uids = itertools.count(1000)


class Cache:
    """Direct access to the stack's cache, the way the app writes it (same ketama, same keys)."""

    def __init__(self, stack: Stack) -> None:
        self.stack = stack
        self.backend = stack.backend
        if self.backend == "memcached":
            servers = [f"127.0.0.1:{p}" for p in stack.memcached_ports]
            self.mc = pylibmc.Client(servers, binary=False, behaviors={"ketama": True})
        else:
            password = (stack.run_dir / "redis.pass").read_text().strip()
            self.r = redis.Redis(
                host="127.0.0.1", port=stack.redis_port, password=password
            )

    def set(self, key: str, value: bytes) -> None:
        if self.backend == "memcached":
            assert self.mc.set(key, value)
        else:
            self.r.set(key, value)

    def get(self, key: str) -> bytes | None:
        if self.backend == "memcached":
            return self.mc.get(key)
        # redis-py's stubs say bytes | str whatever decode_responses is; without it, it is bytes.
        return cast("bytes | None", self.r.get(key))

    def delete(self, key: str) -> None:
        if self.backend == "memcached":
            self.mc.delete(key)
        else:
            self.r.delete(key)

    def gets_served(self) -> int:
        """How many reads the cache servers have answered, summed over every node."""
        if self.backend == "memcached":
            return sum(
                memcached_stats(p)["cmd_get"] for p in self.stack.memcached_ports
            )
        return int(self.r.info("commandstats").get("cmdstat_get", {}).get("calls", 0))


# nginx keeps a poller's failure mark for fail_timeout (the template's 2 s), compared in whole
# seconds of its clock (ngx_time()): a mark made early in a second lasts up to 3 s. Tests that
# wait for a poller to be back in the rotation wait this long.
NGINX_FAIL_WAIT_S = 3.2


def new_uid() -> int:
    """A user id no other test has touched, so tests never share cache keys."""
    return next(_uids)


def poll_key(uid: int) -> str:
    return f"/Poll/getMessages?user_id={uid}"


class SigningTransport(httpx.HTTPTransport):
    """Signs each poll request it sends, as a client holding a URL from the app's
    POST /api/poll-url would: exp and sig appended (docs/security.md). Through nginx only
    /Poll/ targets are polls; a poll server (direct=True) takes nothing else."""

    def __init__(self, stack: Stack, direct: bool) -> None:
        super().__init__()
        self.stack = stack
        self.direct = direct

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        target = request.url.raw_path.decode("latin-1")
        if self.direct or target.startswith("/Poll/"):
            signed = self.stack.sign(target)
            if signed != target:
                request.url = request.url.copy_with(raw_path=signed.encode("latin-1"))
        return super().handle_request(request)


def http_client(
    stack: Stack, port: int | None = None, sign: bool = True, timeout: float = 10
) -> httpx.Client:
    """A client of nginx, or of the poll server on `port`; it signs its polls unless told not to."""
    base = f"http://127.0.0.1:{port}" if port else stack.base_url
    transport = SigningTransport(stack, direct=port is not None) if sign else None
    return httpx.Client(base_url=base, timeout=timeout, transport=transport)


def poller_metric(stack: Stack, name: str, timeout: float = 30) -> float:
    """One sample of poller 0's /metrics (name with its labels, as printed)."""
    text = httpx.get(f"http://127.0.0.1:{stack.admin_ports[0]}/metrics", timeout=timeout).text
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    raise AssertionError(f"no {name} on /metrics")


def start_stack(tmp: Path, backend: str, **kw) -> Stack:
    stack = Stack(run_dir=tmp, backend=backend, **kw)
    stack.start()
    return stack


@pytest.fixture(scope="session", params=["memcached", "redis"])
def stack(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    """The shared stack for behaviour tests, once per backend. 3 memcached nodes: a small fleet."""
    s = start_stack(
        tmp_path_factory.mktemp(f"stack-{request.param}"), request.param, n_memcached=3
    )
    yield s
    s.stop()


@pytest.fixture(scope="session")
def pg_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """The app tier at fleet shape: two app processes on one PostgreSQL behind the same nginx
    (round robin for misses), 3 memcached nodes. Writes go to either app's own listener."""
    s = start_stack(
        tmp_path_factory.mktemp("stack-pg"),
        "memcached",
        n_memcached=3,
        db="postgresql",
        apps=2,
    )
    yield s
    s.stop()


@pytest.fixture(scope="session")
def cache(stack: Stack) -> Cache:
    return Cache(stack)


@pytest.fixture()
def client(stack: Stack) -> Iterator[httpx.Client]:
    """A client of nginx that signs its polls (test_security.py checks unsigned ones)."""
    with http_client(stack) as c:
        yield c


@pytest.fixture()
def poller(stack: Stack) -> Iterator[httpx.Client]:
    """A client talking to one poll server directly, without nginx; it signs its polls."""
    with http_client(stack, stack.poller_ports[0]) as c:
        yield c


@pytest.fixture(scope="session", autouse=True)
def no_sanitizer_reports(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """After every stack of the session has stopped: no poll server log may hold an ASan,
    UBSan, LeakSanitizer or valgrind report (FP_POLL_SERVER / FP_POLL_WRAPPER runs)."""
    yield
    found: list[str] = []
    for log in sorted(tmp_path_factory.getbasetemp().rglob("poller-*.log")):
        text = log.read_bytes()
        for line in text.splitlines():
            if SANITIZER_REPORT.search(line):
                found.append(f"{log}: {line.decode(errors='replace')}")
        # Under valgrind a poll server that never got to its summary (killed) proves nothing.
        killed = b"SIGKILL" in text or b"signal 9" in text
        if (
            b"Memcheck" in text
            and b"ERROR SUMMARY: 0 errors" not in text
            and not killed
        ):
            found.append(f"{log}: valgrind printed no clean ERROR SUMMARY")
    assert not found, "sanitizer/valgrind reports:\n" + "\n".join(found[:30])


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "soak: long bounded run (1,000,000 requests, about a minute); `make test` runs it, "
        "deselect with -m 'not soak'",
    )
