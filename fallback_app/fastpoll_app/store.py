"""Messages in SQLite: the authority every poll answer is computed from.

One connection per thread (sqlite3 connections must not be shared while in
use). WAL lets polls read while a publisher writes. Writers take the database
write lock with BEGIN IMMEDIATE, which serialises them across threads and
across uvicorn worker processes alike; see docs/api.md ("No stale answer").
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from .locks import UserLocks
from .metrics import DB_SECONDS, Timer

BUSY_TIMEOUT_MS = 10000

_SCHEMA = """
CREATE TABLE IF NOT EXISTS messages (
    id      INTEGER PRIMARY KEY,
    user_id INTEGER NOT NULL,
    text    TEXT    NOT NULL,
    created REAL    NOT NULL,
    read    INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS messages_unread ON messages (user_id, read, id);
"""

# One statement, so the count and the newest message come from one snapshot.
_ANSWER_SQL = """
SELECT (SELECT COUNT(*) FROM messages WHERE user_id = ?1 AND read = 0), id, text
FROM messages WHERE user_id = ?1 AND read = 0 ORDER BY id DESC LIMIT 1
"""


@dataclass(frozen=True)
class Message:
    id: int
    user_id: int
    text: str
    created: float
    read: bool

    def as_json(self) -> dict[str, object]:
        return {
            "id": self.id,
            "user_id": self.user_id,
            "text": self.text,
            "created": self.created,
            "read": self.read,
        }


def encode_answer(unread: int, newest_id: int, newest_text: str) -> bytes:
    """The poll answer for a user with unread messages (format: docs/api.md)."""
    doc = {"unread": unread, "newest": {"id": newest_id, "text": newest_text}}
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


class Tx:
    """Operations inside one write transaction (see Store.write)."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn

    def add_message(self, user_id: int, text: str) -> Message:
        now = time.time()
        cur = self._conn.execute(
            "INSERT INTO messages (user_id, text, created) VALUES (?, ?, ?)",
            (user_id, text, now),
        )
        assert cur.lastrowid is not None
        return Message(cur.lastrowid, user_id, text, now, False)

    def mark_read(self, user_id: int) -> int:
        cur = self._conn.execute(
            "UPDATE messages SET read = 1 WHERE user_id = ? AND read = 0", (user_id,)
        )
        return cur.rowcount

    def poll_answer(self, user_id: int) -> bytes:
        return _answer(self._conn, user_id)


def _answer(conn: sqlite3.Connection, user_id: int) -> bytes:
    with Timer(DB_SECONDS, "read"):
        row = conn.execute(_ANSWER_SQL, (user_id,)).fetchone()
    if row is None:
        return b""
    return encode_answer(row[0], row[1], row[2])


class Store:
    def __init__(self, path: str) -> None:
        self.path = path
        self._local = threading.local()
        self._lock = threading.Lock()
        self._all: list[sqlite3.Connection] = []
        self._user_locks = UserLocks(path + ".locks")
        self.user_lock = self._user_locks.hold
        conn = self._conn()
        conn.execute("PRAGMA journal_mode = WAL")
        conn.executescript(_SCHEMA)

    def _conn(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            # isolation_level=None: we issue BEGIN/COMMIT ourselves.
            # check_same_thread=False only so close() may run on another thread;
            # each connection is still used by its own thread only.
            conn = sqlite3.connect(
                self.path,
                isolation_level=None,
                check_same_thread=False,
                timeout=BUSY_TIMEOUT_MS / 1000,
            )
            conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            conn.execute("PRAGMA synchronous = NORMAL")
            self._local.conn = conn
            with self._lock:
                self._all.append(conn)
        return conn

    def poll_answer(self, user_id: int) -> bytes:
        """Current answer for user_id: JSON bytes, or b"" when nothing is unread."""
        return _answer(self._conn(), user_id)

    def get_message(self, message_id: int) -> Message | None:
        row = (
            self._conn()
            .execute(
                "SELECT id, user_id, text, created, read FROM messages WHERE id = ?", (message_id,)
            )
            .fetchone()
        )
        return Message(row[0], row[1], row[2], row[3], bool(row[4])) if row else None

    @contextmanager
    def write(self) -> Iterator[Tx]:
        """BEGIN IMMEDIATE ... COMMIT; ROLLBACK if the block raises.

        The COMMIT happens after the block: the caller publishes to the cache
        inside the block, while it still holds the write lock.
        """
        conn = self._conn()
        with Timer(DB_SECONDS, "begin"):
            conn.execute("BEGIN IMMEDIATE")
        try:
            yield Tx(conn)
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        try:
            with Timer(DB_SECONDS, "commit"):
                conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise

    # Convenience wrappers (tests, tools): each is its own transaction.
    def add_message(self, user_id: int, text: str) -> Message:
        with self.write() as tx:
            return tx.add_message(user_id, text)

    def mark_read(self, user_id: int) -> int:
        with self.write() as tx:
            return tx.mark_read(user_id)

    def close(self) -> None:
        with self._lock:
            conns, self._all = self._all, []
        for c in conns:
            c.close()
        self._local = threading.local()
        self._user_locks.close()
