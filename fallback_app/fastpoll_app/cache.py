"""Cache backends the app writes poll answers to.

Two writes, two meanings (docs/api.md, "No stale answer"), both conditional, so a write that
lands late (a timed-out request a hung node applies later) can never replace a newer answer:
- fill(key, value, version): store only if absent (memcached `add`; Redis: a script that also
  refuses a version older than the one kept beside the value).
- put(key, value, version): replace the answer. memcached: `gets`, then `cas` with the unique
  it returned (or `add` if absent), even when the bytes are equal, so the unique always moves;
  any write in between, late or not, changes the unique and the `cas` fails, so put reads
  again and retries (as it does when the key vanished between the two). Redis: a script
  compares `version` with the one stored under `key#v` and writes both only if it is not older
  (an equal answer is written too, so the stored version always moves).
Callers hold the user's order (store.user) around both.

Values are raw bytes (memcached flags 0), exactly what the poll server serves: the version never
enters the value. Every failure is raised as CacheError; callers decide what it means.

A value a memcached node refuses for size (SERVER_ERROR object too large for cache: a room's
answer over its item size, -I) cannot be cached there, and a `cas` that fails so leaves the older
answer in place: put writes the marker UNCACHEABLE there instead (no bytes, client flags
UNCACHEABLE_FLAGS, by the same gets/cas), which the poll servers read as a miss, so the app
answers the key's polls from the database (docs/channels.md, "A room's size"). Not a delete: a
delete leaves the key absent, and a late `add` of an older answer (a fill a hung connection
delivers after the write) would land there and stay; on the marker it fails as on any value.
A put that wrote the marker has succeeded (no stale answer is cached), so the outbox does not
retry it; a fill refused for size adds the marker too. Counted in
fastpoll_app_cache_too_large_total.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from typing import Protocol, TypeVar

import pylibmc
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry
from redis.sentinel import Sentinel

from . import mcpipe
from .config import (
    CacheSettings,
    MemcachedSettings,
    RedisSettings,
    Settings,
    read_password,
    read_sentinel_password,
)
from .metrics import CACHE_RECONNECTS, CACHE_TOO_LARGE

log = logging.getLogger(__name__)


class CacheError(Exception):
    """The cache could not be read or written."""


# Tries of put's gets/cas round before it gives up (each lost race means another write, late
# or from a fill, changed the key in between; under the user's order that is rare).
PUT_TRIES = 5
VERSION_SUFFIX = b"#v"  # never in a poll key: '#' is escaped by the key scheme (docs/keys.md)
# A memcached node whose last operation failed (timed out, refused) is suspect until one
# succeeds. While it is, at most this many operations of one cache client wait on it at once; the
# others fail at once (CacheError: a write stays in the outbox, a fill is skipped). Every one of
# them holds the user's order and, on PostgreSQL, a pooled connection while it waits: without
# the bound, the writes of a hung node's users took every connection and thread of the process
# and the other nodes' users waited behind them.
SUSPECT_IN_FLIGHT = 4

T = TypeVar("T")

# Client flags of the marker of a key a node cannot cache (every answer is written with flags 0;
# the poll servers read a value with other flags as a miss: poll_server/src/mcproto.h).
UNCACHEABLE_FLAGS = 1 << 8


class _Uncacheable:
    """The marker's value in this module: no bytes on the wire, UNCACHEABLE_FLAGS."""

    def __repr__(self) -> str:
        return "UNCACHEABLE"


UNCACHEABLE = _Uncacheable()


class _Client(pylibmc.Client):  # type: ignore[misc]
    """pylibmc's client, the marker written and read as what it is (pylibmc calls these for
    every value); anything else as pylibmc does it (bytes: flags 0)."""

    def serialize(self, value: object) -> tuple[bytes, int]:
        if value is UNCACHEABLE:
            return b"", UNCACHEABLE_FLAGS
        return super().serialize(value)  # type: ignore[no-any-return]

    def deserialize(self, data: bytes | None, flags: int) -> object:
        if flags == UNCACHEABLE_FLAGS:
            return UNCACHEABLE
        # An overriding deserialize gets an empty value as None (pylibmc 1.6): it is b"".
        return super().deserialize(b"" if data is None else data, flags)


