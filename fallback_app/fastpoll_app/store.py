"""The messages, the authority every poll answer is computed from: one Store interface, two
implementations, SQLite (embedded, one host) and PostgreSQL (shared by every app host).

What the rest of the app relies on (docs/api.md, "No stale answer"; docs/design.md, "The app
tier"):

- ``store.user(uid)`` holds the user's **order**: writes, fills and repairs of one user never
  overlap, across threads, worker processes and (PostgreSQL) hosts. SQLite: a striped fcntl lock
  next to the database file (locks.py). PostgreSQL: a session advisory lock on the user's slot
  (owner id mod PG_ORDER_SLOTS), held across the write's COMMIT and the cache write after it; a
  batch takes its owners' slots in ascending order, so it holds at most PG_ORDER_SLOTS locks
  whatever its size, and lets go of every one it took on any failure.
  Cache I/O happens under this per-user lock only, never inside a database transaction.
- Every write increments the user's ``version`` (table ``users``) and records an **outbox** row
  (user, version) in the same transaction; the row is deleted once the cache holds that version.
  A row left behind (cache down, app killed) is drained by the repair worker of any app host.
- ``idempotency keys``: a publish with a key stores one message per (user, key).
- **Channels** (docs/channels.md) share all of it through an *owner* id: a user's id (>= 0), or
  minus a channel's id (table ``channels``, name -> id). A channel's messages, version and outbox
  row are stored under its owner id, its order is the owner id's lock, and its answer is its
  newest ``history`` messages (``Store.history``, [channels] history). Channel messages are never
  read (no mark-read), so the unread indexes serve their newest-first reads too. A channel's
  outbox row lives in its own table (``channel_outbox``): a release from before channels,
  running beside this one during a rolling upgrade, repairs the rows of ``outbox`` and would take
  a channel's owner id for a user's. Rows an earlier channels release left in ``outbox`` are
  still repaired and settled there.

The schema is versioned (table ``schema_version``) and created by ``migrate()``
(``python -m fastpoll_app migrate``). SQLite migrates itself when opened; PostgreSQL refuses
to serve an unmigrated database.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass
from typing import Any, Protocol

from .channels import Listed, encode_channel, message_doc
from .config import AppSettings, read_database_password
from .locks import UserGate, UserLocks
from .metrics import DB_SECONDS, Timer

BUSY_TIMEOUT_MS = 10000
# Connections per worker process to PostgreSQL. A fill or a write holds one for its cache write
# (up to the publish timeout when a cache node hangs), so this bounds how many users' writes
# one worker keeps in flight; 2 hosts x 2 workers x 20 stay under PostgreSQL's default 100.
PG_POOL_MAX = 20
# A new outbox row is left to its own publisher for this long before a repair worker takes it.
OUTBOX_GRACE = 2.0
# Repair back-off: 0.5 s after the first claim, then 1 s. Rows are claimed fewest attempts
# first, so a dead node's keys do not crowd out keys on healthy nodes. The cap stays well below
# [memcached] recovery_ms (default 5 s, docs/design.md "Replicas"): the poll servers read a
# node back from a hang through its replicas for that long, and the outbox must rewrite its stale
# keys within it (cap + the repair loop's 1 s + pylibmc's 1 s retry_timeout: about 3 s at worst).
# The claim itself is the lease: while one worker repairs a user, the row is not due for others.
OUTBOX_BACKOFF_BASE = 0.5
OUTBOX_BACKOFF_MAX = 1.0
SCHEMA_VERSION = 6
# How long a request waits for its user's order (the in-process gate, then PostgreSQL's advisory
# lock: lock_timeout), and how many of one user's requests may wait in one process. The order is
# held for one write, up to the publish timeout per cache node when a node hangs; a user whose
# order stays taken longer (a stuck session, a partitioned host) gets 503, and nobody else waits.
USER_WAIT_S = 3.0
USER_MAX_WAITING = 8
# PostgreSQL: no statement of the app runs long; one that does (a lock queue, a stuck server)
# is cancelled rather than holding its pooled connection. `migrate` lifts it.
PG_STATEMENT_TIMEOUT_MS = 10000
# TCP keepalives on every libpq connection: a peer that vanished without a reset (partition,
# host death) is noticed within idle + interval x count = 5 + 3 x 2 s, not the kernel's 2 hours,
# and its session, advisory locks included, ends with the socket. tcp_user_timeout bounds
# unacknowledged sends the same way.
PG_KEEPALIVES = {
    "keepalives": 1,
    "keepalives_idle": 5,
    "keepalives_interval": 2,
    "keepalives_count": 3,
    "tcp_user_timeout": 11000,
}
# Waiting for a free pooled connection (or for the pool to reconnect): then 503.
PG_POOL_TIMEOUT_S = 5.0
# The users' orders on PostgreSQL: one session advisory lock per slot (owner id mod this), the
# two-int key (PG_ORDER_CLASS, slot). PostgreSQL's lock table is shared by every session and
# sized for about 64 locks per connection, so a batch of 1,000 owners must not take 1,000 locks:
# it takes its owners' slots, at most this many. As SQLite's stripes (locks.py): two users share
# a slot's order with a chance of 1 in 1,024.
PG_ORDER_SLOTS = 1024
PG_ORDER_CLASS = 0x66707032
# How the orders are held on PostgreSQL (table app_state, name 'orders'). ORDERS_COMPAT: the
# owner's slot and, as releases before slots did, a lock on the owner id itself, so that such a
# release still running beside this one (a rolling upgrade) orders one owner's writes against
# this one's; a batch then holds a lock per owner, as those releases did. ORDERS_SLOT: the slot
# only. A database upgraded from a release before slots starts at ORDERS_COMPAT; `migrate
# --contract`, once every app host runs this release, makes it ORDERS_SLOT. A new one starts
# there. Each process reads it again every ORDERS_REFRESH_S: while some read the old value and
# some the new, all of them still take the slots, so no owner goes unordered.
ORDERS_COMPAT = "user+slot"
ORDERS_SLOT = "slot"
ORDERS_REFRESH_S = 2.0


class StoreError(Exception):
    """The database failed (connection, constraint, timeout); callers answer 500 or retry."""


class Unavailable(StoreError):
    """The database cannot serve the request now (down, restarting, every connection busy):
    503 with Retry-After, not 500."""


class UserBusy(Unavailable):
    """The user's order stayed taken for USER_WAIT_S (or too many of the user's requests wait
    for it): this user's request fails with 503, other users are not held up."""


