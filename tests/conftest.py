"""Fixtures: real stacks (testkit/fastpoll_testkit/stack.py, the harness `make up` uses) on free
loopback ports."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from fastpoll_testkit.helpers import Cache, http_client, start_stack
from fastpoll_testkit.stack import SANITIZER_REPORT, Stack


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
