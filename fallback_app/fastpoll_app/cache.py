"""Cache backends the app writes poll answers to.

Two writes, two meanings (docs/api.md, "No stale answer"), both conditional, so a write that
lands late (a timed-out request a hung node applies later) can never replace a newer answer:
- fill(key, value, version): store only if absent (memcached `add`; Redis: a script that also
  refuses a version older than the one kept beside the value).
- put(key, value, version): replace the answer. memcached: `gets`, then `cas` with the unique
  it returned (or `add` if absent); any write in between, late or not, changes the unique and
  the `cas` fails, so put reads again and retries. Redis: a script compares `version` with the
  one stored under `key#v` and writes both only if it is not older.
Callers hold the user's order (store.user) around both.

Values are raw bytes (memcached flags 0), exactly what the poll server serves: the version never
enters the value. Every failure is raised as CacheError; callers decide what it means.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Protocol

import pylibmc
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry
from redis.sentinel import Sentinel

from .config import CacheSettings, MemcachedSettings, RedisSettings, Settings, read_password

log = logging.getLogger(__name__)


class CacheError(Exception):
    """The cache could not be read or written."""


# Tries of put's gets/cas round before it gives up (each lost race means another write, late
# or from a fill, changed the key in between; under the user's order that is rare).
PUT_TRIES = 5
VERSION_SUFFIX = b"#v"  # never in a poll key: '#' is escaped by the key scheme (docs/keys.md)


class Cache(Protocol):
    def fill(self, key: bytes, value: bytes, version: int) -> bool:
        """Store if absent; True if stored, False if the key already existed."""
        ...

    def put(self, key: bytes, value: bytes, version: int) -> None:
        """Make `value` the cached answer unless a newer one is there; CacheError if unsure."""
        ...

    def get(self, key: bytes) -> bytes | None: ...

    def delete(self, key: bytes) -> None: ...

    def close(self) -> None: ...


class MemcachedCache:
    """memcached through pylibmc, ketama over the configured servers in order.

    The poll server hashes with the same libmemcached (MEMCACHED_BEHAVIOR_KETAMA)
    over the same list, so it reads every key from the node the app wrote it to.
    No auto-eject: ejecting a node would remap keys on this side only.
    """

    def __init__(self, servers: tuple[str, ...], ttl: int, timeout_ms: int) -> None:
        self._ttl = ttl
        behaviors = {
            "ketama": True,
            "tcp_nodelay": True,
            "connect_timeout": timeout_ms,
            "_poll_timeout": timeout_ms,
            "send_timeout": timeout_ms * 1000,  # microseconds
            "receive_timeout": timeout_ms * 1000,
            "cas": True,  # gets returns the CAS unique that put's cas needs
        }
        self._master = pylibmc.Client(list(servers), binary=False, behaviors=behaviors)
        # pylibmc clients are not thread-safe: one clone per threadpool thread.
        self._pool = pylibmc.ThreadMappedPool(self._master)

    def fill(self, key: bytes, value: bytes, version: int) -> bool:
        try:
            with self._pool.reserve() as mc:
                return bool(mc.add(key, value, time=self._ttl))
        except pylibmc.Error as exc:
            raise CacheError(f"memcached add: {exc}") from exc

    def put(self, key: bytes, value: bytes, version: int) -> None:
        try:
            with self._pool.reserve() as mc:
                for _ in range(PUT_TRIES):
                    current, unique = mc.gets(key)
                    if current is None:
                        if mc.add(key, value, time=self._ttl):
                            return
                    elif bytes(current) == value:
                        return  # already the answer; a late older write would fail its cas
                    elif mc.cas(key, value, unique, time=self._ttl):
                        return
        except pylibmc.Error as exc:
            raise CacheError(f"memcached gets/cas: {exc}") from exc
        raise CacheError(f"memcached cas: lost the race {PUT_TRIES} times")

    def get(self, key: bytes) -> bytes | None:
        try:
            with self._pool.reserve() as mc:
                value = mc.get(key)
        except pylibmc.Error as exc:
            raise CacheError(f"memcached get: {exc}") from exc
        return value if value is None else bytes(value)

    def delete(self, key: bytes) -> None:
        try:
            with self._pool.reserve() as mc:
                mc.delete(key)
        except pylibmc.Error as exc:
            raise CacheError(f"memcached delete: {exc}") from exc

    def close(self) -> None:
        self._pool.clear()
        self._master.disconnect_all()


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
            sentinel = Sentinel(
                settings.sentinel_addrs,
                socket_timeout=timeout,
                socket_connect_timeout=timeout,
            )
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
    return MemcachedCache(m.servers, c.ttl, t)


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