class ConnectionLost(Unavailable):
    """The database connection broke during the operation. Nothing of a transaction whose
    COMMIT was not answered can be assumed either way: the caller retries the whole operation
    on a new connection, and a write checks first whether its earlier attempt committed."""


class NotMigrated(StoreError):
    """The database's schema is older than this app's: run `python -m fastpoll_app migrate`."""


class WritesRefused(Unavailable):
    """The database refuses writes (SQLSTATE 25006: a standby, or default_transaction_read_only
    during maintenance): 503, and the connection is dropped so the pool reconnects until a
    server takes writes."""


class IdempotencyConflict(StoreError):
    """The idempotency key was used before for another message."""


@dataclass(frozen=True)
class Message:
    id: int
    user_id: int
    text: str  # "" for a message published with data only
    created: float
    read: bool
    data: str | None = None  # its data's compact JSON encoding (channels.encode_data)

    def as_json(self) -> dict[str, object]:
        """The publish's answer: its fields in the order they always had, "data" after the
        text only when the message has data."""
        doc: dict[str, object] = {"id": self.id, "user_id": self.user_id}
        doc |= message_doc((self.id, self.text, self.data))
        return doc | {"created": self.created, "read": self.read}


@dataclass(frozen=True)
class Snapshot:
    """A user's answer and the version it belongs to, read in one statement."""

    version: int
    answer: bytes


def encode_answer(unread: int, messages: Sequence[Listed], before: int | None = None) -> bytes:
    """The poll answer for a user with unread messages (format: docs/api.md): `messages` the
    newest unread ones listed, ascending id (the last is `newest`); `before` the id of the
    newest unread message older than those, None when every unread message is listed."""
    doc: dict[str, object] = {
        "unread": unread,
        "newest": message_doc(messages[-1]),
        "messages": [message_doc(m) for m in messages],
    }
    if before is not None:
        doc["before"] = before
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def _listed(rows: list[tuple[Any, ...]], bound: int) -> tuple[list[Listed], int | None]:
    """From up to bound + 1 newest rows (id, text, data), id NULL without messages: the newest
    `bound` ascending, and the id of the one before them (None if there is none)."""
    newest: list[Listed] = [(int(r[0]), r[1], r[2]) for r in rows if r[0] is not None]
    newest.sort(key=lambda m: m[0], reverse=True)
    before = newest[bound][0] if len(newest) > bound else None
    return newest[:bound][::-1], before


def _channel_snapshot(rows: list[tuple[Any, ...]], history: int) -> Snapshot:
    """From _CHANNEL_SNAPSHOT's rows (version, id, text, data), id NULL without messages."""
    version = int(rows[0][0] or 0) if rows else 0
    msgs, before = _listed([r[1:] for r in rows], history)
    return Snapshot(version, encode_channel(msgs, before))


def _snapshot(rows: list[tuple[Any, ...]], listed: int) -> Snapshot:
    """From _SNAPSHOT's rows (version, unread, id, text, data), id NULL without unread."""
    if not rows:
        return Snapshot(0, b"")
    version, unread = int(rows[0][0] or 0), int(rows[0][1] or 0)
    msgs, before = _listed([r[2:] for r in rows], listed)
    if not unread or not msgs:
        return Snapshot(version, b"")
    return Snapshot(version, encode_answer(unread, msgs, before))


# The statements both stores run, written with `?` placeholders (psycopg's are `%s`: _pg_sql).
# FALSE/TRUE: SQLite (>= 3.23) reads them as 0/1, PostgreSQL's column is a boolean.

# One statement, so the version, the count and the newest messages come from one snapshot:
# a row per message of the newest [app] answer_messages + 1 unread (the one past the bound
# gives the answer's "before"), one row with a NULL id when none is unread.
_SNAPSHOT = """
SELECT v.version, v.unread, m.id, m.text, m.data
FROM (SELECT (SELECT version FROM users WHERE user_id = ?) AS version,
             (SELECT COUNT(*) FROM messages WHERE user_id = ? AND read = FALSE) AS unread) v
LEFT JOIN (SELECT id, text, data FROM messages WHERE user_id = ? AND read = FALSE
           ORDER BY id DESC LIMIT ?) m ON TRUE
"""
# A channel's version and newest history + 1 messages in one statement (one row with a NULL
# id: none).
_CHANNEL_SNAPSHOT = """
SELECT v.version, m.id, m.text, m.data
FROM (SELECT (SELECT version FROM users WHERE user_id = ?) AS version) v
LEFT JOIN (SELECT id, text, data FROM messages WHERE user_id = ? AND read = FALSE
           ORDER BY id DESC LIMIT ?) m ON TRUE
"""
# The history read (docs/api.md, "The history read"): an owner's unread messages after an id,
# ascending, one more than asked (it says whether there are more).
_HISTORY = (
    "SELECT id, text, data FROM messages WHERE user_id = ? AND read = FALSE AND id > ? "
    "ORDER BY id LIMIT ?"
)
_FIND_CHANNEL = "SELECT id FROM channels WHERE name = ?"
_ADD_CHANNEL = "INSERT INTO channels (name) VALUES (?) ON CONFLICT (name) DO NOTHING"
_CHANNEL_NAME = "SELECT name FROM channels WHERE id = ?"
# _SNAPSHOT of several users at once ({} the placeholders of their ids; the last ? the
# bound + 1): a row per listed message of each user, one with a NULL id for a user with none.
_SNAPSHOTS = """
SELECT u.user_id, u.version,
       (SELECT COUNT(*) FROM messages WHERE user_id = u.user_id AND read = FALSE),
       m.id, m.text, m.data
FROM users u
LEFT JOIN messages m ON m.user_id = u.user_id AND m.read = FALSE
     AND m.id IN (SELECT id FROM messages WHERE user_id = u.user_id AND read = FALSE
                  ORDER BY id DESC LIMIT ?)
WHERE u.user_id IN ({})
"""
_GET_MESSAGE = "SELECT id, user_id, text, created, read, data FROM messages WHERE id = ?"
_FIND_IDEM = (
    "SELECT id, user_id, text, created, read, data FROM messages WHERE user_id = ? AND idem_key = ?"
)
_INSERT_MESSAGE = (
    "INSERT INTO messages (user_id, text, created, idem_key, data) VALUES (?, ?, ?, ?, ?) "
    "RETURNING id"
)
_MARK_READ = "UPDATE messages SET read = TRUE WHERE user_id = ? AND read = FALSE AND id <= ?"
_BUMP_VERSION = (
    "INSERT INTO users (user_id, version) VALUES (?, 1) ON CONFLICT (user_id) "
    "DO UPDATE SET version = users.version + 1 RETURNING version"
)
_RECORD_OUTBOX = (
    "INSERT INTO {} (user_id, version, due, attempts) VALUES (?, ?, ?, 0) "
    "ON CONFLICT (user_id) DO UPDATE SET version = excluded.version, "
    "due = excluded.due, attempts = 0"
)
_SETTLE_OUTBOX = "DELETE FROM {} WHERE user_id = ? AND version <= ?"
# The outbox tables (the module's docstring): the users', then the channels'.
OUTBOXES = ("outbox", "channel_outbox")


