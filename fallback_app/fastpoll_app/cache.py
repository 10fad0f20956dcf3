"""Cache backends the app writes poll answers to.

Two writes, two meanings (docs/api.md, "No stale answer"):
- fill(key, value): store only if absent (memcached `add`, Redis `SET NX`).
  A poll answer computed from a possibly older snapshot may never overwrite.
- publish(key, value): store unconditionally (memcached `set`, Redis `SET`).
  Only done by writers holding the database write lock.

Values are raw bytes (memcached flags 0), so the poll server returns them as
they are. Every failure is raised as CacheError; callers decide what it means.
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

from .config import CacheSettings, MemcachedSettings, RedisSettings, Settings, read_password

log = logging.getLogger(__name__)


class CacheError(Exception):
    """The cache could not be read or written."""


class Cache(Protocol):
    def fill(self, key: bytes, value: bytes) -> bool:
        """Store if absent; True if stored, False if the key already existed."""
        ...

    def publish(self, key: bytes, value: bytes) -> None: ...

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
        }
        self._master = pylibmc.Client(list(servers), binary=False, behaviors=behaviors)
        # pylibmc clients are not thread-safe: one clone per threadpool thread.
        self._pool = pylibmc.ThreadMappedPool(self._master)

    def fill(self, key: bytes, value: bytes) -> bool:
        try:
            with self._pool.reserve() as mc:
                return bool(mc.add(key, value, time=self._ttl))
        except pylibmc.Error as exc:
            raise CacheError(f"memcached add: {exc}") from exc

    def publish(self, key: bytes, value: bytes) -> None:
        try:
            with self._pool.reserve() as mc:
                ok = mc.set(key, value, time=self._ttl)
        except pylibmc.Error as exc:
            raise CacheError(f"memcached set: {exc}") from exc
        if not ok:
            raise CacheError("memcached set: not stored")

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


class RedisCache:
    """Redis through redis-py (its connection pool is thread-safe)."""

    def __init__(self, settings: RedisSettings, ttl: int, timeout_ms: int) -> None:
        self._ttl = ttl or None  # 0 = no expiry
        timeout = timeout_ms / 1000
        common: dict[str, object] = {
            "db": settings.db,
            "password": read_password(settings),
            "socket_timeout": timeout,
            "socket_connect_timeout": timeout,
            # One immediate retry: a pooled connection to a restarted server
            # fails once, the retry reconnects. No backoff sleeps.
            "retry": Retry(NoBackoff(), 1),
        }
        if (path := settings.unix_path) is not None:
            self._r = redis.Redis(unix_socket_path=path, **common)  # type: ignore[arg-type]
        else:
            host, port = settings.host_port
            self._r = redis.Redis(host=host, port=port, **common)  # type: ignore[arg-type]

    def fill(self, key: bytes, value: bytes) -> bool:
        try:
            return bool(self._r.set(key, value, nx=True, ex=self._ttl))
        except redis.RedisError as exc:
            raise CacheError(f"redis SET NX: {exc}") from exc

    def publish(self, key: bytes, value: bytes) -> None:
        try:
            ok = self._r.set(key, value, ex=self._ttl)
        except redis.RedisError as exc:
            raise CacheError(f"redis SET: {exc}") from exc
        if not ok:
            raise CacheError("redis SET: not stored")

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
