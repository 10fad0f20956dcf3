"""Poll, publish and mark-read, with the cache kept free of stale answers.

All methods block (SQLite, pylibmc, redis-py): call them from a threadpool.
The ordering rules are explained in docs/api.md ("No stale answer").
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from collections.abc import Callable
from typing import TypeVar

from .cache import Cache, CacheError, RateLimitedLog
from .config import Settings
from .keys import InvalidKey, derive_key
from .metrics import CACHE_FILLS, CACHE_SECONDS, PUBLISHES, REPAIR_PENDING, REPAIRS, Timer
from .store import Message, Store, Tx

log = logging.getLogger(__name__)

POLL_PATH = b"/getMessages"
REPAIR_INTERVAL = 1.0

T = TypeVar("T")


class FastPoll:
    def __init__(
        self, settings: Settings, store: Store, fill_cache: Cache, publish_cache: Cache
    ) -> None:
        self.settings = settings
        self.store = store
        self._fill = fill_cache
        self._publish = publish_cache
        self._warn = RateLimitedLog(log)
        # Users whose cached answer may be stale because a publish could not
        # reach the cache; rewritten by the repair thread until it succeeds.
        self._pending: set[int] = set()
        self._pending_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- keys -------------------------------------------------------------

    def derive(self, target: bytes) -> bytes | None:
        """Cache key for a request-target (mount stripped), None if invalid."""
        k = self.settings.keys
        try:
            return derive_key(k.prefix, target, k.params)
        except InvalidKey:
            return None

    def user_key(self, user_id: int) -> bytes:
        """The one key of user_id's answer: the only key the app ever writes."""
        key = self.derive(POLL_PATH + b"?user_id=%d" % user_id)
        assert key is not None  # digits only, far below 250 bytes
        return key

    # -- poll -------------------------------------------------------------

    def poll(self, user_id: int, key: bytes | None) -> bytes:
        """Answer a poll from SQLite and fill the cache with `add`.

        Only the user's canonical key is filled. Another key (an extra keyed
        parameter, `user_id=007`) is answered but not cached: publish could
        not find it to rewrite it, so it could go stale.
        """
        if key is None or key != self.user_key(user_id):
            CACHE_FILLS.labels("skipped").inc()
            return self.store.poll_answer(user_id)
        # Under the user's lock, so no write can commit and `set` between our read and our `add`
        # (the key may have been evicted, and the `add` would then store the older answer).
        with self.store.user_lock(user_id):
            answer = self.store.poll_answer(user_id)
            try:
                with Timer(CACHE_SECONDS, "fill"):
                    stored = self._fill.fill(key, answer)
                CACHE_FILLS.labels("stored" if stored else "exists").inc()
            except CacheError as exc:
                CACHE_FILLS.labels("error").inc()
                self._warn.warning("fill", f"cache fill failed, answered without caching: {exc}")
        return answer

    # -- writers ------------------------------------------------------------

    def publish(self, user_id: int, text: str) -> tuple[Message, bool]:
        """Store a message and rewrite the user's cached answer.

        Returns (message, cache_written).
        """
        return self._write(user_id, lambda tx: tx.add_message(user_id, text))

    def mark_read(self, user_id: int) -> tuple[int, bool]:
        """Mark the user's messages read; returns (count, cache_written)."""
        return self._write(user_id, lambda tx: tx.mark_read(user_id))

    def _write(self, user_id: int, change: Callable[[Tx], T]) -> tuple[T, bool]:
        """BEGIN IMMEDIATE; change; compute the answer and `set` it; COMMIT."""
        try:
            with self.store.user_lock(user_id), self.store.write() as tx:
                result = change(tx)
                written = self._rewrite(tx, user_id)
        except sqlite3.Error:
            # If COMMIT failed after the set, the cache shows a state that was
            # never committed: rewrite it from the database.
            self._mark_pending(user_id)
            self.repair(user_id)
            raise
        return result, written

    def _rewrite(self, tx: Tx, user_id: int) -> bool:
        """Inside the write transaction: compute the new answer and `set` it.

        The write lock is still held, so no other writer can interleave, and
        the key exists before COMMIT, so a fill computed from the old snapshot
        fails its `add`.
        """
        answer = tx.poll_answer(user_id)
        try:
            with Timer(CACHE_SECONDS, "publish"):
                self._publish.publish(self.user_key(user_id), answer)
        except CacheError as exc:
            PUBLISHES.labels("pending").inc()
            self._warn.warning("publish", f"cache publish failed, will retry: {exc}")
            self._mark_pending(user_id)
            return False
        PUBLISHES.labels("written").inc()
        return True

    def _mark_pending(self, user_id: int) -> None:
        with self._pending_lock:
            self._pending.add(user_id)
            REPAIR_PENDING.set(len(self._pending))

    def repair(self, user_id: int) -> str:
        """One repair round for user_id under the write lock (no data change).

        A `set` that failed by timeout may still sit in a hung server's socket
        buffer and land later, after a newer write. So a user stays pending
        until a round finds the cache already equal to the database; a round
        that finds it different rewrites it and checks again next round.
        Returns "verified", "rewritten" or "failed".
        """
        key = self.user_key(user_id)
        try:
            with self.store.user_lock(user_id), self.store.write() as tx:
                answer = tx.poll_answer(user_id)
                verified = self._publish.get(key) == answer
                if not verified:
                    self._publish.publish(key, answer)
        except (CacheError, sqlite3.Error) as exc:
            REPAIRS.labels("failed").inc()
            self._warn.warning("repair", f"cache repair failed, will retry: {exc}")
            return "failed"
        if not verified:
            REPAIRS.labels("rewritten").inc()
            return "rewritten"
        REPAIRS.labels("verified").inc()
        with self._pending_lock:
            self._pending.discard(user_id)
            REPAIR_PENDING.set(len(self._pending))
        return "verified"

    def repair_pending(self) -> int:
        """One repair round for every pending user; return how many remain pending."""
        with self._pending_lock:
            todo = sorted(self._pending)
        for uid in todo:
            if self.repair(uid) == "failed":
                break  # the cache is still failing; try again next round
        with self._pending_lock:
            return len(self._pending)

    @property
    def pending(self) -> frozenset[int]:
        with self._pending_lock:
            return frozenset(self._pending)

    # -- lifecycle ----------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._repair_loop, name="cache-repair", daemon=True)
        self._thread.start()

    def _repair_loop(self) -> None:
        while not self._stop.wait(REPAIR_INTERVAL):
            if self.pending:
                self.repair_pending()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._fill.close()
        if self._publish is not self._fill:
            self._publish.close()
        self.store.close()