def outbox_of(owner: int) -> str:
    return OUTBOXES[0] if owner >= 0 else OUTBOXES[1]


def settle_outbox(
    executemany: Callable[[str, list[tuple[int, int]]], Any],
    sql: Callable[[str], str],
    pairs: list[tuple[int, int]],
) -> None:
    """Drop the outbox rows of [(owner, version)] up to each version: a channel's from both
    tables (an earlier channels release recorded it in the users')."""
    rooms = [p for p in pairs if p[0] < 0]
    for table, rows in ((OUTBOXES[0], pairs), (OUTBOXES[1], rooms)):
        if rows:
            executemany(sql(_SETTLE_OUTBOX.format(table)), rows)


def _pg_sql(sql: str) -> str:
    return sql.replace("?", "%s")


def _same_sql(sql: str) -> str:
    return sql


def _message(row: tuple[Any, ...]) -> Message:
    return Message(int(row[0]), int(row[1]), row[2], float(row[3]), bool(row[4]), row[5])


@dataclass(frozen=True)
class Bounds:
    """How many messages an answer lists: a channel's ([channels] history) and a user's
    ([app] answer_messages)."""

    history: int = 20
    listed: int = 10


def read_history(
    conn: Any, sql: Callable[[str], str], owner: int, after: int, limit: int
) -> tuple[list[Listed], bool]:
    """The owner's unread messages with id > after, ascending, at most `limit`; and whether
    more follow them."""
    rows = conn.execute(sql(_HISTORY), (owner, after, limit + 1)).fetchall()
    return [(int(r[0]), r[1], r[2]) for r in rows[:limit]], len(rows) > limit


def read_snapshot(conn: Any, sql: Callable[[str], str], owner: int, bounds: Bounds) -> Snapshot:
    """The owner's answer and version, read in one statement on `conn` (either store)."""
    if owner < 0:
        rows = conn.execute(sql(_CHANNEL_SNAPSHOT), (owner, owner, bounds.history + 1))
        return _channel_snapshot(rows.fetchall(), bounds.history)
    rows = conn.execute(sql(_SNAPSHOT), (owner, owner, owner, bounds.listed + 1)).fetchall()
    return _snapshot(rows, bounds.listed)


class Tx:
    """Operations inside one write transaction of one user (UserSession.write), for either
    store: `conn` is a sqlite3 or a psycopg connection, `sql` adapts the placeholders."""

    def __init__(
        self, conn: Any, user_id: int, sql: Callable[[str], str], bounds: Bounds = Bounds()
    ) -> None:
        self._conn = conn
        self._uid = user_id
        self._sql = sql
        self._bounds = bounds

    def _run(self, statement: str, params: tuple[Any, ...]) -> Any:
        return self._conn.execute(self._sql(statement), params)

    def add_message(
        self, text: str, idem_key: str | None, data: str | None = None
    ) -> tuple[Message, bool]:
        """Store a message (`data`: its compact JSON encoding, or None); (message, True) if
        idem_key was seen before (nothing stored). The key with another text or data is an
        IdempotencyConflict."""
        if idem_key is not None:
            row = self._run(_FIND_IDEM, (self._uid, idem_key)).fetchone()
            if row is not None:
                if (row[2], row[5]) != (text, data):
                    raise IdempotencyConflict("idempotency key already used for another message")
                return _message(row), True
        now = time.time()
        (mid,) = self._run(_INSERT_MESSAGE, (self._uid, text, now, idem_key, data)).fetchone()
        return Message(int(mid), self._uid, text, now, False, data), False

    def mark_read(self, up_to_id: int) -> int:
        return int(self._run(_MARK_READ, (self._uid, up_to_id)).rowcount)

    def get_message(self, message_id: int) -> Message | None:
        """The message, if stored (a retried publish asks whether its first attempt committed)."""
        row = self._run(_GET_MESSAGE, (message_id,)).fetchone()
        return _message(row) if row else None

    def bump(self) -> Snapshot:
        """Increment the user's version, record the outbox row, return the new answer."""
        (version,) = self._run(_BUMP_VERSION, (self._uid,)).fetchone()
        self._run(
            _RECORD_OUTBOX.format(outbox_of(self._uid)),
            (self._uid, version, time.time() + OUTBOX_GRACE),
        )
        return read_snapshot(self._conn, self._sql, self._uid, self._bounds)

    # A batch (Store.users): a few set-wise statements for any number of messages and owners.

    def add_messages(self, items: list[tuple[int, str, str | None]]) -> list[Message]:
        """Store [(owner, text, data)]; the messages in the same order. One statement: the ids
        are assigned ascending in the rows' order (sorted, they match the rows)."""
        now = time.time()
        rows = ", ".join(["(?, ?, ?, ?)"] * len(items))
        params = tuple(v for owner, text, data in items for v in (owner, text, now, data))
        cur = self._run(
            f"INSERT INTO messages (user_id, text, created, data) VALUES {rows} RETURNING id",
            params,
        )
        ids = sorted(int(r[0]) for r in cur.fetchall())
        return [Message(i, o, t, now, False, d) for i, (o, t, d) in zip(ids, items, strict=True)]

    def bump_many(self, owners: list[int]) -> dict[int, Snapshot]:
        """bump() of every owner: the versions and outbox rows in two statements, the users'
        answers in one, each channel's in one."""
        rows = ", ".join(["(?, 1)"] * len(owners))
        versions = dict(
            self._run(
                f"INSERT INTO users (user_id, version) VALUES {rows} ON CONFLICT (user_id) "
                "DO UPDATE SET version = users.version + 1 RETURNING user_id, version",
                tuple(owners),
            ).fetchall()
        )
        due = time.time() + OUTBOX_GRACE
        for table in OUTBOXES:
            mine = [o for o in owners if outbox_of(o) == table]
            if mine:
                rows = ", ".join(["(?, ?, ?, 0)"] * len(mine))
                self._run(
                    _RECORD_OUTBOX.format(table).replace("VALUES (?, ?, ?, 0)", f"VALUES {rows}"),
                    tuple(v for o in mine for v in (o, versions[o], due)),
                )
        users = [o for o in owners if o >= 0]
        out: dict[int, Snapshot] = {}
        if users:
            marks = ", ".join(["?"] * len(users))
            params = (self._bounds.listed + 1, *users)
            by_user: dict[int, list[tuple[Any, ...]]] = {}
            for row in self._run(_SNAPSHOTS.format(marks), params).fetchall():
                by_user.setdefault(int(row[0]), []).append(row[1:])
            for u, user_rows in by_user.items():
                out[u] = _snapshot(user_rows, self._bounds.listed)
        for o in owners:
            if o < 0:
                out[o] = read_snapshot(self._conn, self._sql, o, self._bounds)
        return out


