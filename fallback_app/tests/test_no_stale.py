"""No stale answer: fills with add, writes with a conditional put, both in the user's order.

The invariant: once publish (or mark-read) has returned, the cached answer is
the state it wrote or a newer one, whatever concurrent polls are filling.
Each test runs on SQLite and on PostgreSQL, with memcached and with Redis.
"""

from __future__ import annotations

import json
import multiprocessing
import threading
import time
from pathlib import Path

import pytest

from fastpoll_app import config
from fastpoll_app.cache import CacheError, make_cache
from fastpoll_app.service import FastPoll
from fastpoll_app.store import Snapshot, StoreError, open_store

UID = 42


def make_fp(settings: config.Settings) -> FastPoll:
    return FastPoll(
        settings, open_store(settings.app), make_cache(settings), make_cache(settings, 1000)
    )


def newest(fp: FastPoll) -> int:
    return newest_id(fp.store.poll_answer(UID) or b"")


def newest_id(answer: bytes | None) -> int:
    assert answer is not None, "key missing after publish"
    if answer == b"":
        return 0
    return json.loads(answer)["newest"]["id"]


def test_fill_from_old_snapshot_loses_to_publish(settings: config.Settings) -> None:
    """The race spelled out: a poll reads, a publish starts, then the poll fills.

    The user's order serialises them: the publish's cache write waits until the fill's `add`
    is done and then overwrites it. Without it, an eviction between the publish's write and
    the fill's `add` would leave the old answer in the cache.
    """
    fp = make_fp(settings)
    key = fp.user_key(UID)
    read_done, publish_started = threading.Event(), threading.Event()
    original_user = fp.store.user

    class SlowSession:
        """The poll's session: its snapshot waits for the publish to start."""

        def __init__(self, inner: object) -> None:
            self._inner = inner

        def snapshot(self) -> Snapshot:
            snap: Snapshot = self._inner.snapshot()  # type: ignore[attr-defined]
            read_done.set()
            assert publish_started.wait(10)
            time.sleep(0.2)  # give the publish every chance to run ahead (it must not)
            fp._fill.delete(key)  # an eviction right before our add
            return snap

    from contextlib import contextmanager

    @contextmanager
    def user(uid: int):  # type: ignore[no-untyped-def]
        with original_user(uid) as session:
            if threading.current_thread() is poller:
                yield SlowSession(session)
            else:
                yield session

    fp.store.user = user  # type: ignore[method-assign]
    result: list[bytes] = []
    published: list[int] = []
    poller = threading.Thread(target=lambda: result.append(fp.poll(UID, key)))
    poller.start()
    assert read_done.wait(10)

    def publish() -> None:
        publish_started.set()
        msg, written = fp.publish(UID, "new")
        assert written
        published.append(msg.id)

    publisher = threading.Thread(target=publish)
    publisher.start()
    poller.join(10)
    publisher.join(10)
    assert result == [b""]  # that poll was sent before the publish: old state is fine
    assert newest_id(fp._fill.get(key)) == published[0]  # and the publish came after its add
    fp.close()


def _hammer_polls(fp: FastPoll, stop: threading.Event) -> None:
    key = fp.user_key(UID)
    while not stop.is_set():
        fp.poll(UID, key)


def test_publish_and_read_never_stale_under_concurrent_polls(settings: config.Settings) -> None:
    fp = make_fp(settings)
    key = fp.user_key(UID)
    stop = threading.Event()
    pollers = [threading.Thread(target=_hammer_polls, args=(fp, stop)) for _ in range(4)]
    for t in pollers:
        t.start()
    try:
        for i in range(150):
            if i % 10 == 9:
                fp.mark_read(UID, newest(fp))
                assert fp._fill.get(key) == b"", f"round {i}: stale after read"
            else:
                msg, _ = fp.publish(UID, f"m{i}")
                assert newest_id(fp._fill.get(key)) == msg.id, f"round {i}: stale after publish"
    finally:
        stop.set()
        for t in pollers:
            t.join(10)
    assert fp._fill.get(key) == fp.store.poll_answer(UID)
    fp.close()