class Cache(Protocol):
    def fill(self, key: bytes, value: bytes, version: int) -> bool:
        """Store if absent; True if stored, False if the key already existed."""
        ...

    def put(self, key: bytes, value: bytes, version: int) -> None:
        """Make `value` the cached answer unless a newer one is there; CacheError if unsure."""
        ...

    def put_many(self, items: Sequence[tuple[bytes, bytes, int]]) -> None:
        """put() of every (key, value, version), pipelined; CacheError if any is unsure (after
        trying every one)."""
        ...

    def get(self, key: bytes) -> bytes | None: ...

    def delete(self, key: bytes) -> None: ...

    def close(self) -> None: ...


# enum memcached_behavior_t (libmemcached-1.0/types/behavior.h) and memcached_return_t.
_MEMCACHED_BEHAVIOR_KETAMA = 3
_MEMCACHED_SUCCESS = 0


def _libmemcached() -> ctypes.CDLL:
    """The system libmemcached, the one pylibmc and the poll server link (Debian's .so.11)."""
    for name in ("libmemcached.so.11", ctypes.util.find_library("memcached")):
        if name:
            try:
                lib = ctypes.CDLL(name)
                break
            except OSError:
                continue
    else:
        raise CacheError("cannot load libmemcached (Debian package libmemcached11)")
    lib.memcached_create.restype = ctypes.c_void_p
    lib.memcached_create.argtypes = [ctypes.c_void_p]
    lib.memcached_server_add.restype = ctypes.c_int
    lib.memcached_server_add.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_uint16]
    lib.memcached_behavior_set.restype = ctypes.c_int
    lib.memcached_behavior_set.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint64]
    lib.memcached_generate_hash.restype = ctypes.c_uint32
    lib.memcached_generate_hash.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t]
    lib.memcached_free.restype = None
    lib.memcached_free.argtypes = [ctypes.c_void_p]
    return lib


class _Ketama:
    """libmemcached's own ketama over `servers` in order (memcached_server_add each, then
    MEMCACHED_BEHAVIOR_KETAMA): the very calls the poll server makes (cache_memcached.c,
    ketama_new), so both sides place every key alike. Only memcached_generate_hash is used."""

    def __init__(self, lib: ctypes.CDLL, servers: Sequence[str]) -> None:
        self._lib = lib
        self._lock = threading.Lock()  # generate_hash may rebuild the continuum: one at a time
        self._n = len(servers)
        memc = lib.memcached_create(None)
        if not memc:
            raise CacheError("memcached_create failed")
        self._memc: int | None = memc
        for spec in servers:
            host, _, port = spec.rpartition(":")
            if lib.memcached_server_add(memc, host.encode(), int(port)) != _MEMCACHED_SUCCESS:
                self.close()
                raise CacheError(f"memcached_server_add {spec} failed")
        if lib.memcached_behavior_set(memc, _MEMCACHED_BEHAVIOR_KETAMA, 1) != _MEMCACHED_SUCCESS:
            self.close()
            raise CacheError("cannot enable ketama")

    def index(self, key: bytes) -> int:
        with self._lock:
            return int(self._lib.memcached_generate_hash(self._memc, key, len(key))) % self._n

    def close(self) -> None:
        with self._lock:
            if self._memc:
                self._lib.memcached_free(self._memc)
                self._memc = None