class UserSession(Protocol):
    """What may be done while holding a user's order (Store.user)."""

    def write(self) -> Any:  # a context manager yielding a Tx; COMMIT at its end
        ...

    def snapshot(self) -> Snapshot: ...

    def settled(self, version: int) -> None:
        """The cache holds `version` (or newer): drop the user's outbox row up to it."""
        ...


class BatchSession(Protocol):
    """What may be done while holding the orders of several owners (Store.users)."""

    def write(self) -> Any:  # a context manager yielding a Tx (add_messages, bump_many)
        ...

    def settled(self, versions: dict[int, int]) -> None:
        """The cache holds each owner's version: drop their outbox rows up to it."""
        ...


class Store(Protocol):
    kind: str
    history: int  # [channels] history: the messages of a channel's answer
    bounds: Bounds  # that and [app] answer_messages: the messages of a user's answer

    def users(self, owners: list[int]) -> Any:
        """A context manager yielding a BatchSession holding every owner's order, taken in
        ascending order (a batch)."""
        ...

    def channel_id(self, name: str) -> int:
        """The channel's id, the channel created if new."""
        ...

    def channel_name(self, channel_id: int) -> str | None: ...

    def user(self, user_id: int) -> Any:  # a context manager yielding a UserSession
        ...

    def poll_answer(self, user_id: int) -> bytes: ...

    def history_after(self, owner: int, after: int, limit: int) -> tuple[list[Listed], bool]: ...

    def get_message(self, message_id: int) -> Message | None: ...

    def claim_outbox(self, limit: int) -> list[int]:
        """Users whose outbox row is due, leased to this caller (with back-off)."""
        ...

    def outbox_backlog(self) -> int: ...

    def ping(self) -> None:
        """Unavailable unless the database answers now (GET /healthz)."""
        ...

    def schema_version(self) -> int: ...

    def migrate(self) -> int: ...

    def close(self) -> None: ...


# ---------------------------------------------------------------------------------------------
# SQLite


_SQLITE_MIGRATIONS: dict[int, str] = {
    # 1: the schema of the app before versioning (CREATE ... IF NOT EXISTS: old files upgrade).
    1: """
CREATE TABLE IF NOT EXISTS messages (
    id      INTEGER PRIMARY KEY,
    user_id INTEGER NOT NULL,
    text    TEXT    NOT NULL,
    created REAL    NOT NULL,
    read    INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS messages_unread ON messages (user_id, read, id);
""",
    2: """
ALTER TABLE messages ADD COLUMN idem_key TEXT;
CREATE UNIQUE INDEX messages_idem ON messages (user_id, idem_key);
CREATE TABLE users (
    user_id INTEGER PRIMARY KEY,
    version INTEGER NOT NULL
);
CREATE TABLE outbox (
    user_id  INTEGER PRIMARY KEY,
    version  INTEGER NOT NULL,
    due      REAL    NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX outbox_due ON outbox (attempts, due);
""",
    3: """
CREATE TABLE channels (
    id   INTEGER PRIMARY KEY,
    name TEXT NOT NULL UNIQUE
);
""",
    4: """
CREATE TABLE channel_outbox (
    user_id  INTEGER PRIMARY KEY,
    version  INTEGER NOT NULL,
    due      REAL    NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX channel_outbox_due ON channel_outbox (attempts, due);
INSERT INTO channel_outbox SELECT user_id, version, due, attempts FROM outbox WHERE user_id < 0;
DELETE FROM outbox WHERE user_id < 0;
""",
    # 5: the app's own settings (on PostgreSQL, how the orders are held: ORDERS_COMPAT).
    5: """
CREATE TABLE app_state (
    name  TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
INSERT INTO app_state (name, value) VALUES ('orders', 'user+slot');
""",
    # 6: a message's structured payload, its compact JSON encoding (NULL: none).
    6: """
ALTER TABLE messages ADD COLUMN data TEXT;
""",
}


def _sqlite_error(exc: sqlite3.Error) -> StoreError:
    # "database is locked": the write lock stayed taken for BUSY_TIMEOUT_MS (an overloaded or
    # stuck writer); try again later, nothing was written.
    if isinstance(exc, sqlite3.OperationalError) and "locked" in str(exc):
        return Unavailable(str(exc))
    return StoreError(str(exc))


class _SqliteSession:
    def __init__(self, store: SqliteStore, user_id: int) -> None:
        self._store = store
        self._uid = user_id

    @contextmanager
    def write(self) -> Iterator[Tx]:
        with self._store.transaction() as conn:
            yield Tx(conn, self._uid, _same_sql, self._store.bounds)

    def snapshot(self) -> Snapshot:
        return self._store.snapshot(self._uid)

    def settled(self, version: int) -> None:
        self._store.defer_settle(self._uid, version)


class _SqliteBatch(_SqliteSession):
    def settled(self, versions: dict[int, int]) -> None:  # type: ignore[override]
        for owner, version in versions.items():
            self._store.defer_settle(owner, version)