def test_concurrent_publishers_threads(settings: config.Settings) -> None:
    fp = make_fp(settings)
    key = fp.user_key(UID)
    stop = threading.Event()
    errors: list[str] = []

    def publisher(n: int) -> None:
        for i in range(40):
            msg, _ = fp.publish(UID, f"p{n}-{i}")
            seen = newest_id(fp._fill.get(key))
            if seen < msg.id:
                errors.append(f"publisher {n} round {i}: cache newest {seen} < {msg.id}")

    threads = [threading.Thread(target=_hammer_polls, args=(fp, stop)) for _ in range(2)]
    threads += [threading.Thread(target=publisher, args=(n,)) for n in range(3)]
    for t in threads[2:]:
        t.start()
    for t in threads[:2]:
        t.start()
    for t in threads[2:]:
        t.join(60)
    stop.set()
    for t in threads[:2]:
        t.join(10)
    assert errors == []
    assert fp._fill.get(key) == fp.store.poll_answer(UID)
    fp.close()


def _process_publisher(settings: config.Settings, n: int, rounds: int) -> list[str]:
    fp = make_fp(settings)
    key = fp.user_key(UID)
    errors = []
    for i in range(rounds):
        msg, _ = fp.publish(UID, f"proc{n}-{i}")
        fp.poll(UID, key)
        seen = newest_id(fp._fill.get(key))
        if seen < msg.id:
            errors.append(f"process {n} round {i}: cache newest {seen} < {msg.id}")
    fp.close()
    return errors


def test_concurrent_publishers_processes(settings: config.Settings, tmp_path: Path) -> None:
    """The user's order holds across processes (uvicorn workers, app hosts) too."""
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(3) as pool:
        results = pool.starmap(_process_publisher, [(settings, n, 40) for n in range(3)])
    assert [e for r in results for e in r] == []
    fp = make_fp(settings)
    assert fp._fill.get(fp.user_key(UID)) == fp.store.poll_answer(UID)
    assert json.loads(fp.store.poll_answer(UID))["unread"] == 120
    fp.close()


def test_failed_commit_touches_no_cache(settings: config.Settings) -> None:
    """The cache is written only after COMMIT: a write whose transaction fails leaves the
    cached answer alone (no phantom state to take back)."""
    fp = make_fp(settings)
    key = fp.user_key(UID)
    fp.poll(UID, key)
    assert fp._fill.get(key) == b""

    def fail(tx: object) -> None:
        raise StoreError("disk I/O error")  # as if the transaction failed

    with pytest.raises(StoreError):
        fp._write(UID, fail, lambda: False)
    assert fp.store.poll_answer(UID) == b""
    assert fp._fill.get(key) == b""
    assert fp.store.outbox_backlog() == 0
    fp.close()


def test_a_replayed_publish_writes_the_answer_its_first_attempt_did_not(
    settings: config.Settings,
) -> None:
    """A publish committed, its cache write failed (201 pending, the outbox row waits for the
    repair), and the client, which did not see that answer, sends it again with the same
    Idempotency-Key: the replay's 201 must also mean that no poll shows the older answer, so
    it writes the current one itself instead of leaving it to the repair."""
    fp = make_fp(settings)
    key = fp.user_key(UID)
    first, written = fp.publish(UID, "before")
    assert written
    real_put = fp._publish.put

    def failing_put(*args: object, **kwargs: object) -> None:
        raise CacheError("the node hung")

    fp._publish.put = failing_put  # type: ignore[method-assign]
    msg, written = fp.publish(UID, "lost reply", "idem-1")
    assert written is False  # committed, pending
    fp._publish.put = real_put  # type: ignore[method-assign]
    assert newest_id(fp._fill.get(key)) == first.id  # the repair has not run
    again, written = fp.publish(UID, "lost reply", "idem-1")
    assert written is None and again.id == msg.id  # a replay: nothing stored twice
    assert newest_id(fp._fill.get(key)) == msg.id
    fp.close()
