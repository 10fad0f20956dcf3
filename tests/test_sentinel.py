"""Redis Sentinel in the poll server: a master, a replica and three
sentinels (redis-server --sentinel, Debian's redis-sentinel) on free loopback ports; the poll
server asks the sentinels for the master. The drill kills the master under a light poll load:
every poll gets an answer (a hit, or a fast 503 that nginx hands to the app), caching comes
back within the failover time, and what is served afterwards is the new master's data.

test_sentinel_failover_under_load reaches one poll server directly (its 503 is what nginx turns
into a fallback); test_sentinel_failover_through_nginx runs the whole stack under wrk, the app
(redis-py's Sentinel) and the pollers asking the same sentinels for the master.
"""

from __future__ import annotations

import signal
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from fastpoll_testkit.helpers import assert_no_failures, at, prime
from fastpoll_testkit.loadgen import Load
from fastpoll_testkit.procs import free_port, wait_for
from fastpoll_testkit.stack import Stack
from fastpoll_testkit.standalone import Procs, key, own_procs, redis_cmd

MASTER = "fpmaster"


@pytest.fixture()
def procs(tmp_path: Path) -> Iterator[Procs]:
    yield from own_procs(tmp_path)


def sentinel(procs: Procs, master_port: int, password: str = "") -> int:
    return procs.sentinel(
        master_port,
        MASTER,
        f"sentinel down-after-milliseconds {MASTER} 1000",
        f"sentinel failover-timeout {MASTER} 5000",
        f"sentinel parallel-syncs {MASTER} 1",
        auth_pass=password,
    )


def wait_sentinels_ready(ports: list[int]) -> None:
    """Every sentinel aware of the others and of the replica (else no failover can happen)."""
    deadline = time.monotonic() + 30
    while not all(
        sentinel_knows(p, "replicas", 1) and sentinel_knows(p, "sentinels", 2)
        for p in ports
    ):
        assert time.monotonic() < deadline, "the sentinels did not find each other"
        time.sleep(0.2)


def sentinel_master(port: int) -> int:
    """The master's port this sentinel reports."""
    answer = redis_cmd(port, "SENTINEL", "get-master-addr-by-name", MASTER)
    return int(answer.split(b"\r\n")[-2])


def sentinel_knows(port: int, what: str, n: int) -> bool:
    answer = redis_cmd(port, "SENTINEL", what, MASTER)
    return answer.startswith(f"*{n}\r\n".encode())


@pytest.fixture()
def sentinels(procs: Procs) -> Iterator[tuple[int, int, list[int]]]:
    """(master port, replica port, sentinel ports), every sentinel aware of the others and of
    the replica (else a failover could not happen)."""
    master = procs.redis()
    replica = procs.redis(f"replicaof 127.0.0.1 {master}")
    ports = [sentinel(procs, master) for _ in range(3)]
    deadline = time.monotonic() + 30
    while not all(
        sentinel_knows(p, "replicas", 1) and sentinel_knows(p, "sentinels", 2)
        for p in ports
    ):
        assert time.monotonic() < deadline, "the sentinels did not find each other"
        time.sleep(0.2)
    yield master, replica, ports


def test_sentinel_failover_under_load(
    procs: Procs,
    sentinels: tuple[int, int, list[int]],
) -> None:
    master, replica, ports = sentinels
    uid = 21
    assert redis_cmd(master, "SET", key(uid), "before").startswith(b"+OK")
    wait_for("replication", lambda: b"before" in redis_cmd(replica, "GET", key(uid)))
    p = procs.poller(
        {
            "cache": {"backend": "redis", "timeout_ms": "100"},
            "redis": {
                "sentinels": ",".join(f"127.0.0.1:{s}" for s in ports),
                "master_name": MASTER,
            },
        }
    )
    wait_for("a hit through the sentinels' master", lambda: p.status(uid) == 200)

    # Light load: one client polling every 10 ms; every answer recorded with its time.
    seen: list[tuple[float, int, bytes]] = []
    failures: list[str] = []
    stop = threading.Event()

    def load() -> None:
        with httpx.Client(base_url=f"http://127.0.0.1:{p.port}", timeout=2) as c:
            while not stop.is_set():
                try:
                    r = c.get(f"/getMessages?user_id={uid}")
                    seen.append((time.monotonic(), r.status_code, r.content))
                except httpx.HTTPError as e:
                    failures.append(repr(e))
                time.sleep(0.01)

    t = threading.Thread(target=load, daemon=True)
    t.start()
    try:
        time.sleep(1.0)
        master_proc = next(x for x in procs.started if x.name == f"redis-{master}")
        killed = time.monotonic()
        master_proc.popen.send_signal(signal.SIGKILL)
        master_proc.popen.wait(5)
        # The sentinels promote the replica (down after 1 s, then the election).
        wait_for(
            "the failover", lambda: sentinel_master(ports[0]) == replica, timeout=30
        )
        promoted = time.monotonic()
        assert redis_cmd(replica, "SET", key(uid), "after").startswith(b"+OK")
        deadline = promoted + 10
        while time.monotonic() < deadline:
            if seen and seen[-1][1] == 200 and seen[-1][2] == b"after":
                break
            time.sleep(0.05)
    finally:
        stop.set()
        t.join(5)
    assert not failures, failures[:5]
    statuses = {s for _, s, _ in seen}
    assert statuses <= {200, 503}, statuses
    back = next(
        (ts for ts, s, body in seen if ts > promoted and s == 200 and body == b"after"),
        None,
    )
    assert back is not None, (
        f"no hit from the new master within 10 s of the failover; "
        f"log:\n{p.log()[-2000:]}"
    )
    # No stale answer after the new value was written: nothing served "before" then.
    assert not [x for x in seen if x[0] > back and x[2] == b"before"]
    lost = back - killed
    print(
        f"master killed -> hits again after {lost:.1f} s (promotion at {promoted - killed:.1f} s)"
    )
    assert "sentinel" in p.log()


