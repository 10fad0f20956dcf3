"""Poll, publish and mark-read, with the cache kept free of stale answers.

All methods block (database, pylibmc, redis-py): call them from a threadpool.
The ordering rules are explained in docs/api.md ("No stale answer").
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from .announce import Announcer
from .cache import Cache, CacheError, RateLimitedLog
from .channels import Listed, channel_key, compose, message_doc
from .config import Settings
from .keys import InvalidKey, derive_key
from .metrics import (
    CACHE_FILLS,
    CACHE_SECONDS,
    PUBLISHES,
    REPAIR_PENDING,
    REPAIRS,
    StuckRepairs,
    Timer,
)
from .store import (
    ConnectionLost,
    Message,
    Snapshot,
    Store,
    StoreError,
    Tx,
    UserBusy,
    UserSession,
)

log = logging.getLogger(__name__)

POLL_PATH = b"/getMessages"
REPAIR_INTERVAL = 1.0
# Outbox rows one repair round takes, and how many it repairs at once: a hung node's keys each
# wait for the cache timeout, in parallel, so they do not hold up the keys of healthy nodes.
REPAIR_BATCH = 64
REPAIR_THREADS = 4
# Attempts of one poll or write whose database connection broke (a restart, a terminated
# backend): each retry takes a new connection. A write's retry first checks whether the broken
# attempt committed (publish: its message id), so a message is stored once.
STORE_TRIES = 3

T = TypeVar("T")


def is_the_same(found: Message | None, inserted: Message) -> bool:
    """Whether `found`, read by id, is the message an earlier attempt inserted. An id can come
    back for another message (SQLite reuses a rolled-back rowid, a failover may lose the
    sequence's last steps), so the owner, text, data and time must match too."""
    return found is not None and (
        found.id,
        found.user_id,
        found.text,
        found.data,
        found.created,
    ) == (inserted.id, inserted.user_id, inserted.text, inserted.data, inserted.created)


class FastPoll:
    def __init__(
        self,
        settings: Settings,
        store: Store,
        fill_cache: Cache,
        publish_cache: Cache,
        announcer: Announcer | None = None,
    ) -> None:
        self.settings = settings
        self.store = store
        self._fill = fill_cache
        self._publish = publish_cache
        self._announcer = announcer
        self._warn = RateLimitedLog(log)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._repairers: ThreadPoolExecutor | None = None
        self._names: dict[int, str] = {}  # channel id -> name (never changes)
        self._stuck = StuckRepairs()  # fastpoll_app_repair_stuck_seconds

    # -- keys -------------------------------------------------------------

    def derive(self, target: bytes) -> bytes | None:
        """Cache key for a request-target (mount stripped), None if invalid."""
        k = self.settings.keys
        try:
            return derive_key(k.prefix, target, k.params)
        except InvalidKey:
            return None

    def user_key(self, user_id: int) -> bytes:
        """The one key of user_id's answer: the only user key the app ever writes."""
        key = self.derive(POLL_PATH + b"?user_id=%d" % user_id)
        if key is None:  # digits only, far below 250 bytes: cannot happen
            raise ValueError(f"no cache key for user {user_id}")
        return key

    def channel_owner(self, name: str) -> int:
        """The owner id of a channel (store.py): minus its id; the channel is made if new."""
        cid = self.store.channel_id(name)
        self._names[cid] = name
        return -cid

    def key_of(self, owner: int) -> bytes:
        """The cache key of an owner: a user's key, or a channel's (prefix#name)."""
        if owner >= 0:
            return self.user_key(owner)
        name = self._names.get(-owner)
        if name is None:
            name = self.store.channel_name(-owner)
            if name is None:
                raise ValueError(f"no channel {-owner}")
            self._names[-owner] = name
        return channel_key(self.settings.keys.prefix, name.encode("ascii"))

    # -- poll -------------------------------------------------------------

    def poll(self, user_id: int, key: bytes | None) -> bytes:
        """Answer a poll from the database and fill the cache with `add` (poll_filled)."""
        return self.poll_filled(user_id, key)[0]

    def poll_filled(self, user_id: int, key: bytes | None) -> tuple[bytes, bool]:
        """Answer a poll from the database and fill the cache with `add`; with the answer,
        whether this fill stored the key: a plain miss, which the cache answers from now on.
        False when the key was cached already (the poll server could not read it: a 503, a
        poller down or hung), the fill failed, or it was not tried.

        Only the user's canonical key is filled. Another key (an extra keyed
        parameter, `user_id=007`) is answered but not cached: publish could
        not find it to rewrite it, so it could go stale.
        """
        answer, fill = self._user_filled(user_id, key)
        return answer, fill == "stored"

    def _user_filled(self, user_id: int, key: bytes | None) -> tuple[bytes, str]:
        if key is None or key != self.user_key(user_id):
            CACHE_FILLS.labels("skipped").inc()
            return self._retrying(lambda: self.store.poll_answer(user_id)), "skipped"
        return self._filled(user_id, key)

    def poll_channels(self, user_id: int, key: bytes | None, names: list[bytes]) -> bytes:
        """The composed answer of a poll of the user and `names` (docs/channels.md); each
        channel's part filled in the cache (`add`: a part already cached stays)."""
        return self.poll_channels_filled(user_id, key, names)[0]

    def poll_channels_filled(
        self, user_id: int, key: bytes | None, names: list[bytes]
    ) -> tuple[bytes, bool]:
        """poll_channels(), and whether the cache answers the next such poll because of it:
        every fill stored its key or found it cached, and at least one stored it."""
        user, fill = self._user_filled(user_id, key)
        fills = [fill]
        parts = []
        for n in names:
            owner = self.channel_owner(n.decode("ascii"))
            part, fill = self._filled(owner, self.key_of(owner))
            parts.append((n, part))
            fills.append(fill)
        filled = "stored" in fills and all(f in ("stored", "exists") for f in fills)
        return compose(user, parts), filled

    def history(self, owner: int, after: int, limit: int) -> bytes:
        """The history read's answer (docs/api.md, "The history read"): the owner's unread
        messages after `after`, ascending, at most `limit`, and whether more follow. Read from
        the database alone: never cached, nothing filled."""
        msgs, more = self._retrying(lambda: self.store.history_after(owner, after, limit))
        doc = {"messages": [message_doc(m) for m in msgs], "more": more}
        return json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode("utf-8")

    def channel_part(self, name: str) -> bytes:
        owner = self.channel_owner(name)
        return self._filled(owner, self.key_of(owner))[0]

    def _filled(self, owner: int, key: bytes) -> tuple[bytes, str]:
        """The owner's answer, filled under key; with the fill's outcome: stored, exists,
        error or busy (not tried: the owner's order is taken)."""
        try:
            return self._retrying(lambda: self._fill_from_db(owner, key))
        except UserBusy:
            # The owner's order is taken (a write stuck on a hung node, another host): answer
            # from the database at once, without the fill, which needs the order.
            CACHE_FILLS.labels("busy").inc()
            return self._retrying(lambda: self.store.poll_answer(owner)), "busy"

    def _fill_from_db(self, user_id: int, key: bytes) -> tuple[bytes, str]:
        # In the user's order, so no write can commit and write the cache between our read and
        # our `add` (the key may have been evicted, and the `add` would store the older answer).
        with self.store.user(user_id) as session:
            snap: Snapshot = session.snapshot()
            try:
                with Timer(CACHE_SECONDS, "fill"):
                    stored = self._fill.fill(key, snap.answer, snap.version)
                fill = "stored" if stored else "exists"
            except CacheError as exc:
                fill = "error"
                self._warn.warning("fill", f"cache fill failed, answered without caching: {exc}")
            CACHE_FILLS.labels(fill).inc()
        return snap.answer, fill

    def _retrying(self, op: Callable[[], T]) -> T:
        """op(), again on a new connection when the database connection broke under it."""
        for attempt in range(1, STORE_TRIES + 1):
            try:
                return op()
            except ConnectionLost as exc:
                if attempt == STORE_TRIES:
                    raise
                self._warn.warning("retry", f"database connection lost, retrying: {exc}")
        raise AssertionError("unreachable")

    # -- writers ------------------------------------------------------------

    def publish(
        self, user_id: int, text: str, idem_key: str | None = None, data: str | None = None
    ) -> tuple[Message, bool | None]:
        """Store a message (`data`: its compact JSON encoding) and rewrite the user's cached
        answer.

        Returns (message, cache_written); cache_written is None for an idempotent replay (the
        message was stored before; nothing changed now). A channel's owner id (channel_owner)
        publishes to the channel."""
        replay = [False]
        stored: list[Message] = []  # what an attempt inserted, committed or not

        def change(tx: Tx) -> Message:
            if stored:
                # An earlier attempt's connection broke, maybe after its COMMIT reached the
                # server: if its message is there, the cache write it did not make is made now.
                earlier = tx.get_message(stored[0].id)
                if is_the_same(earlier, stored[0]):
                    replay[0] = False
                    return stored[0]
            msg, replay[0] = tx.add_message(text, idem_key, data)
            if not replay[0]:
                stored[:] = [msg]
            return msg

        return self._write(user_id, change, lambda: replay[0])

    def publish_channel(
        self, name: str, text: str, idem_key: str | None = None, data: str | None = None
    ) -> tuple[Message, bool | None]:
        """Store a message in the channel and rewrite the channel's cached answer."""
        return self.publish(self.channel_owner(name), text, idem_key, data)

    def publish_batch(self, items: list[Listed]) -> tuple[list[Message], bool]:
        """Messages for many owners [(owner, text)] or [(owner, text, data)] in one transaction
        (every owner's order held, ascending), then one pipelined cache write of every owner's
        answer and the announcements in one round trip. (messages in order, every cache write
        made)."""
        rows = [(i[0], i[1], i[2] if len(i) > 2 else None) for i in items]
        owners = sorted({o for o, *_ in rows})
        keys = {o: self.key_of(o) for o in owners}
        stored: list[Message] = []  # what an attempt inserted, committed or not

        def once() -> tuple[list[Message], bool]:
            with self.store.users(owners) as session:
                with session.write() as tx:
                    # A retry after a broken connection: if the first message is there, the
                    # whole transaction committed; its cache write is made now.
                    earlier = tx.get_message(stored[0].id) if stored else None
                    if stored and is_the_same(earlier, stored[0]):
                        msgs = list(stored)
                    else:
                        msgs = tx.add_messages(rows)
                        stored[:] = msgs
                    snaps = tx.bump_many(owners)
                # In the orders, out of the transaction: the cache write, then the outbox.
                try:
                    with Timer(CACHE_SECONDS, "publish"):
                        self._publish.put_many(
                            [(keys[o], snaps[o].answer, snaps[o].version) for o in owners]
                        )
                except CacheError as exc:
                    PUBLISHES.labels("pending").inc(len(owners))
                    self._warn.warning("publish", f"batch cache write failed: {exc}")
                    return msgs, False
                PUBLISHES.labels("written").inc(len(owners))
                try:
                    session.settled({o: s.version for o, s in snaps.items()})
                except StoreError as exc:
                    self._warn.warning("settle", f"outbox rows not dropped: {exc}")
                return msgs, True

        msgs, written = self._retrying(once)
        if written and self._announcer is not None:
            self._announcer.announce_many([keys[o] for o in owners])
        return msgs, written

    def mark_read(self, user_id: int, up_to_id: int) -> tuple[int, bool]:
        """Mark the user's unread messages with id <= up_to_id read; (count, cache_written)."""
        count, written = self._write(user_id, lambda tx: tx.mark_read(up_to_id), lambda: False)
        return count, bool(written)

    def _write(
        self, user_id: int, change: Callable[[Tx], T], unchanged: Callable[[], bool]
    ) -> tuple[T, bool | None]:
        """In the user's order: one transaction (change, version + 1, outbox row, new answer),
        COMMIT, then the conditional cache write, then the outbox row is dropped. No cache I/O
        inside the transaction: SQLite's write lock is database-wide. After a cache write, out
        of the user's order, the key is announced (a lost or reordered announcement only makes
        a poll server re-read the key later: the message carries no state)."""
        result, written, replayed = self._retrying(
            lambda: self._write_once(user_id, change, unchanged)
        )
        if written:
            self.announce(user_id)
        return result, None if replayed else written

    def _write_once(
        self, user_id: int, change: Callable[[Tx], T], unchanged: Callable[[], bool]
    ) -> tuple[T, bool, bool]:
        """(result, cache written, replayed)."""
        with self.store.user(user_id) as session:
            with session.write() as tx:
                result = change(tx)
                replayed = unchanged()
                if not replayed:
                    snap = tx.bump()
            if replayed:
                # An idempotent replay changes nothing, but the first attempt may have committed
                # without its cache write (the write failed, or its process died): the current
                # answer is written again, so that this answer too means no older state is shown.
                snap = session.snapshot()
            return result, self._put(session, user_id, snap), replayed

    def announce(self, owner: int) -> bool:
        """Tell the poll servers that the owner's cached answer changed; False if not sent (no
        [announce] target, or Redis failed: counted, never raised)."""
        if self._announcer is None:
            return False
        return self._announcer.announce(self.key_of(owner))

    def _put(self, session: UserSession, owner: int, snap: Snapshot) -> bool:
        try:
            with Timer(CACHE_SECONDS, "publish"):
                self._publish.put(self.key_of(owner), snap.answer, snap.version)
        except CacheError as exc:
            PUBLISHES.labels("pending").inc()
            self._warn.warning("publish", f"cache write failed, the outbox has it: {exc}")
            return False
        PUBLISHES.labels("written").inc()
        try:
            session.settled(snap.version)
        except StoreError as exc:  # the row stays; a repair will verify the key once more
            self._warn.warning("settle", f"outbox row not dropped: {exc}")
        return True

    # -- repairs ------------------------------------------------------------

    def repair(self, user_id: int) -> str:
        """Write the user's current answer (conditionally) and drop the outbox row up to its
        version. Returns "rewritten" or "failed" (the row stays, claimed again after back-off).
        One successful conditional write is enough: an older write landing later fails its
        `cas` (memcached) or its version compare (Redis)."""
        try:
            with self.store.user(user_id) as session:
                snap = session.snapshot()
                self._publish.put(self.key_of(user_id), snap.answer, snap.version)
                session.settled(snap.version)
        except (CacheError, StoreError, ValueError) as exc:
            REPAIRS.labels("failed").inc()
            self._stuck.failed(user_id)
            self._warn.warning("repair", f"cache repair failed, will retry: {exc}")
            return "failed"
        REPAIRS.labels("rewritten").inc()
        self._stuck.repaired(user_id)
        # The write whose cache write failed was not announced: polls held on the old answer
        # learn of it now.
        self.announce(user_id)
        return "rewritten"

    def repair_pending(self) -> int:
        """One round: claim the due outbox rows, repair them side by side, and return the
        backlog (rows still pending, every host's)."""
        self._round()
        return self._backlog()

    def _round(self) -> tuple[int, int]:
        """(rows claimed, rows rewritten)."""
        try:
            todo = self.store.claim_outbox(REPAIR_BATCH)
        except StoreError as exc:
            self._warn.warning("claim", f"outbox claim failed: {exc}")
            todo = []
        if todo:
            if self._repairers is None:
                self._repairers = ThreadPoolExecutor(REPAIR_THREADS, "cache-repair")
            done = list(self._repairers.map(self.repair, todo))
            return len(todo), done.count("rewritten")
        return 0, 0

    def _backlog(self) -> int:
        try:
            backlog = self.store.outbox_backlog()
        except StoreError as exc:
            self._warn.warning("claim", f"outbox count failed: {exc}")
            return -1
        REPAIR_PENDING.set(backlog)
        self._stuck.observe(backlog)
        return backlog

    # -- lifecycle ----------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._repair_loop, name="cache-repair", daemon=True)
        self._thread.start()

    def _repair_loop(self) -> None:
        wait = REPAIR_INTERVAL
        while not self._stop.wait(wait):
            wait = REPAIR_INTERVAL
            try:
                # A full batch that made progress: more rows may be due (a node back after an
                # outage); go on at once, so its keys are rewritten within the poll servers'
                # recovery_ms. A batch that all failed (the node still away) waits.
                claimed, rewritten = self._round()
                self._backlog()
                if claimed >= REPAIR_BATCH and rewritten > 0:
                    wait = 0.0
            except Exception as exc:  # the loop must outlive any one round
                self._warn.warning("repair-loop", f"repair round failed: {exc!r}")

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._repairers is not None:
            self._repairers.shutdown(wait=True)
        self._fill.close()
        if self._publish is not self._fill:
            self._publish.close()
        if self._announcer is not None:
            self._announcer.close()
        self.store.close()