class SqliteStore:
    """One file on one host. WAL lets polls read while a writer writes; writers serialise on
    BEGIN IMMEDIATE (the database-wide write lock, held only for the transaction itself)."""

    kind = "sqlite"

    def __init__(
        self, path: str, migrate: bool = True, history: int = 20, answer_messages: int = 10
    ) -> None:
        self.path = path
        self.history = history
        self.bounds = Bounds(history, answer_messages)
        self._local = threading.local()
        self._lock = threading.Lock()
        self._all: list[sqlite3.Connection] = []
        self._gate = UserGate(USER_WAIT_S, USER_MAX_WAITING, UserBusy)
        self._user_locks = UserLocks(path + ".locks")
        # Outbox rows whose version the cache holds, {user: version}, deleted in a batch by the
        # next claim or count (the repair loop's, every second) rather than by a write-lock
        # round of their own per publish: SQLite's write lock is database-wide, and that second
        # round doubled the writers' queue. A row whose deletion is lost (the process died) is
        # verified once more by a repair: one more conditional write of the same answer.
        self._settled: dict[int, int] = {}
        self._settled_lock = threading.Lock()
        try:
            self.conn().execute("PRAGMA journal_mode = WAL")
            if migrate:  # `make up` and single-host deploys need no separate step
                self.migrate()
        except sqlite3.Error as exc:
            self.close()
            raise StoreError(str(exc)) from exc

    def conn(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            # isolation_level=None: we issue BEGIN/COMMIT ourselves. check_same_thread=False
            # only so close() may run on another thread; each connection stays on its thread.
            conn = sqlite3.connect(
                self.path,
                isolation_level=None,
                check_same_thread=False,
                timeout=BUSY_TIMEOUT_MS / 1000,
            )
            conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            # 201 means durable: every commit is fsynced (WAL's NORMAL may lose the last ones
            # on power loss).
            conn.execute("PRAGMA synchronous = FULL")
            self._local.conn = conn
            with self._lock:
                self._all.append(conn)
        return conn

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """BEGIN IMMEDIATE ... COMMIT; ROLLBACK if the block raises. The writers of every worker
        process take turns first (locks.UserLocks.write_turn), so BEGIN IMMEDIATE rarely waits
        in SQLite's busy handler, which sleeps and polls (up to 100 ms a turn): with 20
        concurrent writers some lost turn after turn for most of a second."""
        with self._user_locks.write_turn(BUSY_TIMEOUT_MS / 1000) as had:
            if not had:
                raise Unavailable(f"no write turn within {BUSY_TIMEOUT_MS} ms")
            with self._transaction() as conn:
                yield conn

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        conn = self.conn()
        try:
            with Timer(DB_SECONDS, "begin"):
                conn.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:
            raise _sqlite_error(exc) from exc
        try:
            yield conn
        except sqlite3.Error as exc:
            conn.execute("ROLLBACK")
            raise _sqlite_error(exc) from exc
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        try:
            with Timer(DB_SECONDS, "commit"):
                conn.execute("COMMIT")
        except sqlite3.Error as exc:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise _sqlite_error(exc) from exc

    @contextmanager
    def user(self, user_id: int) -> Iterator[_SqliteSession]:
        with self._gate.hold(user_id), self._user_locks.hold(user_id):
            yield _SqliteSession(self, user_id)

    @contextmanager
    def users(self, owners: list[int]) -> Iterator[_SqliteBatch]:
        """Every owner's order: the gates, then the lock stripes, each once, ascending (a
        single user's holder takes one stripe, so no cycle)."""
        with ExitStack() as stack:
            for owner in sorted(set(owners)):
                stack.enter_context(self._gate.hold(owner))
            for stripe in sorted({o % self._user_locks.stripes for o in owners}):
                stack.enter_context(self._user_locks.hold(stripe))
            yield _SqliteBatch(self, owners[0])

    def channel_id(self, name: str) -> int:
        try:
            row = self.conn().execute(_FIND_CHANNEL, (name,)).fetchone()
            if row is None:  # the write lock only for a new channel
                with self.transaction() as c:
                    c.execute(_ADD_CHANNEL, (name,))
                row = self.conn().execute(_FIND_CHANNEL, (name,)).fetchone()
        except sqlite3.Error as exc:
            raise _sqlite_error(exc) from exc
        return int(row[0])

    def channel_name(self, channel_id: int) -> str | None:
        row = self.conn().execute(_CHANNEL_NAME, (channel_id,)).fetchone()
        return None if row is None else str(row[0])

    def snapshot(self, user_id: int) -> Snapshot:
        try:
            with Timer(DB_SECONDS, "read"):
                return read_snapshot(self.conn(), _same_sql, user_id, self.bounds)
        except sqlite3.Error as exc:
            raise StoreError(str(exc)) from exc

    def poll_answer(self, user_id: int) -> bytes:
        return self.snapshot(user_id).answer

    def history_after(self, owner: int, after: int, limit: int) -> tuple[list[Listed], bool]:
        try:
            with Timer(DB_SECONDS, "read"):
                return read_history(self.conn(), _same_sql, owner, after, limit)
        except sqlite3.Error as exc:
            raise StoreError(str(exc)) from exc

    def get_message(self, message_id: int) -> Message | None:
        row = self.conn().execute(_GET_MESSAGE, (message_id,)).fetchone()
        return _message(row) if row else None

    def defer_settle(self, user_id: int, version: int) -> None:
        with self._settled_lock:
            if version > self._settled.get(user_id, -1):
                self._settled[user_id] = version

    @contextmanager
    def _settling(self) -> Iterator[list[tuple[int, int]]]:
        """The deferred deletions, taken; given back if the block fails (nothing deleted)."""
        with self._settled_lock:
            taken, self._settled = list(self._settled.items()), {}
        try:
            yield taken
        except BaseException:
            for uid, version in taken:
                self.defer_settle(uid, version)
            raise

    def claim_outbox(self, limit: int) -> list[int]:
        now = time.time()
        conn = self.conn()
        # A read first: the write lock is taken only when something is due or to be deleted.
        try:
            due = any(
                conn.execute(f"SELECT 1 FROM {t} WHERE due <= ? LIMIT 1", (now,)).fetchone()
                for t in OUTBOXES
            )
        except sqlite3.Error as exc:
            raise StoreError(str(exc)) from exc
        with self._settled_lock:
            settling = bool(self._settled)
        if not due and not settling:
            return []
        claimed: list[int] = []
        with self._settling() as taken, self.transaction() as c:
            settle_outbox(c.executemany, _same_sql, taken)  # first: a settled row is not claimed
            for table in OUTBOXES:
                rows = c.execute(
                    f"SELECT user_id, attempts FROM {table} WHERE due <= ? "
                    "ORDER BY attempts, due LIMIT ?",
                    (now, limit),
                ).fetchall()
                for uid, attempts in rows:
                    c.execute(
                        f"UPDATE {table} SET due = ?, attempts = attempts + 1 WHERE user_id = ?",
                        (now + min(OUTBOX_BACKOFF_BASE * 2.0**attempts, OUTBOX_BACKOFF_MAX), uid),
                    )
                claimed += [int(r[0]) for r in rows]
        return claimed

    def outbox_backlog(self) -> int:
        """The rows still pending: the deferred deletions are made first."""
        self._flush_settled()
        try:
            conn = self.conn()
            return sum(
                int(conn.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0]) for t in OUTBOXES
            )
        except sqlite3.Error as exc:
            raise StoreError(str(exc)) from exc

    def _flush_settled(self) -> None:
        with self._settled_lock:
            if not self._settled:
                return
        with self._settling() as taken, self.transaction() as c:
            settle_outbox(c.executemany, _same_sql, taken)

    def ping(self) -> None:
        try:
            self.conn().execute("SELECT version FROM schema_version LIMIT 1").fetchone()
        except sqlite3.Error as exc:
            raise Unavailable(str(exc)) from exc

    def schema_version(self) -> int:
        conn = self.conn()
        if not conn.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'schema_version'"
        ).fetchone():
            return 0
        row = conn.execute("SELECT MAX(version) FROM schema_version").fetchone()
        return int(row[0] or 0)

    def migrate(self) -> int:
        """Bring the schema to SCHEMA_VERSION; return the version it was at."""
        with self.transaction() as c:
            c.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
            row = c.execute("SELECT MAX(version) FROM schema_version").fetchone()
            was = int(row[0] or 0)
            for v in range(was + 1, SCHEMA_VERSION + 1):
                for stmt in _SQLITE_MIGRATIONS[v].split(";"):
                    if stmt.strip():
                        c.execute(stmt)
                c.execute("INSERT INTO schema_version (version) VALUES (?)", (v,))
        return was

    def close(self) -> None:
        with suppress(StoreError):  # at worst a repair verifies those rows once more
            self._flush_settled()
        with self._lock:
            conns, self._all = self._all, []
        for c in conns:
            c.close()
        self._local = threading.local()
        self._user_locks.close()


