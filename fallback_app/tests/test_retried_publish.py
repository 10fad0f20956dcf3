"""A publish retried after a lost connection adopts its earlier attempt's message only if that
message is the one it inserted: same owner, same text, same time. An id can come back for
another message (SQLite reuses the highest rowid after a rollback; a PostgreSQL failover can
lose the sequence's last steps), and the retry must then store its own message."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

import pytest

from fastpoll_app import store as store_mod
from fastpoll_app.cache import make_cache
from fastpoll_app.service import FastPoll
from fastpoll_app.store import ConnectionLost, PgStore, open_store
from fastpoll_testkit.procs import Server

from .conftest import make_settings


@pytest.fixture
def fp(app_db: str, memcached: Server, tmp_path: Path) -> Iterator[FastPoll]:
    settings = make_settings(tmp_path, f"[memcached]\nservers = {memcached.addr}\n", app_db)
    service = FastPoll(
        settings, open_store(settings.app), make_cache(settings), make_cache(settings)
    )
    yield service
    service.close()


def _lose_the_first_attempt(monkeypatch: pytest.MonkeyPatch, method: str) -> None:
    """The first call of Tx.<method> breaks the connection: its transaction is rolled back."""
    real = getattr(store_mod.Tx, method)
    calls = [0]

    def breaking(self: store_mod.Tx, *args: Any) -> Any:
        calls[0] += 1
        if calls[0] == 1:
            raise ConnectionLost("server closed the connection unexpectedly")
        return real(self, *args)

    monkeypatch.setattr(store_mod.Tx, method, breaking)


def _then_another_takes_the_id(
    monkeypatch: pytest.MonkeyPatch, fp: FastPoll, entry: str, lost_id: int
) -> None:
    """Before the retry enters the owner's order again, user 99 publishes and gets `lost_id`,
    the id the rolled-back attempt had."""
    real: Callable[[Any], AbstractContextManager[Any]] = getattr(fp.store, entry)
    entered = [0]

    @contextmanager
    def wrapped(arg: Any) -> Iterator[Any]:
        entered[0] += 1
        if entered[0] == 2:
            if isinstance(fp.store, PgStore):  # as after a failover that lost the sequence
                with fp.store._conn() as conn:
                    conn.execute("SELECT setval('messages_id_seq', %s, false)", (lost_id,))
            other, _ = fp.publish(99, "someone else's")
            assert other.id == lost_id
        with real(arg) as session:
            yield session

    monkeypatch.setattr(fp.store, entry, wrapped)


def test_a_retried_publish_does_not_adopt_another_users_message(
    fp: FastPoll, monkeypatch: pytest.MonkeyPatch
) -> None:
    _lose_the_first_attempt(monkeypatch, "bump")
    _then_another_takes_the_id(monkeypatch, fp, "user", lost_id=1)
    msg, written = fp.publish(7, "mine")
    assert (msg.user_id, msg.text, written) == (7, "mine", True)
    assert msg.id != 1
    assert fp.store.get_message(msg.id) == msg
    assert fp.store.get_message(1) is not None and fp.store.get_message(1).user_id == 99  # type: ignore[union-attr]
    one = b'{"id":%d,"text":"mine"}' % msg.id
    assert fp.store.poll_answer(7) == b'{"unread":1,"newest":%s,"messages":[%s]}' % (one, one)


def test_a_retried_batch_does_not_adopt_another_users_message(
    fp: FastPoll, monkeypatch: pytest.MonkeyPatch
) -> None:
    _lose_the_first_attempt(monkeypatch, "bump_many")
    _then_another_takes_the_id(monkeypatch, fp, "users", lost_id=1)
    msgs, written = fp.publish_batch([(7, "a"), (8, "b")])
    assert written and [(m.user_id, m.text) for m in msgs] == [(7, "a"), (8, "b")]
    assert 1 not in {m.id for m in msgs}
    for m in msgs:
        assert fp.store.get_message(m.id) == m
