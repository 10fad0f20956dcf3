"""Redis Sentinel in the poll server (issue 11, item 4): a master, a replica and three
sentinels (redis-server --sentinel, Debian's redis-sentinel) on free loopback ports; the poll
server asks the sentinels for the master. The drill kills the master under a light poll load:
every poll gets an answer (a hit, or a fast 503 that nginx hands to the app), caching comes
back within the failover time, and what is served afterwards is the new master's data.

The poll server is reached directly (no nginx, no app: the app's own Sentinel support is
another part of the tree); its 503 is what nginx turns into a fallback.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from stack import free_port, tcp_ask, wait_for
from test_robustness import Procs, key, own_procs, redis_cmd

MASTER = "fpmaster"


@pytest.fixture()
def procs(tmp_path: Path) -> Iterator[Procs]:
    yield from own_procs(tmp_path)


def sentinel(procs: Procs, master_port: int) -> int:
    port = free_port()
    conf = procs.dir / f"sentinel-{port}.conf"  # sentinel rewrites its config: ours
    conf.write_text(
        f"port {port}\nbind 127.0.0.1\ndir {procs.dir}\n"
        f"sentinel monitor {MASTER} 127.0.0.1 {master_port} 2\n"
        f"sentinel down-after-milliseconds {MASTER} 1000\n"
        f"sentinel failover-timeout {MASTER} 5000\n"
        f"sentinel parallel-syncs {MASTER} 1\n"
    )
    p = procs.spawn(f"sentinel-{port}", ["redis-server", str(conf), "--sentinel"])
    wait_for("sentinel", lambda: tcp_ask(port, b"PING\r\n", b"+PONG"), proc=p.popen)
    return port


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