# ---------------------------------------------------------------------------------------------
# PostgreSQL

_PG_MIGRATIONS: dict[int, str] = {
    1: """
CREATE TABLE messages (
    id       BIGSERIAL PRIMARY KEY,
    user_id  BIGINT  NOT NULL,
    text     TEXT    NOT NULL,
    created  DOUBLE PRECISION NOT NULL,
    read     BOOLEAN NOT NULL DEFAULT false
);
CREATE INDEX messages_unread ON messages (user_id, id) WHERE NOT read;
""",
    2: """
ALTER TABLE messages ADD COLUMN idem_key TEXT;
CREATE UNIQUE INDEX messages_idem ON messages (user_id, idem_key);
CREATE TABLE users (
    user_id BIGINT PRIMARY KEY,
    version BIGINT NOT NULL
);
CREATE TABLE outbox (
    user_id  BIGINT PRIMARY KEY,
    version  BIGINT NOT NULL,
    due      DOUBLE PRECISION NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX outbox_due ON outbox (attempts, due);
""",
    3: """
CREATE TABLE channels (
    id   BIGSERIAL PRIMARY KEY,
    name TEXT NOT NULL UNIQUE
);
""",
    4: """
CREATE TABLE channel_outbox (
    user_id  BIGINT PRIMARY KEY,
    version  BIGINT NOT NULL,
    due      DOUBLE PRECISION NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX channel_outbox_due ON channel_outbox (attempts, due);
INSERT INTO channel_outbox SELECT user_id, version, due, attempts FROM outbox WHERE user_id < 0;
DELETE FROM outbox WHERE user_id < 0;
""",
    # 5: the app's own settings (on PostgreSQL, how the orders are held: ORDERS_COMPAT).
    5: """
CREATE TABLE app_state (
    name  TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
INSERT INTO app_state (name, value) VALUES ('orders', 'user+slot');
""",
    # 6: a message's structured payload, its compact JSON encoding (NULL: none).
    6: """
ALTER TABLE messages ADD COLUMN data TEXT;
""",
}
# Serialises concurrent `migrate` runs (two-int advisory keys never meet the users' bigint ones).
_PG_MIGRATE_LOCK = (0x66707031, 1)


def _pg_errors() -> tuple[type[Exception], ...]:
    import psycopg
    import psycopg_pool

    return (psycopg.Error, psycopg_pool.PoolTimeout)


def _pg_error(exc: Exception, conn: Any = None) -> StoreError:
    """What a psycopg or pool error means to the caller (500, 503, or retry on a new
    connection). `conn`, if given, is still checked out (it may be closed here)."""
    import psycopg
    import psycopg_pool
    from psycopg import errors

    msg = str(exc).strip() or type(exc).__name__
    if isinstance(exc, errors.ReadOnlySqlTransaction):
        if conn is not None:
            conn.close()  # this session stays read-only: the pool replaces it
        return WritesRefused(msg)
    if isinstance(exc, errors.LockNotAvailable):  # lock_timeout: the user's order stayed taken
        return UserBusy(
            f"the user's order was not free within {USER_WAIT_S:g} s (another database "
            "session held it)"
        )
    if isinstance(exc, psycopg_pool.PoolTimeout):
        return Unavailable(f"no database connection within {PG_POOL_TIMEOUT_S:g} s ({msg})")
    if isinstance(exc, errors.QueryCanceled):  # statement_timeout
        return Unavailable(msg)
    broken = conn is not None and (conn.broken or conn.closed)
    # 57P01-57P03: the server is shutting down, restarting or terminated this backend.
    if broken or isinstance(exc, errors.OperatorIntervention):
        return ConnectionLost(msg)
    if isinstance(exc, psycopg.OperationalError):
        return Unavailable(msg)
    return StoreError(msg)


def order_slot(owner: int) -> int:
    """The advisory lock slot that holds the owner's order on PostgreSQL."""
    return owner % PG_ORDER_SLOTS