def test_sentinel_with_no_sentinel_answering_fails_fast(
    procs: Procs, tmp_path: Path
) -> None:
    """Sentinels configured but none up: polls get a fast 503, the poll server keeps running
    and asks again with the backoff."""
    dead = [free_port(), free_port()]
    p = procs.poller(
        {
            "cache": {"backend": "redis"},
            "redis": {
                "sentinels": " ".join(f"127.0.0.1:{d}" for d in dead),
                "master_name": MASTER,
            },
        }
    )
    t0 = time.monotonic()
    assert p.status(22) == 503
    assert time.monotonic() - t0 < 1.0
    time.sleep(1.0)
    assert p.proc.popen.poll() is None
    assert "no sentinel named the master" in p.log()


def test_sentinel_failover_through_nginx(procs: Procs, tmp_path: Path) -> None:
    """The failover drill: kill -9 the master under wrk through nginx. 0 failed requests
    (the polls of the failover go to the app), and the cached answers are served again from
    the promoted replica within the failover time."""
    sentinel_ports = [free_port() for _ in range(3)]
    stack = Stack(
        run_dir=tmp_path / "stack",
        backend="redis",
        n_pollers=2,
        # The app (redis-py's Sentinel) and the pollers ask the same sentinels.
        extra_ini={
            "redis": {
                "sentinels": ",".join(f"127.0.0.1:{p}" for p in sentinel_ports),
                "master_name": MASTER,
            }
        },
    )
    stack.run_dir.mkdir()
    stack.redis_port = free_port()
    try:
        stack.start()  # the master is the stack's Redis
        password = (stack.run_dir / "redis.pass").read_text().strip()
        replica = procs.redis(
            f"replicaof 127.0.0.1 {stack.redis_port}",
            f"masterauth {password}",
            f"requirepass {password}",
        )
        ports = [
            procs.sentinel(
                stack.redis_port,
                MASTER,
                f"sentinel down-after-milliseconds {MASTER} 1000",
                f"sentinel failover-timeout {MASTER} 5000",
                port=port,
                auth_pass=password,
            )
            for port in sentinel_ports
        ]
        wait_sentinels_ready(ports)
        urls = prime(stack, 50)  # cached on the master, replicated to the replica
        auth = ["AUTH", password]
        wait_for(
            "replication",
            lambda: redis_cmd_auth(replica, auth, "DBSIZE") >= 50,
        )

        load = Load(stack.base_url, urls, seconds=10, connections=4)
        at(load, 2.0)
        killed = time.monotonic()
        stack.stop_proc("redis", signal.SIGKILL)
        wait_for(
            "the failover", lambda: sentinel_master(ports[0]) == replica, timeout=30
        )
        promoted = time.monotonic() - killed
        # Under the load still running: when does a primed user get a cached answer again?
        with httpx.Client(base_url=stack.base_url, timeout=5) as c:
            while c.get(urls[0]).headers.get("x-poll-source") != "cache":
                assert time.monotonic() - killed < 15, "no hit within 15 s of the kill"
                time.sleep(0.05)
        hits_again = time.monotonic() - killed
        r = load.result()
        assert_no_failures(r, "the master killed under load")
        assert r.sources.get("app", 0) > 0 and r.sources.get("cache", 0) > 0, (
            r.summary()
        )

        def hits_back() -> bool:
            after = Load(stack.base_url, urls, seconds=1, connections=4).result()
            assert_no_failures(after, "after the failover")
            return after.sources.get("cache", 0) > 0.9 * after.requests

        deadline = time.monotonic() + 10
        while not hits_back():
            assert time.monotonic() < deadline, (
                "no hits from the new master within 10 s"
            )
        # The app writes to the new master too: a publish after the failover is what the
        # next poll serves, from the cache (no answer older than the last publish).
        uid = int(urls[0].split("user_id=")[1].split("&")[0])
        with stack.api() as api:
            r_pub = api.post("/api/messages", json={"user_id": uid, "text": "after failover"})
            assert r_pub.status_code == 201, r_pub.text
        with httpx.Client(base_url=stack.base_url, timeout=5) as c:
            got = c.get(urls[0])
        assert got.status_code == 200 and "after failover" in got.text, got.text
        assert got.headers["x-poll-source"] == "cache", got.headers
        print(
            f"master killed: promoted after {promoted:.1f} s, first hit again "
            f"{hits_again:.1f} s after the kill; {r.summary()}"
        )
    finally:
        stack.stop()
    reports = stack.sanitizer_reports()
    assert not reports, "\n".join(reports[:20])


def redis_cmd_auth(port: int, auth: list[str], *args: str) -> int:
    """An integer reply to one command after AUTH (DBSIZE)."""
    answer = redis_cmd_pipeline(port, [auth, list(args)])
    return int(answer.rsplit(b":", 1)[1].split(b"\r\n")[0])


def redis_cmd_pipeline(port: int, commands: list[list[str]]) -> bytes:
    data = b"".join(
        f"*{len(c)}\r\n".encode()
        + b"".join(f"${len(a.encode())}\r\n{a}\r\n".encode() for a in c)
        for c in commands
    )
    with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
        s.sendall(data)
        time.sleep(0.05)
        return s.recv(65536)
