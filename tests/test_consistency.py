"""No stale answer: a poll sent after a publish returned never shows older state, even while other
polls of the same key are being filled at the same moment. Once on each shared stack (SQLite, one
app) and once on PostgreSQL with two app processes behind nginx: writes alternate between the
apps' own listeners, and nginx sends the fills to both."""

from __future__ import annotations

import threading

import pytest

from fastpoll_testkit.helpers import Cache, http_client, new_uid, poll_key
from fastpoll_testkit.stack import Stack

ROUNDS = 40
POLLERS = 6


def no_stale_answer(stack: Stack) -> None:
    uid = new_uid()
    url = f"/Poll/getMessages?user_id={uid}"
    stop = threading.Event()
    errors: list[str] = []

    def hammer() -> None:
        # Keep the key churning: drop it and poll, so fills (add) race the writes.
        own = Cache(stack)  # cache clients are not thread-safe: one per thread
        with http_client(stack) as c:
            while not stop.is_set():
                own.delete(poll_key(uid))
                r = c.get(url)
                if r.status_code != 200:
                    errors.append(f"poll answered {r.status_code}")

    threads = [threading.Thread(target=hammer) for _ in range(POLLERS)]
    for t in threads:
        t.start()
    apis = [stack.api(i) for i in range(stack.apps)]
    try:
        with http_client(stack) as c:
            unread = 0
            for n in range(1, ROUNDS + 1):
                api = apis[n % len(apis)]
                published = api.post(
                    "/api/messages", json={"user_id": uid, "text": f"m{n}"}
                )
                assert published.status_code == 201
                newest = published.json()["id"]
                unread += 1
                # Every poll from now on must show this message.
                for _ in range(3):
                    r = c.get(url)
                    assert r.status_code == 200 and r.content, (
                        f"round {n}: empty after publish"
                    )
                    answer = r.json()
                    source = r.headers["x-poll-source"]
                    assert answer["unread"] == unread, (
                        f"round {n}: stale {answer} from {source}"
                    )
                    assert answer["newest"]["id"] == newest, f"round {n}: {answer}"
                if n % 10 == 0:
                    read = apis[(n + 1) % len(apis)].post(
                        "/api/messages/read", json={"user_id": uid, "up_to_id": newest}
                    )
                    assert read.status_code == 200
                    unread = 0
                    # Every answer is now empty until the next publish.
                    for _ in range(3):
                        r = c.get(url)
                        assert (r.status_code, r.content) == (200, b""), (
                            f"round {n}: stale after read"
                        )
    finally:
        stop.set()
        for t in threads:
            t.join()
        for api in apis:
            api.close()
    assert not errors, errors[:5]


def test_no_stale_answer_under_concurrent_polls_and_publishes(stack: Stack) -> None:
    no_stale_answer(stack)


@pytest.mark.parametrize("apps", [2])
def test_no_stale_answer_across_two_apps_on_postgresql(pg_stack: Stack, apps: int) -> None:
    assert pg_stack.db == "postgresql" and pg_stack.apps == apps
    no_stale_answer(pg_stack)
