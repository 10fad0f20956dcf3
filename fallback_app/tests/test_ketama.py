"""The app writes each key to the node libmemcached's ketama picks.

The poll server picks its node with memcached_generate_hash() after
memcached_server_add() for each server in order and MEMCACHED_BEHAVIOR_KETAMA.
Here the same calls go through ctypes into the system libmemcached, and every
key the app's MemcachedCache wrote must sit on exactly that node.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from collections.abc import Iterator

import pylibmc
import pytest

from fastpoll_app.cache import MemcachedCache
from fastpoll_testkit.procs import Server, start_memcached

MEMCACHED_BEHAVIOR_KETAMA = 3  # enum memcached_behavior_t, libmemcached-1.0/types/behavior.h


def libmemcached() -> ctypes.CDLL:
    name = ctypes.util.find_library("memcached") or "libmemcached.so.11"
    try:
        lib = ctypes.CDLL(name)
    except OSError:
        pytest.skip("libmemcached shared library not found")
    lib.memcached_create.restype = ctypes.c_void_p
    lib.memcached_create.argtypes = [ctypes.c_void_p]
    lib.memcached_server_add.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_uint16]
    lib.memcached_behavior_set.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint64]
    lib.memcached_generate_hash.restype = ctypes.c_uint32
    lib.memcached_generate_hash.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t]
    lib.memcached_free.argtypes = [ctypes.c_void_p]
    return lib


@pytest.fixture
def three_nodes() -> Iterator[list[Server]]:
    nodes = [start_memcached() for _ in range(3)]
    yield nodes
    for n in nodes:
        n.stop()


def test_app_placement_equals_libmemcached_ketama(three_nodes: list[Server]) -> None:
    lib = libmemcached()
    memc = lib.memcached_create(None)
    assert memc
    try:
        for n in three_nodes:
            assert lib.memcached_server_add(memc, b"127.0.0.1", n.port) == 0
        assert lib.memcached_behavior_set(memc, MEMCACHED_BEHAVIOR_KETAMA, 1) == 0

        cache = MemcachedCache(tuple(n.addr for n in three_nodes), ttl=60, timeout_ms=1000)
        keys = [b"/Poll/getMessages?user_id=%d" % i for i in range(500)]
        for k in keys:
            cache.put(k, b"", 1)
        singles = [pylibmc.Client([n.addr]) for n in three_nodes]
        placed = [0, 0, 0]
        for k in keys:
            want = lib.memcached_generate_hash(memc, k, len(k))
            holders = [i for i, s in enumerate(singles) if s.get(k) is not None]
            assert holders == [want], k
            placed[want] += 1
        assert all(placed), placed  # every node got keys: the test means something
        cache.close()
    finally:
        lib.memcached_free(memc)
