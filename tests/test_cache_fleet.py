"""Several memcached nodes, a cache that goes away and comes back, and keys that must never reach
it."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from fastpoll_testkit.helpers import Cache, http_client, new_uid, poll_key, start_stack
from fastpoll_testkit.procs import wait_for
from fastpoll_testkit.stack import Stack, memcached_stats


@pytest.fixture(scope="module", params=["memcached", "redis"])
def own_stack(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    """A stack of its own: these tests stop and start cache servers."""
    s = start_stack(
        tmp_path_factory.mktemp(f"faults-{request.param}"), request.param, n_memcached=3
    )
    yield s
    s.stop()


@pytest.mark.parametrize("stack", ["memcached"], indirect=True)
def test_ketama_agreement_app_writes_poller_reads(stack: Stack) -> None:
    own_stack = stack  # ketama is a memcached matter; the shared stack has 3 nodes
    uids = [new_uid() for _ in range(1000)]
    with http_client(own_stack) as c:
        for uid in uids:  # every one a miss: the app fills it through pylibmc's ketama
            r = c.get(f"/Poll/getMessages?user_id={uid}")
            assert (r.status_code, r.headers["x-poll-source"]) == (200, "app")
    items = [memcached_stats(p)["curr_items"] for p in own_stack.memcached_ports]
    assert all(n > 100 for n in items), f"keys not spread over the 3 nodes: {items}"
    for port in own_stack.poller_ports:
        with http_client(own_stack, port) as direct:
            misses = [
                u
                for u in uids
                if direct.get(f"/getMessages?user_id={u}").status_code != 200
            ]
        assert misses == [], (
            f"poller :{port} missed {len(misses)} keys the app wrote, e.g. {misses[:5]}"
        )


def _cache_names(stack: Stack) -> list[str]:
    return (
        [n for n in stack.procs if n.startswith("memcached")]
        if stack.backend == "memcached"
        else ["redis"]
    )


def test_cache_down_everything_falls_back_then_hits_resume(own_stack: Stack) -> None:
    cache = Cache(own_stack)
    uids = [new_uid() for _ in range(30)]
    with http_client(own_stack) as c:
        for uid in uids:
            c.get(f"/Poll/getMessages?user_id={uid}")  # fill
        names = _cache_names(own_stack)
        for name in names:
            own_stack.stop_proc(name)
        for _ in range(3):
            for uid in uids:
                r = c.get(f"/Poll/getMessages?user_id={uid}")
                assert (r.status_code, r.headers["x-poll-source"]) == (200, "app")
        # Bring the cache back on the same ports; nothing else is restarted.
        for name in names:
            if name == "redis":
                own_stack.start_redis()
            else:
                own_stack.start_memcached(int(name.split("-")[1]))
        uid = uids[0]

        def hit() -> bool:
            r = c.get(
                f"/Poll/getMessages?user_id={uid}"
            )  # a miss refills the empty cache
            assert r.status_code == 200
            return r.headers["x-poll-source"] == "cache"

        wait_for(
            "hits resume after the cache came back",
            hit,
            timeout=20,
            interval=0.1,
            retry_on=(),
        )
        assert cache.get(poll_key(uid)) is not None


INVALID_TARGETS = [
    "/getMessages?user_id=1%0D%0Aflush_all",
    "/getMessages?user_id=1%0D%0Adelete%20x",
    "/getMessages?user_id=1%20get%20y",
    "/getMessages?user_id=%00",
    "/getMessages?user_id=1&user_id=2",
    "/get%0AMessages?user_id=1",
    "/a/../getMessages?user_id=1",
    "/getMessages?user_id=" + "9" * 300,
    "/" + "x" * 260,
]


def test_invalid_keys_never_reach_the_cache(stack: Stack, cache: Cache) -> None:
    before = cache.gets_served()
    for port in stack.poller_ports:
        for target in INVALID_TARGETS:
            with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
                s.sendall(
                    f"GET {target} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode()
                )
                reply = _read_all(s)
            status = reply.split(b"\r\n", 1)[0]
            # 403: with signed URLs (the default) a request without a key cannot be signed.
            assert status.split()[1] in (b"400", b"403", b"404", b"414"), (
                target,
                status,
            )
    assert cache.gets_served() == before, "an invalid key was sent to the cache"
    # A valid request on the same servers does reach it: the counter is live.
    target = stack.sign(f"/getMessages?user_id={new_uid()}")
    httpx.get(f"http://127.0.0.1:{stack.poller_ports[0]}{target}")
    # At least: with replicas an idle node is also read once a second (fastpoll:probe).
    assert cache.gets_served() >= before + 1


def _read_all(s: socket.socket) -> bytes:
    data = b""
    while chunk := s.recv(65536):
        data += chunk
    return data


def test_config_check_names_key_and_line(tmp_path: Path, stack: Stack) -> None:
    import subprocess

    bad = tmp_path / "bad.ini"
    bad.write_text("[server]\nport = 8101\n\n[cache]\ntimeout_ms = soon\n")
    r = subprocess.run(
        [str(stack.poll_server), "-t", "-c", str(bad)],
        check=False,
        capture_output=True,
        text=True,
    )
    assert r.returncode != 0
    assert "timeout_ms" in r.stderr and ":5" in r.stderr, r.stderr
    r = subprocess.run(
        [str(stack.poll_server), "-t", "-c", str(stack.ini_path)],
        check=False,
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
