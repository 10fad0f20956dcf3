"""No stale answer: fill with add, publish with set under the write lock.

The invariant: once publish (or mark-read) has returned, the cached answer is
the state it wrote or a newer one, whatever concurrent polls are filling.
"""

from __future__ import annotations

import json
import multiprocessing
import sqlite3
import threading
import time
from pathlib import Path

import pytest

from fastpoll_app import config
from fastpoll_app.cache import make_cache
from fastpoll_app.service import FastPoll
from fastpoll_app.store import Store

UID = 42


def make_fp(settings: config.Settings) -> FastPoll:
    return FastPoll(
        settings, Store(settings.app.database), make_cache(settings), make_cache(settings, 1000)
    )


def newest_id(answer: bytes | None) -> int:
    assert answer is not None, "key missing after publish"
    if answer == b"":
        return 0
    return json.loads(answer)["newest"]["id"]


def test_fill_from_old_snapshot_loses_to_publish(settings: config.Settings) -> None:
    """The race spelled out: a poll reads, a publish starts, then the poll fills.

    The user lock orders them: the publish waits until the fill's `add` is done and then
    overwrites it. Without the lock, an eviction between the publish's `set` and the fill's
    `add` would leave the old answer in the cache.
    """
    fp = make_fp(settings)
    key = fp.user_key(UID)
    read_done, publish_started = threading.Event(), threading.Event()
    original = fp.store.poll_answer

    def slow_read(user_id: int) -> bytes:
        answer = original(user_id)
        read_done.set()
        assert publish_started.wait(10)
        time.sleep(0.2)  # give the publish every chance to run ahead (it must not)
        fp._fill.delete(key)  # an eviction right before our add
        return answer

    fp.store.poll_answer = slow_read  # type: ignore[method-assign]
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
                fp.mark_read(UID)
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
    """BEGIN IMMEDIATE serialises publishers across uvicorn worker processes too."""
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(3) as pool:
        results = pool.starmap(_process_publisher, [(settings, n, 40) for n in range(3)])
    assert [e for r in results for e in r] == []
    fp = make_fp(settings)
    assert fp._fill.get(fp.user_key(UID)) == fp.store.poll_answer(UID)
    assert json.loads(fp.store.poll_answer(UID))["unread"] == 120
    fp.close()


def test_failed_commit_after_set_is_rewritten(settings: config.Settings) -> None:
    """The cache must not keep a state the database never committed."""
    fp = make_fp(settings)
    key = fp.user_key(UID)
    fp.poll(UID, key)
    assert fp._fill.get(key) == b""
    original = fp._rewrite

    def rewrite_then_fail(tx: object, user_id: int) -> bool:
        assert original(tx, user_id)  # type: ignore[arg-type]
        assert b"phantom" in fp._fill.get(key)  # the set happened
        raise sqlite3.OperationalError("disk I/O error")  # as if COMMIT failed

    fp._rewrite = rewrite_then_fail  # type: ignore[method-assign]
    with pytest.raises(sqlite3.OperationalError):
        fp.publish(UID, "phantom")
    assert fp.store.poll_answer(UID) == b""
    assert fp._fill.get(key) == b""
    fp.close()