class Placement:
    """Where a key lives on one server list: its ketama node (the primary) and, with replicas,
    the node ketama picks over the list without the primary (the next distinct node on the
    continuum). The poll server computes the same (cache_memcached.c, replica_of)."""

    def __init__(self, servers: Sequence[str], replicas: int) -> None:
        lib = _libmemcached()
        self.servers = tuple(servers)
        self._all = _Ketama(lib, self.servers)
        self._excl: list[_Ketama] = []
        if replicas and len(self.servers) >= 2:
            for i in range(len(self.servers)):
                self._excl.append(_Ketama(lib, self.servers[:i] + self.servers[i + 1 :]))

    def nodes(self, key: bytes) -> tuple[str, ...]:
        """(primary,) or (primary, replica), as host:port."""
        p = self._all.index(key)
        if not self._excl:
            return (self.servers[p],)
        j = self._excl[p].index(key)
        return (self.servers[p], self.servers[j if j < p else j + 1])

    def close(self) -> None:
        self._all.close()
        for k in self._excl:
            k.close()


class _NodeGuard:
    """The suspect state of one memcached node and the operations in flight on it."""

    def __init__(self, addr: str) -> None:
        self._addr = addr
        self._lock = threading.Lock()
        self._suspect = False
        self._in_flight = 0

    @contextmanager
    def use(self) -> Iterator[None]:
        with self._lock:
            if self._suspect and self._in_flight >= SUSPECT_IN_FLIGHT:
                raise CacheError(
                    f"{self._addr}: failing, {self._in_flight} operations already wait on it"
                )
            self._in_flight += 1
        failed = False
        try:
            yield
        except pylibmc.Error as exc:
            # NOT_FOUND and "object too large" are answers, not a failing node.
            failed = not isinstance(exc, (pylibmc.NotFound, pylibmc.TooBig))
            raise
        finally:
            with self._lock:
                self._in_flight -= 1
                self._suspect = failed


