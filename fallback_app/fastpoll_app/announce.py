"""Announcements: after every cache write the app PUBLISHes the written key on Redis pub/sub,
so a poll server holding `wait=` polls of that key re-reads it at once (docs/api.md,
"Announcements"). Best effort by design: a lost announcement costs a held poll the poll
server's re-check interval, never a wrong answer, so a failed PUBLISH never fails a write; it is
counted (fastpoll_app_announcements{result="failed"}) and logged at most once per 10 s.

The message is `<key> <unix_ms>`: the key as written to the cache, a space (keys never hold
one), and when the app published it in Unix milliseconds, from which each poll server times
publish-to-delivery (fastpoll_publish_to_delivery_seconds). A poll server that predates the
suffix takes the whole message for a key it does not hold and wakes its polls by the re-check
alone: upgrade the poll servers first.
"""

from __future__ import annotations

import logging
import time

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from .cache import RateLimitedLog, sentinels
from .config import AnnounceSettings, RedisSettings, Settings, read_password
from .metrics import ANNOUNCEMENTS

log = logging.getLogger(__name__)

# A PUBLISH is one round trip on loopback or a LAN; a Redis that does not answer within this
# must not hold a publish up for long (the write has committed and its cache write is done).
ANNOUNCE_TIMEOUT = 0.25


def message(key: bytes, published_ms: int) -> bytes:
    """The announcement of a write of `key` published at `published_ms` (Unix ms). A key
    never holds a space (keys.py takes them from request-targets, which cannot), so the poll
    server splits at the first one."""
    return key + b" " + str(published_ms).encode("ascii")


class Announcer:
    """PUBLISH <channel> <key> <unix_ms> on one Redis; thread-safe (redis-py's pool)."""

    def __init__(self, r: redis.Redis, channel: str) -> None:
        self._r = r
        self.channel = channel.encode("ascii")
        self._warn = RateLimitedLog(log)

    def announce(self, key: bytes) -> bool:
        try:
            self._r.publish(self.channel, message(key, time.time_ns() // 1_000_000))
        except redis.RedisError as exc:
            ANNOUNCEMENTS.labels("failed").inc()
            self._warn.warning("announce", f"announcement of a write failed: {exc}")
            return False
        ANNOUNCEMENTS.labels("sent").inc()
        return True

    def announce_many(self, keys: list[bytes]) -> bool:
        """Every key's announcement in one round trip (a pipeline)."""
        ms = time.time_ns() // 1_000_000
        try:
            pipe = self._r.pipeline(transaction=False)
            for key in keys:
                pipe.publish(self.channel, message(key, ms))
            pipe.execute()
        except redis.RedisError as exc:
            ANNOUNCEMENTS.labels("failed").inc(len(keys))
            self._warn.warning("announce", f"announcements of a batch failed: {exc}")
            return False
        ANNOUNCEMENTS.labels("sent").inc(len(keys))
        return True

    def close(self) -> None:
        self._r.close()


def _client(
    server: str, password: str | None, username: str | None, sentinel: RedisSettings | None
) -> redis.Redis:
    common: dict[str, object] = {
        "password": password,
        "username": username,
        "socket_timeout": ANNOUNCE_TIMEOUT,
        "socket_connect_timeout": ANNOUNCE_TIMEOUT,
        "retry": Retry(NoBackoff(), 1),  # a pooled connection to a restarted server: once more
    }
    if sentinel is not None and sentinel.master_name:
        s = sentinels(sentinel, ANNOUNCE_TIMEOUT)
        return s.master_for(sentinel.master_name, **common)  # type: ignore[arg-type,no-any-return]
    if server.startswith("unix:"):
        return redis.Redis(unix_socket_path=server[5:], **common)  # type: ignore[arg-type]
    host, _, port = server.rpartition(":")
    return redis.Redis(host=host, port=int(port), **common)  # type: ignore[arg-type]


def make_announcer(settings: Settings) -> Announcer | None:
    """[announce] server if set; else the master [redis] sentinels name (with either backend:
    pub/sub reaches the subscribers of the server it is published on, and the poll servers
    subscribe on the master the same sentinels name); else the cache's Redis with the Redis
    backend; else None."""
    a: AnnounceSettings = settings.announce
    if a.server is not None:
        r = _client(a.server, read_password(a), a.username, None)
    elif settings.cache.backend == "redis" or settings.redis.sentinels:
        rs = settings.redis
        sentinel = rs if rs.sentinels else None
        r = _client(rs.server, read_password(rs), rs.username, sentinel)
    else:
        return None
    return Announcer(r, a.channel)
