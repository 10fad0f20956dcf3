"""Messages do not collapse, through a real stack (nginx, a poll server, memcached, the app):
the answer lists the newest unread messages in order (docs/api.md, "The poll answer"), and the
history read (the signed poll URL plus after=ID, "The history read") gives the ones an answer
left out. nginx sends the history read to the app: the poll server never receives one."""

from __future__ import annotations

import re
from collections.abc import Iterator

import httpx
import pytest

from fastpoll_testkit.helpers import new_uid, start_stack
from fastpoll_testkit.stack import Stack


@pytest.fixture(scope="module")
def stacks(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[int, Stack]]:
    """Two stacks: the default [app] answer_messages (10) and 2. The poll server logs at debug
    (it names the target of every request it refuses, and would name a history read's)."""
    out: dict[int, Stack] = {}
    try:
        for listed in (10, 2):
            extra = {"log": {"level": "debug"}}
            if listed != 10:
                extra["app"] = {"answer_messages": str(listed)}
            out[listed] = start_stack(
                tmp_path_factory.mktemp(f"history-{listed}"),
                "memcached",
                n_pollers=1,
                app_workers=1,
                extra_ini=extra,
            )
        yield out
    finally:
        for s in out.values():
            s.stop()


def publish(stack: Stack, uid: int, texts: list[str]) -> list[int]:
    with stack.api() as api:
        ids = []
        for t in texts:
            r = api.post("/api/messages", json={"user_id": uid, "text": t})
            assert r.status_code == 201, r.text
            ids.append(r.json()["id"])
    return ids


def poller_requests(stack: Stack) -> int:
    """The poll server's fastpoll_requests_total, over every method and outcome."""
    text = httpx.get(f"http://127.0.0.1:{stack.admin_ports[0]}/metrics", timeout=5).text
    return sum(
        int(float(m.group(1)))
        for m in re.finditer(r"^fastpoll_requests_total\{[^}]*\} (\S+)$", text, re.M)
    )


def test_three_publishes_show_in_one_poll_in_order(stacks: dict[int, Stack]) -> None:
    stack, uid = stacks[10], new_uid()
    url = stack.poll_url(uid)
    with httpx.Client(base_url=stack.base_url, timeout=10) as c:
        assert c.get(url).content == b""  # filled, empty
        ids = publish(stack, uid, ["one", "two ☃", "three"])
        r = c.get(url)
        assert r.headers["x-poll-source"] == "cache"  # the publishes rewrote the key
        listed = [{"id": i, "text": t} for i, t in zip(ids, ["one", "two ☃", "three"], strict=True)]
        assert r.json() == {"unread": 3, "newest": listed[-1], "messages": listed}


def test_with_two_listed_before_names_the_gap_and_the_history_read_fills_it(
    stacks: dict[int, Stack],
) -> None:
    stack, uid = stacks[2], new_uid()
    url = stack.poll_url(uid)
    with httpx.Client(base_url=stack.base_url, timeout=10) as c:
        assert c.get(url).content == b""
        seen = publish(stack, uid, ["seen"])[0]  # the client showed this one
        assert c.get(url).json()["newest"]["id"] == seen
        ids = publish(stack, uid, ["a", "b", "c"])
        answer = c.get(url).json()
        assert answer["unread"] == 4
        assert [m["id"] for m in answer["messages"]] == ids[1:]
        assert answer["before"] == ids[0] > seen  # a gap after what the client showed
        before = poller_requests(stack)
        r = c.get(f"{url}&after={seen}")
        assert r.status_code == 200 and r.headers["cache-control"] == "no-store"
        assert r.json() == {
            "messages": [{"id": i, "text": t} for i, t in zip(ids, "abc", strict=True)],
            "more": False,
        }
        r = c.get(f"{url}&after={seen}&limit=1")
        assert r.json() == {"messages": [{"id": ids[0], "text": "a"}], "more": True}
        # Bad parameters: a well-formed 400 from the app.
        for bad in ("after=x", "after=", "after=1&limit=101", "after=1&after=2"):
            r = c.get(f"{url}&{bad}")
            assert r.status_code == 400 and isinstance(r.json()["error"], str), (bad, r.text)
        # A forged or another user's signature: 403, as any poll.
        forged = re.sub(r"sig=[^&]+", "sig=" + "A" * 43, url)
        r = c.get(f"{forged}&after={seen}")
        assert r.status_code == 403 and "signature" in r.json()["error"]
        other = stack.poll_url(uid + 1).replace(f"user_id={uid + 1}", f"user_id={uid}")
        assert c.get(f"{other}&after=0").status_code == 403
        # None of them reached the poll server: its request count did not move, and its log
        # (debug: it names a refused request's target) has no history read.
        assert poller_requests(stack) == before
        assert c.get(url).status_code == 200 and poller_requests(stack) == before + 1
    lines = [line for _, line in stack.poller_log_lines() if b"after=" in line.lower()]
    assert lines == [], lines


def test_a_rooms_history_through_the_urls_ch(stacks: dict[int, Stack]) -> None:
    """`of` names one channel of the URL's signed ch; a channel not in it is refused."""
    stack, uid = stacks[10], new_uid()
    room = f"room.h{uid}"
    with stack.api() as api:
        ids = [
            api.post(f"/api/channels/{room}/messages", json={"text": t}).json()["id"]
            for t in ("r1", "r2")
        ]
        url = api.post("/api/poll-url", json={"user_id": uid, "channels": [room]}).json()["url"]
    with httpx.Client(base_url=stack.base_url, timeout=10) as c:
        r = c.get(f"{url}&after={ids[0]}&of={room}")
        assert r.json() == {"messages": [{"id": ids[1], "text": "r2"}], "more": False}
        assert c.get(f"{url}&after=0").json() == {"messages": [], "more": False}  # the user's
        assert c.get(f"{url}&after=0&of=room.other").status_code == 400