class MemcachedCache:
    """memcached through pylibmc: one client per node, the node chosen by Placement.

    Every key is written to each node of its placement: the primary and, with `replicas`, the
    replica the poll server reads when the primary is down, hung, or recovering. With
    `previous_servers` (a membership change under way) the old list's placement is written too,
    so a poll server on either list reads a fresh answer. A write that fails on any node raises
    CacheError after the other nodes were written; the caller's outbox then repairs them all.
    No auto-eject: ejecting a node would remap keys on this side only.
    """

    def __init__(
        self,
        servers: tuple[str, ...],
        ttl: int,
        timeout_ms: int,
        replicas: int = 0,
        previous_servers: tuple[str, ...] = (),
    ) -> None:
        self._ttl = ttl
        self._timeout_s = timeout_ms / 1000
        behaviors = {
            "tcp_nodelay": True,
            "connect_timeout": timeout_ms,
            "_poll_timeout": timeout_ms,
            "send_timeout": timeout_ms * 1000,  # microseconds
            "receive_timeout": timeout_ms * 1000,
            "cas": True,  # gets returns the CAS unique that put's cas needs
            # A node that timed out is skipped for 1 s (libmemcached's default: 2 s), so the
            # outbox retries it soon after it is back (store.OUTBOX_BACKOFF_MAX).
            "retry_timeout": 1,
        }
        self._placements = [Placement(servers, replicas)]
        if previous_servers and tuple(previous_servers) != tuple(servers):
            self._placements.append(Placement(previous_servers, replicas))
        self._masters: dict[str, pylibmc.Client] = {}
        # pylibmc clients are not thread-safe: one clone per threadpool thread, per node.
        self._pools: dict[str, pylibmc.ThreadMappedPool] = {}
        self._guards: dict[str, _NodeGuard] = {}
        for addr in (*servers, *previous_servers):
            if addr not in self._masters:
                mc = _Client([addr], binary=False, behaviors=behaviors)
                self._masters[addr] = mc
                self._pools[addr] = pylibmc.ThreadMappedPool(mc)
                self._guards[addr] = _NodeGuard(addr)
        self._warn = RateLimitedLog(log)

    @contextmanager
    def _client(self, addr: str) -> Iterator[pylibmc.Client]:
        """This thread's client of node `addr`; CacheError at once if the node is suspect and
        SUSPECT_IN_FLIGHT operations already wait on it."""
        with self._guards[addr].use(), self._pools[addr].reserve() as mc:
            yield mc

    def _on(self, addr: str, op: Callable[[pylibmc.Client], T]) -> T:
        """op on node `addr`'s client (_client). A pooled connection that a restarted node
        closed fails its first use and libmemcached reconnects on the next, so a lost
        connection is tried once more at once (every operation here may be repeated: add and
        cas are conditional, a repeated delete or get changes nothing)."""
        with self._client(addr) as mc:
            try:
                return op(mc)
            except pylibmc.ConnectionError:
                CACHE_RECONNECTS.inc()
                return op(mc)

    def nodes(self, key: bytes) -> tuple[str, ...]:
        """Every node that holds `key`: the current list's primary first, then its replica,
        then the previous list's (without repeats)."""
        out: list[str] = []
        for p in self._placements:
            for n in p.nodes(key):
                if n not in out:
                    out.append(n)
        return tuple(out)

    def fill(self, key: bytes, value: bytes, version: int) -> bool:
        stored: bool | None = None
        failed: list[str] = []
        for addr in self.nodes(key):
            try:
                done = self._on(addr, lambda mc: bool(mc.add(key, value, time=self._ttl)))
            except pylibmc.TooBig:
                CACHE_TOO_LARGE.labels("fill").inc()
                # Where no answer is cached yet: nothing older may land there later either.
                with suppress(pylibmc.Error, CacheError):
                    self._on(addr, lambda mc: mc.add(key, UNCACHEABLE, time=self._ttl))
                failed.append(f"{addr}: {len(value)} bytes, over the node's item size")
                continue
            except (pylibmc.Error, CacheError) as exc:
                failed.append(f"{addr}: {exc}")
                continue
            if stored is None:
                stored = done
        if failed:
            raise CacheError(f"memcached add: {'; '.join(failed)}")
        return bool(stored)

    def _put_one(self, addr: str, key: bytes, value: bytes) -> None:
        try:
            self._on(addr, lambda mc: self._put_tries(mc, addr, key, value))
        except pylibmc.TooBig:
            # The node keeps the older answer of a refused `cas`: the marker replaces it, so
            # polls miss and the app answers them. A failed write raises: the outbox retries.
            self._on(addr, lambda mc: self._put_tries(mc, addr, key, UNCACHEABLE))
            CACHE_TOO_LARGE.labels("put").inc()
            self._warn.warning(
                "too-large",
                f"memcached {addr} refused {key[:80]!r} ({len(value)} bytes) as too large "
                "for its item size: marked it uncacheable there, the app answers its polls; keep "
                "[cache] item_max_bytes at or below memcached's -I",
            )

    def _put_tries(
        self, mc: pylibmc.Client, addr: str, key: bytes, value: bytes | _Uncacheable
    ) -> None:
        """put's read-and-retry loop on one node; pylibmc.TooBig if the node refuses the value."""
        for _ in range(PUT_TRIES):
            current, unique = mc.gets(key)
            if current is None:
                if mc.add(key, value, time=self._ttl):
                    return
                continue  # added in between: read it again
            # Written even when the bytes are already the answer: the `cas` moves the
            # key's unique, so an older write still in flight (a `cas` on the unique read
            # before ours) fails. Skipping it let such a write land after the caller had
            # settled the outbox, and stay until the TTL.
            try:
                if mc.cas(key, value, unique, time=self._ttl):
                    return
            except pylibmc.NotFound:
                continue  # evicted or expired since the `gets`: `add` it
        raise CacheError(f"memcached cas on {addr}: lost the race {PUT_TRIES} times")

    def put(self, key: bytes, value: bytes, version: int) -> None:
        failed: list[str] = []
        for addr in self.nodes(key):
            try:
                self._put_one(addr, key, value)
            except pylibmc.Error as exc:
                failed.append(f"{addr}: gets/cas: {exc}")
            except CacheError as exc:
                failed.append(str(exc))
        if failed:
            raise CacheError(f"memcached put: {'; '.join(failed)}")

    def put_many(self, items: Sequence[tuple[bytes, bytes, int]]) -> None:
        """Each node's keys pipelined (mcpipe: two round trips a node), node after node; a key
        that lost a race there is then written alone, as put() does."""
        by_node: dict[str, list[tuple[bytes, bytes]]] = {}
        for key, value, _ in items:
            for addr in self.nodes(key):
                by_node.setdefault(addr, []).append((key, value))
        failed: list[str] = []
        for addr, writes in by_node.items():
            try:
                with self._guards[addr].use():
                    try:
                        lost = set(mcpipe.put_node(addr, writes, self._ttl, self._timeout_s))
                    except OSError as exc:  # judged as a pylibmc failure: the node is suspect
                        raise pylibmc.Error(str(exc)) from exc
            except (pylibmc.Error, CacheError) as exc:
                failed.append(f"{addr}: {exc}")
                continue
            for key, value in writes:
                if key in lost:
                    try:
                        self._put_one(addr, key, value)
                    except (pylibmc.Error, CacheError) as exc:
                        failed.append(f"{addr}: {exc}")
        if failed:
            raise CacheError(f"memcached put_many: {'; '.join(failed[:3])}")

    def get(self, key: bytes) -> bytes | None:
        """The primary's answer; the next node's when the primary cannot be read."""
        errors: list[str] = []
        for addr in self.nodes(key):
            try:
                value = self._on(addr, lambda mc: mc.get(key))
            except (pylibmc.Error, CacheError) as exc:
                errors.append(f"{addr}: {exc}")
                continue
            return None if value is None or value is UNCACHEABLE else bytes(value)
        raise CacheError(f"memcached get: {'; '.join(errors)}")

    def delete(self, key: bytes) -> None:
        failed: list[str] = []
        for addr in self.nodes(key):
            try:
                self._on(addr, lambda mc: mc.delete(key))
            except (pylibmc.Error, CacheError) as exc:
                failed.append(f"{addr}: {exc}")
        if failed:
            raise CacheError(f"memcached delete: {'; '.join(failed)}")

    def close(self) -> None:
        for pool in self._pools.values():
            pool.clear()
        for mc in self._masters.values():
            mc.disconnect_all()
        for p in self._placements:
            p.close()