@contextmanager
def _orders_held(conn: Any, owners: list[int], compat: bool) -> Iterator[None]:
    """The owners' orders (`owners` ascending): their slots' session advisory locks, ascending,
    then (compat: ORDERS_COMPAT) the owner ids' own, ascending; one total order, so two holders
    wait for each other instead of deadlocking. Held across the body's transactions. Released
    on every way out, the lock statements' own failures included: a lock_timeout on one slot
    leaves the slots before it taken. If the release fails, the connection is closed: its
    session ends, its locks with it, and the pool drops it."""
    import psycopg

    try:
        conn.execute(
            "SELECT count(pg_advisory_lock(%s, s)) FROM unnest(%s::int[]) AS s",
            (PG_ORDER_CLASS, sorted({order_slot(o) for o in owners})),
        )
        if compat:
            conn.execute(
                "SELECT count(pg_advisory_lock(o)) FROM unnest(%s::bigint[]) AS o", (owners,)
            )
        yield
    finally:
        try:
            conn.execute("SELECT pg_advisory_unlock_all()")
        except psycopg.Error:
            conn.close()


def _refuse_standby(conn: Any) -> None:
    """The pool's check of a new connection: a standby (a VIP pointing at the wrong server) is
    not kept, its answers may be older than the primary's. A primary that is read-only for
    maintenance is kept for reads; its writes get WritesRefused."""
    import psycopg

    if conn.execute("SELECT pg_is_in_recovery()").fetchone()[0]:
        conn.close()
        raise psycopg.OperationalError("connected to a standby (in recovery): not kept")


class _PgSession:
    def __init__(self, conn: Any, user_id: int, bounds: Bounds) -> None:
        self._conn = conn
        self._uid = user_id
        self._bounds = bounds

    @contextmanager
    def write(self) -> Iterator[Tx]:
        import psycopg

        try:
            with Timer(DB_SECONDS, "begin"):
                self._conn.execute("BEGIN")
            try:
                yield Tx(self._conn, self._uid, _pg_sql, self._bounds)
            except BaseException:
                with suppress(psycopg.Error):  # a broken connection: the server rolled back
                    self._conn.execute("ROLLBACK")
                raise
            with Timer(DB_SECONDS, "commit"):
                self._conn.execute("COMMIT")
        except _pg_errors() as exc:
            raise _pg_error(exc, self._conn) from exc

    def snapshot(self) -> Snapshot:
        try:
            with Timer(DB_SECONDS, "read"):
                return read_snapshot(self._conn, _pg_sql, self._uid, self._bounds)
        except _pg_errors() as exc:
            raise _pg_error(exc, self._conn) from exc

    def settled(self, version: int) -> None:
        try:
            with self._conn.transaction():
                # Need not be durable: a lost deletion costs one more verification.
                self._conn.execute("SET LOCAL synchronous_commit TO off")
                with self._conn.cursor() as cur:
                    settle_outbox(cur.executemany, _pg_sql, [(self._uid, version)])
        except _pg_errors() as exc:
            raise _pg_error(exc, self._conn) from exc


class _PgBatch(_PgSession):
    def settled(self, versions: dict[int, int]) -> None:  # type: ignore[override]
        try:
            with self._conn.transaction():
                self._conn.execute("SET LOCAL synchronous_commit TO off")
                with self._conn.cursor() as cur:
                    settle_outbox(cur.executemany, _pg_sql, list(versions.items()))
        except _pg_errors() as exc:
            raise _pg_error(exc, self._conn) from exc


