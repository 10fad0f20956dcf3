"""The one definition of `wait` (tests/vectors/wait.json) through nginx, on a real stack.

Every vector's query is sent as a signed poll of a user whose answer is cached, with
`If-None-Match: *` (the answer matches: a poll taken as a long poll is held). "refuse": nginx's
own 400, nothing proxied, nothing held. A number: a poll held for exactly that many seconds
(the held route, then 304 at the wait's end) when it is above 0, answered at once when it is 0.
The poll server's and the app's own vector tests check their halves.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from fastpoll_testkit.helpers import http_client, new_uid
from fastpoll_testkit.stack import Stack

VECTORS = json.loads((Path(__file__).parent / "vectors" / "wait.json").read_text(encoding="utf-8"))
CASES: list[dict] = VECTORS["cases"]
WAIT_REFUSED = b'{"error":"wait must be given at most once, as 1-6 decimal digits"}\n'


@pytest.fixture(scope="module")
def wait_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """The vectors' max_wait, in the poll servers and nginx alike."""
    max_wait = VECTORS["max_wait"]
    s = Stack(
        run_dir=tmp_path_factory.mktemp("wait-vectors"),
        n_pollers=2,
        extra_ini={"poll": {"max_wait": str(max_wait)}, "server": {"max_held": "1000"}},
        nginx_vars={"fastpoll_poll_max_wait": max_wait},
    )
    s.start()
    yield s
    s.stop()


def with_user(query: str, uid: int) -> str:
    """The vector's query with the user's id: its user_id=1 replaced, or user_id appended (so
    a vector's first piece stays first)."""
    if re.search(r"(?:^|&)user_id=1(?=&|$)", query):
        return re.sub(r"(^|&)user_id=1(?=&|$)", rf"\g<1>user_id={uid}", query)
    return f"{query}&user_id={uid}" if query else f"user_id={uid}"


def held_total(stack: Stack) -> float:
    total = 0.0
    for port in stack.admin_ports:
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
        total += sum(
            float(line.split()[-1])
            for line in text.splitlines()
            if line.startswith("fastpoll_held_requests ")
        )
    return total


def test_every_vector_through_nginx(wait_stack: Stack) -> None:
    s = wait_stack
    targets: list[str] = []
    with http_client(s, sign=False, timeout=VECTORS["max_wait"] + 20) as c:
        for case in CASES:
            uid = new_uid()
            plain = s.poll_url(uid)
            assert c.get(plain).status_code == 200
            assert c.get(plain).headers["x-poll-source"] == "cache"
            target = s.sign(f"/Poll/getMessages?{with_user(case['query'], uid)}")
            assert "sig=" in target, case
            targets.append(target)

        results: dict[int, tuple[int, bytes, float]] = {}

        def poll(i: int) -> None:
            t0 = time.monotonic()
            r = c.get(targets[i], headers={"If-None-Match": "*"})
            results[i] = (r.status_code, r.content, time.monotonic() - t0)

        # All at once: the longest wait bounds the test, not their sum.
        threads = [threading.Thread(target=poll, args=(i,)) for i in range(len(CASES))]
        for t in threads:
            t.start()
        # While they wait: exactly the vectors with a wait above 0 are held (the shortest is
        # held 3 s; the count is read until it is right or 2.5 s have passed).
        held = sum(1 for case in CASES if case["expect"] != "refuse" and case["expect"] > 0)
        seen, deadline = 0.0, time.monotonic() + 2.5
        while seen != held and time.monotonic() < deadline:
            seen = max(seen, held_total(s))
            time.sleep(0.05)
        for t in threads:
            t.join()

    wrong = []
    for i, case in enumerate(CASES):
        status, body, seconds = results[i]
        expect = case["expect"]
        if expect == "refuse":
            ok = (status, body) == (400, WAIT_REFUSED) and seconds < 2.0
        elif expect == 0:
            ok = status == 304 and seconds < 2.0
        else:
            ok = status == 304 and expect - 0.2 <= seconds < expect + 5.0
        if not ok:
            wrong.append(
                f"{case['query']!r} ({case['why']}): expected {expect}, got "
                f"{status} {body[:80]!r} after {seconds:.2f} s"
            )
    assert not wrong, "\n".join(wrong)
    assert seen == held, f"{seen:.0f} polls held at once, {held} expected"