# KEYS: the answer's key, its version's key. ARGV: value, version, ttl (0: none).
_REDIS_PUT = """
local cur = tonumber(redis.call('GET', KEYS[2]) or '-1')
if tonumber(ARGV[2]) < cur then return 0 end
if ARGV[3] == '0' then
  redis.call('SET', KEYS[1], ARGV[1]); redis.call('SET', KEYS[2], ARGV[2])
else
  redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[3])
  redis.call('SET', KEYS[2], ARGV[2], 'EX', ARGV[3])
end
return 1
"""
_REDIS_FILL = (
    """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
"""
    + _REDIS_PUT
)


def sentinels(settings: RedisSettings, timeout: float) -> Sentinel:
    """[redis] sentinels, asked with AUTH when they have a password (sentinel_password_file)."""
    password = read_sentinel_password(settings)
    return Sentinel(
        settings.sentinel_addrs,
        sentinel_kwargs={
            "password": password,
            "socket_timeout": timeout,
            "socket_connect_timeout": timeout,
        },
        socket_timeout=timeout,
        socket_connect_timeout=timeout,
    )


class RedisCache:
    """Redis through redis-py (its connection pool is thread-safe). The answer's version is kept
    under `key#v`, beside the value, and compared by a server-side script (one atomic step)."""

    def __init__(self, settings: RedisSettings, ttl: int, timeout_ms: int) -> None:
        self._ttl = ttl or None  # 0 = no expiry
        timeout = timeout_ms / 1000
        common: dict[str, object] = {
            "db": settings.db,
            "password": read_password(settings),
            "username": settings.username,
            "socket_timeout": timeout,
            "socket_connect_timeout": timeout,
            # One immediate retry: a pooled connection to a restarted server
            # fails once, the retry reconnects. No backoff sleeps.
            "retry": Retry(NoBackoff(), 1),
        }
        if settings.sentinels and settings.master_name:
            # The sentinels name the master; the client asks again after a failover (redis-py's
            # SentinelConnectionPool re-resolves on a failed connection).
            sentinel = sentinels(settings, timeout)
            self._r = sentinel.master_for(settings.master_name, **common)  # type: ignore[arg-type]
        elif (path := settings.unix_path) is not None:
            self._r = redis.Redis(unix_socket_path=path, **common)  # type: ignore[arg-type]
        else:
            host, port = settings.host_port
            self._r = redis.Redis(host=host, port=port, **common)  # type: ignore[arg-type]
        self._put = self._r.register_script(_REDIS_PUT)
        self._fill = self._r.register_script(_REDIS_FILL)
        self._ttl_arg = str(ttl)

    def fill(self, key: bytes, value: bytes, version: int) -> bool:
        try:
            done = self._fill(
                keys=[key, key + VERSION_SUFFIX], args=[value, version, self._ttl_arg]
            )
        except redis.RedisError as exc:
            raise CacheError(f"redis fill script: {exc}") from exc
        return bool(done)

    def put(self, key: bytes, value: bytes, version: int) -> None:
        # 0 (a newer version is cached) is success too: the cache is not older than ours.
        try:
            self._put(keys=[key, key + VERSION_SUFFIX], args=[value, version, self._ttl_arg])
        except redis.RedisError as exc:
            raise CacheError(f"redis put script: {exc}") from exc

    def put_many(self, items: Sequence[tuple[bytes, bytes, int]]) -> None:
        # One round trip: the scripts pipelined (redis-py loads a missing script first).
        try:
            pipe = self._r.pipeline(transaction=False)
            for key, value, version in items:
                self._put(
                    keys=[key, key + VERSION_SUFFIX],
                    args=[value, version, self._ttl_arg],
                    client=pipe,
                )
            pipe.execute()
        except redis.RedisError as exc:
            raise CacheError(f"redis put scripts: {exc}") from exc

    def get(self, key: bytes) -> bytes | None:
        try:
            value = self._r.get(key)
        except redis.RedisError as exc:
            raise CacheError(f"redis GET: {exc}") from exc
        return value  # type: ignore[return-value]

    def delete(self, key: bytes) -> None:
        try:
            self._r.delete(key)
        except redis.RedisError as exc:
            raise CacheError(f"redis DEL: {exc}") from exc

    def close(self) -> None:
        self._r.close()