class PgStore:
    """PostgreSQL through a psycopg 3 connection pool (per worker process). Autocommit
    connections: transactions are explicit (conn.transaction()), the per-user order is a
    session advisory lock (the user's slot) held on the connection for the whole operation."""

    kind = "postgresql"

    def __init__(self, settings: AppSettings, check_schema: bool = True, history: int = 20) -> None:
        import psycopg
        import psycopg_pool

        self.url = settings.database
        self.history = history
        self.bounds = Bounds(history, settings.answer_messages)
        kwargs: dict[str, Any] = {
            "autocommit": True,
            "connect_timeout": 5,
            **PG_KEEPALIVES,
            # lock_timeout bounds the wait for a user's advisory lock (UserBusy: 503).
            "options": f"-c lock_timeout={int(USER_WAIT_S * 1000)} "
            f"-c statement_timeout={PG_STATEMENT_TIMEOUT_MS}",
        }
        password = read_database_password(settings)
        if password is not None:
            kwargs["password"] = password
        self._gate = UserGate(USER_WAIT_S, USER_MAX_WAITING, UserBusy)
        self._orders = ORDERS_COMPAT  # read before the first order is taken (_compat)
        self._orders_read = -ORDERS_REFRESH_S
        self._pool = psycopg_pool.ConnectionPool(
            self.url,
            min_size=1,
            max_size=PG_POOL_MAX,
            kwargs=kwargs,
            # Each connection is checked (an empty query) as it is handed out: one that died
            # with its server (a restart, pg_terminate_backend) is replaced, not used.
            check=psycopg_pool.ConnectionPool.check_connection,
            configure=_refuse_standby,
            timeout=PG_POOL_TIMEOUT_S,  # waiting for a connection; then 503 (Unavailable)
            open=False,
            name="fastpoll",
        )
        try:
            # One plain connection first: its error says why (refused, password, no database);
            # the pool's own only says it timed out.
            psycopg.connect(self.url, **kwargs).close()
            self._pool.open(wait=True, timeout=10)
        except _pg_errors() as exc:
            self._pool.close()
            raise StoreError(f"cannot connect: {str(exc).strip()}") from exc
        if check_schema:
            have = self.schema_version()
            if have < SCHEMA_VERSION:
                self._pool.close()
                raise NotMigrated(
                    f"the database's schema is version {have}, this app needs {SCHEMA_VERSION}: "
                    "run `python -m fastpoll_app migrate --config FILE` first"
                )

    @contextmanager
    def _conn(self, timeout: float | None = None) -> Iterator[Any]:
        try:
            with self._pool.connection(timeout) as conn:
                try:
                    yield conn
                except _pg_errors() as exc:  # mapped while still checked out (_pg_error)
                    raise _pg_error(exc, conn) from exc
        except _pg_errors() as exc:  # the pool's own: no connection
            raise _pg_error(exc) from exc

    @contextmanager
    def user(self, user_id: int) -> Iterator[_PgSession]:
        # The gate first: the user's other requests wait there, not on a pooled connection.
        with (
            self._gate.hold(user_id),
            self._conn() as conn,
            _orders_held(conn, [user_id], self._compat(conn)),  # waits up to lock_timeout
        ):
            yield _PgSession(conn, user_id, self.bounds)

    def _compat(self, conn: Any) -> bool:
        """Whether the orders are held as ORDERS_COMPAT (read again every ORDERS_REFRESH_S)."""
        now = time.monotonic()
        if now - self._orders_read >= ORDERS_REFRESH_S:
            row = conn.execute("SELECT value FROM app_state WHERE name = 'orders'").fetchone()
            self._orders = row[0] if row else ORDERS_COMPAT
            self._orders_read = now
        return self._orders == ORDERS_COMPAT

    def hold_orders(self, scheme: str) -> bool:
        """Hold the orders as `scheme` from now on: ORDERS_SLOT once the previous release is
        gone from every app host (migrate --contract), ORDERS_COMPAT before a release from
        before the slots comes back (migrate --expand, a rollback). True if that changed."""
        with self._conn() as conn:
            cur = conn.execute(
                "UPDATE app_state SET value = %s WHERE name = 'orders' AND value <> %s",
                (scheme, scheme),
            )
            return bool(cur.rowcount)

    def poll_answer(self, user_id: int) -> bytes:
        with self._conn() as conn, Timer(DB_SECONDS, "read"):
            return read_snapshot(conn, _pg_sql, user_id, self.bounds).answer

    def history_after(self, owner: int, after: int, limit: int) -> tuple[list[Listed], bool]:
        with self._conn() as conn, Timer(DB_SECONDS, "read"):
            return read_history(conn, _pg_sql, owner, after, limit)

    @contextmanager
    def users(self, owners: list[int]) -> Iterator[_PgBatch]:
        """Every owner's order: the gates, ascending, then the owners' slots in one statement,
        ascending (a single user's holder takes one slot, so no cycle)."""
        order = sorted(set(owners))
        with ExitStack() as stack:
            for owner in order:
                stack.enter_context(self._gate.hold(owner))
            conn = stack.enter_context(self._conn())
            stack.enter_context(_orders_held(conn, order, self._compat(conn)))
            yield _PgBatch(conn, owners[0], self.bounds)

    def channel_id(self, name: str) -> int:
        with self._conn() as conn:
            row = conn.execute(_pg_sql(_FIND_CHANNEL), (name,)).fetchone()
            if row is None:
                conn.execute(_pg_sql(_ADD_CHANNEL), (name,))
                row = conn.execute(_pg_sql(_FIND_CHANNEL), (name,)).fetchone()
        return int(row[0])

    def channel_name(self, channel_id: int) -> str | None:
        with self._conn() as conn:
            row = conn.execute(_pg_sql(_CHANNEL_NAME), (channel_id,)).fetchone()
        return None if row is None else str(row[0])

    def get_message(self, message_id: int) -> Message | None:
        with self._conn() as conn:
            row = conn.execute(_pg_sql(_GET_MESSAGE), (message_id,)).fetchone()
        return _message(row) if row else None

    def claim_outbox(self, limit: int) -> list[int]:
        now = time.time()
        # SKIP LOCKED: the repair workers of every app host share the outbox without waiting
        # on each other; the new `due` is the lease (and the back-off if the repair fails).
        claimed: list[int] = []
        with self._conn() as conn, conn.transaction():
            for table in OUTBOXES:
                rows = conn.execute(
                    f"UPDATE {table} o"
                    "  SET due = %(now)s + LEAST(%(base)s * power(2, o.attempts), %(cap)s),"
                    "  attempts = o.attempts + 1 FROM ("
                    f"  SELECT user_id FROM {table} WHERE due <= %(now)s"
                    "  ORDER BY attempts, due LIMIT %(limit)s FOR UPDATE SKIP LOCKED"
                    ") d WHERE o.user_id = d.user_id RETURNING o.user_id",
                    {
                        "now": now,
                        "base": OUTBOX_BACKOFF_BASE,
                        "cap": OUTBOX_BACKOFF_MAX,
                        "limit": limit,
                    },
                ).fetchall()
                claimed += [int(r[0]) for r in rows]
        return claimed

    def outbox_backlog(self) -> int:
        with self._conn() as conn:
            return sum(
                int(conn.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0]) for t in OUTBOXES
            )

    def ping(self) -> None:
        with self._conn(timeout=2.0) as conn:
            # One round trip, as SELECT 1 was: a database that answers but refuses writes (a
            # standby, maintenance) is not healthy either.
            if conn.execute("SHOW transaction_read_only").fetchone()[0] == "on":
                conn.close()  # its session stays read-only: the pool opens another
                raise WritesRefused("the database refuses writes (transaction_read_only on)")

    def schema_version(self) -> int:
        with self._conn() as conn:
            if conn.execute("SELECT to_regclass('schema_version')").fetchone()[0] is None:
                return 0
            return int(conn.execute("SELECT MAX(version) FROM schema_version").fetchone()[0] or 0)

    def migrate(self) -> int:
        with self._conn() as conn, conn.transaction():
            # A migration may wait for other sessions and rewrite large tables: no limits.
            conn.execute("SET LOCAL lock_timeout = 0")
            conn.execute("SET LOCAL statement_timeout = 0")
            conn.execute("SELECT pg_advisory_xact_lock(%s, %s)", _PG_MIGRATE_LOCK)
            conn.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
            was = int(conn.execute("SELECT MAX(version) FROM schema_version").fetchone()[0] or 0)
            for v in range(was + 1, SCHEMA_VERSION + 1):
                conn.execute(_PG_MIGRATIONS[v])
                conn.execute("INSERT INTO schema_version (version) VALUES (%s)", (v,))
            if was == 0:  # a new database: no earlier release has ever written it
                conn.execute(
                    "UPDATE app_state SET value = %s WHERE name = 'orders'", (ORDERS_SLOT,)
                )
        return was

    def close(self) -> None:
        self._pool.close()


def open_store(
    settings: AppSettings, check_schema: bool = True, history: int = 20
) -> SqliteStore | PgStore:
    """The store [app] database names. SQLite migrates itself; PostgreSQL must be migrated
    (NotMigrated otherwise, unless check_schema is False: the migrate command). `history`:
    [channels] history."""
    if settings.is_postgresql:
        return PgStore(settings, check_schema, history)
    return SqliteStore(settings.database, check_schema, history, settings.answer_messages)
