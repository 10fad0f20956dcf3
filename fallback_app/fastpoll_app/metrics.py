"""Prometheus metrics of the fallback app, served at GET /metrics on the app's own port.

uvicorn runs `--workers N` processes, each with its own counters. The CLI (__main__) points
PROMETHEUS_MULTIPROC_DIR at a directory that is empty when the app starts (a private temporary
one unless the environment names one, e.g. systemd's RuntimeDirectory); prometheus_client then
keeps every worker's values in memory-mapped files there, and /metrics, answered by whichever
worker gets the request, sums them over all workers. Counters of a worker that died stay in the
sum (they must never go backwards); its live gauges are dropped at the next scrape.

Without that variable (tests, an embedding ASGI server) the metrics are per process.

nginx does not proxy /metrics (its public server answers 404 there): scrape the app directly.
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client import multiprocess as _mp

from . import __version__

disable_created_metrics()  # *_created series: noise for counters that start with the process

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"  # set by __main__ before this module is imported

# Seconds: a poll answered by the app is a few ms; a publish waits for SQLite's write lock.
_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
_FAST_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)

REQUESTS = Counter(
    "fastpoll_app_requests",
    "HTTP requests answered by the app, by route, method and status.",
    ["route", "method", "status"],
)
REQUEST_SECONDS = Histogram(
    "fastpoll_app_request_duration_seconds",
    "Time to answer a request, by route.",
    ["route"],
    buckets=_LATENCY_BUCKETS,
)
CACHE_FILLS = Counter(
    "fastpoll_app_cache_fills",
    "Cache fills after a poll the app answered: stored (add took), exists (the key was "
    "already there), error (cache unreachable: answered, not cached), skipped (not the "
    "user's canonical key: answered, never cached), busy (the user's order was taken too "
    "long: answered from the database, not cached).",
    ["result"],
)
PUBLISHES = Counter(
    "fastpoll_app_publishes",
    "Writes (new message, mark read) by what happened to the cached answer: written, or "
    "pending (the cache failed; the repair thread rewrites it).",
    ["result"],
)
REPAIRS = Counter(
    "fastpoll_app_repairs",
    "Repair rounds for users whose cached answer may be stale: verified, rewritten, failed.",
    ["result"],
)
REPAIR_PENDING = Gauge(
    "fastpoll_app_repair_pending",
    "Outbox backlog: users whose cached answer awaits a (repeated) write, every app host's "
    "(rows in the database's outbox, as counted by the last repair round). Alert if it grows.",
    multiprocess_mode="livemax",
)
CACHE_RECONNECTS = Counter(
    "fastpoll_app_cache_reconnects",
    "memcached operations tried once more at once because the pooled connection was lost (a "
    "restarted node closes it; libmemcached reconnects on the next use).",
)
CACHE_TOO_LARGE = Counter(
    "fastpoll_app_cache_too_large",
    "Cache writes a memcached node refused as too large for its item size (-I), by op: put (a "
    "publish or a repair; the key is deleted on that node instead, so polls miss and the app "
    "answers them from the database) or fill (answered, not cached). Keep [cache] "
    "item_max_bytes at or below memcached's -I (docs/channels.md, \"A room's size\").",
    ["op"],
)
REPAIR_STUCK = Gauge(
    "fastpoll_app_repair_stuck_seconds",
    "Age of the oldest outbox row this process has seen fail its repairs without a success "
    "since (0: none): how long a cached answer has stayed possibly stale. A row no longer seen "
    "failing for REPAIR_STUCK_FORGET seconds (another host repaired it, or its publish did) is "
    "forgotten. Alert when it grows (docs/runbook.md).",
    multiprocess_mode="livemax",
)
ANNOUNCEMENTS = Counter(
    "fastpoll_app_announcements",
    "Announcements of a written poll key on Redis pub/sub (docs/api.md): sent, or failed "
    "(the write stands; held polls of that key wait for the poll server's re-check).",
    ["result"],
)
STREAM_ANSWERS = Counter(
    "fastpoll_app_stream_answers_total",
    "Event-stream polls (Accept: text/event-stream) the app answered as a one-event stream.",
)
NOT_MODIFIED = Counter(
    "fastpoll_app_not_modified",
    "Polls the app answered 304 Not Modified (If-None-Match matched the current answer).",
)
CACHE_SECONDS = Histogram(
    "fastpoll_app_cache_seconds",
    "Time of a cache write by the app: fill (add) or publish (set).",
    ["op"],
    buckets=_FAST_BUCKETS,
)
DB_SECONDS = Histogram(
    "fastpoll_app_db_seconds",
    "Database time: read (a poll answer); SQLite also begin (BEGIN IMMEDIATE, i.e. waiting "
    "for the write lock) and commit.",
    ["op"],
    buckets=_FAST_BUCKETS,
)
BUILD_INFO = Gauge(
    "fastpoll_app_build_info",
    "Version of the fallback app.",
    ["version"],
    multiprocess_mode="max",
)

# Routes by path; anything else is "other", so a scan of odd URLs cannot add label values.
_ROUTES = {
    "/api/messages": "publish",
    "/api/messages/read": "read",
    "/api/poll-url": "poll_url",
    "/healthz": "healthz",
    "/metrics": "metrics",
}
_METHODS = frozenset({"GET", "HEAD", "POST"})
_LIVE_GAUGE_FILE = re.compile(r"gauge_live\w*?_(\d+)\.db")


def route_of(path: str) -> str:
    if path.startswith("/Poll/"):
        return "poll"
    return _ROUTES.get(path, "other")


def _drop_dead_workers(path: str) -> None:
    """Forget the live gauges of workers that are gone (uvicorn restarts dead workers)."""
    pids = {int(m.group(1)) for f in os.listdir(path) if (m := _LIVE_GAUGE_FILE.fullmatch(f))}
    for pid in pids:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            _mp.mark_process_dead(pid, path)
        except PermissionError:
            pass  # alive, another user's: not ours to judge


# A row this process no longer sees failing for this long is forgotten: another host repaired
# it, or a later publish wrote the answer. A failing row is claimed again at most 1 s after each
# try (store.OUTBOX_BACKOFF_MAX) by one of the hosts sharing the outbox, so 30 s of silence
# means it is gone.
REPAIR_STUCK_FORGET = 30.0


class StuckRepairs:
    """The outbox rows whose repairs keep failing here, for fastpoll_app_repair_stuck_seconds:
    owner -> (first failure seen, last failure seen), on the monotonic clock."""

    def __init__(self, forget: float = REPAIR_STUCK_FORGET) -> None:
        self._forget = forget
        self._lock = threading.Lock()
        self._rows: dict[int, tuple[float, float]] = {}

    def failed(self, owner: int) -> None:
        now = time.monotonic()
        with self._lock:
            first = self._rows.get(owner, (now, now))[0]
            self._rows[owner] = (first, now)

    def repaired(self, owner: int) -> None:
        with self._lock:
            self._rows.pop(owner, None)

    def age(self, backlog: int) -> float:
        """Seconds the oldest row still failing has failed; `backlog` is the outbox's row count
        (0: every row is gone, whoever settled it)."""
        now = time.monotonic()
        with self._lock:
            if backlog == 0:
                self._rows.clear()
            for owner, (_, last) in list(self._rows.items()):
                if now - last > self._forget:
                    del self._rows[owner]
            return now - min((f for f, _ in self._rows.values()), default=now)

    def observe(self, backlog: int) -> None:
        REPAIR_STUCK.set(self.age(backlog))


_config_sha256 = ""


def set_config_sha256(sha256: str) -> None:
    global _config_sha256
    _config_sha256 = sha256


def _config_info() -> bytes:
    """fastpoll_config_info{sha256="<hex>"} 1: the config this worker read at start (a deploy
    compares it with the file's to know the app must restart)."""
    if not _config_sha256:
        return b""
    return (
        b"# HELP fastpoll_config_info SHA-256 of the config file the app read at start.\n"
        b"# TYPE fastpoll_config_info gauge\n"
        b'fastpoll_config_info{sha256="' + _config_sha256.encode() + b'"} 1\n'
    )


def render() -> tuple[bytes, str]:
    """The exposition for GET /metrics, and its content type."""
    path = os.environ.get(MULTIPROC_ENV)
    if not path:
        return generate_latest(REGISTRY) + _config_info(), CONTENT_TYPE_LATEST
    _drop_dead_workers(path)
    registry = CollectorRegistry()
    _mp.MultiProcessCollector(registry, path)
    return generate_latest(registry) + _config_info(), CONTENT_TYPE_LATEST


def started() -> None:
    """Called once per worker at start-up."""
    BUILD_INFO.labels(__version__).set(1)
    REPAIR_PENDING.set(0)
    REPAIR_STUCK.set(0)


Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class MetricsMiddleware:
    """Counts and times every HTTP request (pure ASGI: streaming bodies pass through)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500  # unless a response starts: an exception that escaped

        async def send_counted(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, send_counted)
        finally:
            route = route_of(scope.get("path", ""))
            method = scope.get("method", "")
            REQUESTS.labels(route, method if method in _METHODS else "other", str(status)).inc()
            REQUEST_SECONDS.labels(route).observe(time.perf_counter() - start)


class Timer:
    """`with Timer(DB_SECONDS, "read"):` observes the block's duration."""

    __slots__ = ("_hist", "_label", "_t0")

    def __init__(self, hist: Histogram, label: str) -> None:
        self._hist = hist
        self._label = label
        self._t0 = 0.0

    def __enter__(self) -> None:
        self._t0 = time.perf_counter()

    def __exit__(self, *exc: object) -> None:
        self._hist.labels(self._label).observe(time.perf_counter() - self._t0)
