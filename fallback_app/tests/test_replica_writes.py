"""MemcachedCache with replicas and a previous server list: which nodes a key is written to, and
what a node that cannot be written means (CacheError after the others were written, so the
publish goes to the outbox and its repair writes them all). Real memcached processes."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from fastpoll_app.cache import CacheError, MemcachedCache, Placement
from fastpoll_testkit.procs import Server, start_memcached


@pytest.fixture
def nodes() -> Iterator[list[Server]]:
    started = [start_memcached() for _ in range(3)]
    yield started
    for n in started:
        n.stop()


def holds(node: Server, key: bytes) -> bytes | None:
    with socket.create_connection(("127.0.0.1", node.port), timeout=2) as c:
        c.sendall(b"get " + key + b"\r\n")
        data = b""
        while not data.endswith(b"END\r\n"):
            data += c.recv(65536)
    if not data.startswith(b"VALUE"):
        return None
    return data.split(b"\r\n")[1]


def keys(n: int) -> list[bytes]:
    return [b"/Poll/getMessages?user_id=%d" % i for i in range(n)]


def test_each_key_on_its_primary_and_replica_only(nodes: list[Server]) -> None:
    addrs = tuple(n.addr for n in nodes)
    cache = MemcachedCache(addrs, 60, 1000, replicas=1)
    placement = Placement(addrs, 1)
    try:
        pairs: set[tuple[str, str]] = set()
        for k in keys(200):
            cache.put(k, b"v", 1)
            want = placement.nodes(k)
            assert len(set(want)) == 2
            pairs.add(want)
            assert [n.addr for n in nodes if holds(n, k) == b"v"] == sorted(
                want, key=addrs.index
            )
        assert len(pairs) == 6  # every ordered (primary, replica) pair of 3 nodes occurs
    finally:
        cache.close()
        placement.close()


def test_a_dead_copy_fails_the_write_after_the_other_was_written(nodes: list[Server]) -> None:
    addrs = tuple(n.addr for n in nodes)
    placement = Placement(addrs, 1)
    cache = MemcachedCache(addrs, 60, 300, replicas=1)
    try:
        k = next(k for k in keys(100) if placement.nodes(k)[1] == nodes[2].addr)
        primary = nodes[addrs.index(placement.nodes(k)[0])]
        nodes[2].stop()
        with pytest.raises(CacheError, match=nodes[2].addr):
            cache.put(k, b"new", 2)
        assert holds(primary, k) == b"new"  # the live copy has it; the outbox keeps the row
        with pytest.raises(CacheError):
            cache.fill(k, b"fill", 2)
        assert holds(primary, k) == b"new"  # add: the newer answer stays
    finally:
        cache.close()
        placement.close()


def test_previous_servers_write_both_placements_each_node_once(nodes: list[Server]) -> None:
    new = tuple(n.addr for n in nodes)
    old = new[:2]
    cache = MemcachedCache(new, 60, 1000, replicas=0, previous_servers=old)
    now, before = Placement(new, 0), Placement(old, 0)
    try:
        moved = 0
        for k in keys(300):
            cache.put(k, b"x", 1)
            want = {now.nodes(k)[0], before.nodes(k)[0]}
            moved += len(want) == 2
            assert {n.addr for n in nodes if holds(n, k) == b"x"} == want
            assert cache.nodes(k)[0] == now.nodes(k)[0]  # the new list's primary first
        assert 0 < moved < 300  # adding a node moves some keys, not all
    finally:
        cache.close()
        now.close()
        before.close()


def test_a_restarted_node_is_written_on_the_first_try(nodes: list[Server]) -> None:
    """A pooled connection that a restarted node closed fails its first use; libmemcached
    reconnects on the next. Each operation tries once more at once, so a write after the
    restart is not left to the outbox while the poll servers already read the node."""
    addrs = tuple(n.addr for n in nodes[:1])
    cache = MemcachedCache(addrs, 60, 300)
    try:
        k = keys(1)[0]
        cache.put(k, b"one", 1)
        for step in (
            lambda: cache.put(k, b"two", 2),
            lambda: cache.get(k),
            lambda: cache.fill(k, b"fill", 3),
            lambda: cache.delete(k),
        ):
            nodes[0].stop()
            nodes[0].start()
            step()  # no CacheError
        cache.put(k, b"three", 4)
        assert holds(nodes[0], k) == b"three"
    finally:
        cache.close()