def make_cache(settings: Settings, timeout_ms: int | None = None) -> Cache:
    """Backend named by [cache] backend; timeout_ms overrides [cache] timeout_ms."""
    c: CacheSettings = settings.cache
    t = timeout_ms if timeout_ms is not None else c.timeout_ms
    if c.backend == "redis":
        return RedisCache(settings.redis, c.ttl, t)
    m: MemcachedSettings = settings.memcached
    return MemcachedCache(m.servers, c.ttl, t, m.replicas, m.previous_servers)


class RateLimitedLog:
    """Log a recurring warning at most once per interval, counting the rest."""

    def __init__(self, logger: logging.Logger, interval: float = 10.0) -> None:
        self._log = logger
        self._interval = interval
        self._lock = threading.Lock()
        self._last: dict[str, float] = {}
        self._dropped: dict[str, int] = {}

    def warning(self, kind: str, msg: str) -> None:
        now = time.monotonic()
        with self._lock:
            last = self._last.get(kind)
            if last is not None and now - last < self._interval:
                self._dropped[kind] = self._dropped.get(kind, 0) + 1
                return
            self._last[kind] = now
            dropped = self._dropped.pop(kind, 0)
        suffix = f" ({dropped} similar suppressed)" if dropped else ""
        self._log.warning("%s%s", msg, suffix)
