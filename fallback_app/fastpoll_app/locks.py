"""Per-user locks that hold across threads and across the app's worker processes: the user's
order on SQLite (one host; PostgreSQL uses an advisory lock instead, see store.py).

A fill (read the database, then `add`) and a write (commit, then the cache write) of the same
user must not interleave: if the key is evicted or expires between a publish's write and a slow
fill's `add`, that fill would store the answer it read before the publish. Holding the user's
lock across "read, then add" and "commit, then write" closes that window.

Users are spread over a fixed number of stripes. Each stripe is a threading.Lock (fcntl locks do
not exclude threads of one process) plus an fcntl byte-range lock on one byte of a lock file next
to the database (which excludes the other worker processes). The byte after the stripes is the
SQLite writers' turn (UserLocks.write_turn). In front of either store's lock, UserGate bounds how
long and how many of one user's requests wait in a process (both stores use it).
"""

from __future__ import annotations

import errno
import fcntl
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

STRIPES = 1024


def _lock_stripe(fd: int, stripe: int) -> None:
    """Blocks until this process holds the stripe's byte.

    The kernel's deadlock detection for fcntl locks takes a whole process for one owner: while
    thread A holds stripe 1 and thread B waits for stripe 2, held by another worker that waits
    for stripe 1, it sees a cycle and fails B with EDEADLK, although A lets go as soon as it is
    done (no thread ever holds two stripes). So EDEADLK means "try again shortly". Found by the
    hung-memcached drill (tests/test_faults.py): fills slowed by the cache timeout overlapped.
    """
    delay = 0.001
    while True:
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX, 1, stripe)
            return
        except OSError as exc:
            if exc.errno != errno.EDEADLK:
                raise
        time.sleep(delay)
        delay = min(delay * 2, 0.05)


def _lock_byte_until(fd: int, offset: int, deadline: float) -> bool:
    """Take the byte's fcntl lock, polling (0.5 ms, doubling to 5 ms) until `deadline`."""
    delay = 0.0005
    while True:
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, offset)
            return True
        except OSError as exc:
            if exc.errno not in (errno.EACCES, errno.EAGAIN):
                raise
        if time.monotonic() >= deadline:
            return False
        time.sleep(delay)
        delay = min(delay * 2, 0.005)


class _Waiting:
    __slots__ = ("lock", "count")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.count = 0  # threads holding or waiting for `lock`


class UserGate:
    """One thread per user inside the user's order in this process; the others wait here, for
    at most `timeout` seconds and at most `max_waiting` of them (`busy` raised beyond either).

    In front of both stores' locks: the threads of one busy user (its order held by a slow
    write, a hung cache node, another host) wait without holding anything shared, neither a
    pooled database connection nor a lock stripe, so they cannot take those from other users;
    and a user can keep at most 1 + max_waiting of the process's threads."""

    def __init__(self, timeout: float, max_waiting: int, busy: Callable[[str], Exception]) -> None:
        self._timeout = timeout
        self._max_waiting = max_waiting
        self._busy = busy  # the exception to raise, given what was busy
        self._mutex = threading.Lock()
        self._users: dict[int, _Waiting] = {}

    @contextmanager
    def hold(self, user_id: int) -> Iterator[None]:
        with self._mutex:
            w = self._users.get(user_id)
            if w is None:
                w = self._users[user_id] = _Waiting()
            elif w.count > self._max_waiting:
                raise self._busy(f"{w.count} requests of this user already in progress here")
            w.count += 1
        try:
            if not w.lock.acquire(timeout=self._timeout):
                raise self._busy(
                    f"the user's order was not free within {self._timeout:g} s "
                    "(another request of this user in this process held it)"
                )
            try:
                yield
            finally:
                w.lock.release()
        finally:
            with self._mutex:
                w.count -= 1
                if w.count == 0:
                    del self._users[user_id]


class UserLocks:
    def __init__(self, path: str, stripes: int = STRIPES) -> None:
        self.path = path
        self.stripes = stripes
        self._thread_locks = [threading.Lock() for _ in range(stripes)]
        self._write_lock = threading.Lock()
        self._fd: int | None = None
        self._pid = 0
        self._open_lock = threading.Lock()

    def _file(self) -> int:
        # Opened per process: a worker forked from a parent must not share the parent's fd,
        # and closing any fd of the file would drop every fcntl lock the process holds.
        with self._open_lock:
            if self._fd is None or self._pid != os.getpid():
                self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
                self._pid = os.getpid()
            return self._fd

    @contextmanager
    def hold(self, user_id: int) -> Iterator[None]:
        stripe = user_id % self.stripes
        fd = self._file()
        with self._thread_locks[stripe]:
            _lock_stripe(fd, stripe)
            try:
                yield
            finally:
                fcntl.lockf(fd, fcntl.LOCK_UN, 1, stripe)

    @contextmanager
    def write_turn(self, timeout: float) -> Iterator[bool]:
        """One writer of the database at a time across this host's processes and threads: the
        process's threads queue on a thread lock (woken when the holder lets go), then one of
        them polls the byte after the users' stripes every 0.5-5 ms, instead of all of them
        polling in SQLite's busy handler, which sleeps up to 100 ms a turn. Yields False if
        the turn was not had within `timeout` (nothing held then): a stuck holder (a stopped
        process) is waited for no longer than SQLite's own busy timeout."""
        deadline = time.monotonic() + timeout
        if not self._write_lock.acquire(timeout=timeout):
            yield False
            return
        try:
            fd = self._file()
            if not _lock_byte_until(fd, self.stripes, deadline):
                yield False
                return
            try:
                yield True
            finally:
                fcntl.lockf(fd, fcntl.LOCK_UN, 1, self.stripes)
        finally:
            self._write_lock.release()

    def close(self) -> None:
        with self._open_lock:
            if self._fd is not None and self._pid == os.getpid():
                os.close(self._fd)
            self._fd = None
