"""The app tier as a shared system of record, on a real PostgreSQL started by the
harness: two app processes behind one nginx, an outbox that survives an app restart, a hung
memcached node that no longer slows the publishes of users on the other nodes, and a rolling
restart of the apps that leaves one to answer misses."""

from __future__ import annotations

import os
import signal
import statistics
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from fastpoll_testkit.helpers import Cache, http_client, new_uid, poll_key
from fastpoll_testkit.procs import freeze, wait_for
from fastpoll_testkit.stack import Stack, memcached_ask


def node_of(stack: Stack, key: str) -> int:
    """The memcached node that holds key."""
    found = [
        i
        for i, port in enumerate(stack.memcached_ports)
        if memcached_ask(port, f"get {key}".encode()).startswith(b"VALUE")
    ]
    assert len(found) == 1, (key, found)
    return found[0]


def backlog(stack: Stack) -> float:
    """fastpoll_app_repair_pending on app 0: the outbox's rows, every host's."""
    text = httpx.get(f"{stack.app_url()}/metrics", timeout=5).text
    for line in text.splitlines():
        if line.startswith("fastpoll_app_repair_pending "):
            return float(line.split()[1])
    raise AssertionError("no fastpoll_app_repair_pending on /metrics")


def test_publish_through_one_app_the_other_fills_it(pg_stack: Stack) -> None:
    uid = new_uid()
    with pg_stack.api(0) as first, pg_stack.api(1) as second:
        msg = first.post("/api/messages", json={"user_id": uid, "text": "via app 0"}).json()
        Cache(pg_stack).delete(poll_key(uid))  # evicted: the next poll is a miss
        # App 1 answers the miss from the shared database and fills the cache.
        miss = second.get(pg_stack.sign(f"/Poll/getMessages?user_id={uid}"))
        assert miss.headers["x-poll-source"] == "app"
        one = {"id": msg["id"], "text": "via app 0"}
        assert miss.json() == {"unread": 1, "newest": one, "messages": [one]}
        with http_client(pg_stack) as c:
            hit = c.get(f"/Poll/getMessages?user_id={uid}")
        assert (hit.headers["x-poll-source"], hit.content) == ("cache", miss.content)
        # Ids come from one sequence, and mark-read on app 1 sees app 0's message.
        other = second.post("/api/messages", json={"user_id": uid, "text": "via app 1"}).json()
        assert other["id"] > msg["id"]
        read = second.post("/api/messages/read", json={"user_id": uid, "up_to_id": other["id"]})
        assert read.json()["marked_read"] == 2


@pytest.fixture(scope="module")
def tier_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """A stack of this module's own (its tests stop nodes and the app): PostgreSQL, one app,
    three memcached nodes, one poll server."""
    s = Stack(
        run_dir=tmp_path_factory.mktemp("stack-tier"),
        backend="memcached",
        n_memcached=3,
        n_pollers=1,
        db="postgresql",
        # One copy per key, so "the user's node" is one node (replicas: tests/test_replicas.py).
        extra_ini={"memcached": {"replicas": "0"}},
    )
    s.start()
    yield s
    for name in list(s.procs):
        if name.startswith("memcached"):
            os.kill(s.procs[name].pid, signal.SIGCONT)
    s.stop()


def users_by_node(stack: Stack, n: int) -> dict[int, list[int]]:
    """n new users, their (empty) answers cached, grouped by the node that holds them."""
    uids = [new_uid() for _ in range(n)]
    with http_client(stack) as c:
        for u in uids:
            assert c.get(f"/Poll/getMessages?user_id={u}").status_code == 200  # app fills
    by_node: dict[int, list[int]] = {}
    for u in uids:
        by_node.setdefault(node_of(stack, poll_key(u)), []).append(u)
    return by_node


def test_outbox_survives_an_app_restart(tier_stack: Stack) -> None:
    """A publish while the user's node hangs (its old, empty answer still in it), then the
    app restarts, then the node is back: the repair worker of the new process rewrites the key
    from the outbox. No write is made after the node is back."""
    stack = tier_stack
    uid = users_by_node(stack, 1).popitem()[1][0]
    node = f"memcached-{node_of(stack, poll_key(uid))}"
    freeze(stack.procs[node].pid)
    try:
        with stack.api() as api:
            r = api.post("/api/messages", json={"user_id": uid, "text": "while hung"})
        assert r.status_code == 201 and r.headers["x-cache-publish"] == "pending"
        stack.stop_proc("app")
        stack.start_app(0)
        # The new process knows from the database alone that the key needs a write.
        wait_for(
            "the restarted app sees the outbox row",
            lambda: backlog(stack) >= 1,
            timeout=30,
            interval=0.2,
            retry_on=(),
        )
    finally:
        os.kill(stack.procs[node].pid, signal.SIGCONT)  # the cache is back, still stale

    def shows_it() -> bool:
        with http_client(stack) as c:
            r = c.get(f"/Poll/getMessages?user_id={uid}")
        return r.headers.get("x-poll-source") == "cache" and b"while hung" in r.content

    wait_for(
        "the poll shows the message from the cache",
        shows_it,
        timeout=30,
        interval=0.2,
        retry_on=(),
    )
    wait_for(
        "the outbox drained",
        lambda: backlog(stack) == 0,
        timeout=30,
        interval=0.2,
        retry_on=(),
    )


def test_hung_node_does_not_slow_publishes_to_other_nodes(tier_stack: Stack) -> None:
    """Publish latency for users on healthy nodes, with and without one node SIGSTOPped while
    other threads keep publishing to users on it (each of those waits for the 1 s publish
    timeout). Figures: docs/api.md."""
    stack = tier_stack
    by_node = users_by_node(stack, 60)
    assert len(by_node) == 3, {k: len(v) for k, v in by_node.items()}
    hung, healthy = by_node[0], by_node[1] + by_node[2]

    def timed_publishes(api: httpx.Client, users: list[int], seconds: float) -> list[float]:
        took: list[float] = []
        end = time.monotonic() + seconds
        for i in range(2000):  # bounded; ends after `seconds`
            if time.monotonic() > end:
                break
            start = time.perf_counter()
            r = api.post("/api/messages", json={"user_id": users[i % len(users)], "text": "t"})
            took.append(time.perf_counter() - start)
            assert r.status_code == 201 and r.headers["x-cache-publish"] == "ok", r.text
        return took

    with stack.api() as api:
        before = timed_publishes(api, healthy, 1.0)
    stop = threading.Event()
    stalled: list[float] = []

    def publish_to_hung() -> None:
        with stack.api(timeout=30) as api:
            i = 0
            while not stop.is_set():
                start = time.perf_counter()
                api.post("/api/messages", json={"user_id": hung[i % len(hung)], "text": "h"})
                stalled.append(time.perf_counter() - start)
                i += 1

    pid = stack.procs["memcached-0"].pid
    freeze(pid)
    threads = [threading.Thread(target=publish_to_hung) for _ in range(4)]
    try:
        for t in threads:
            t.start()
        time.sleep(0.3)  # the hung users' publishes are in flight
        with stack.api() as api:
            during = timed_publishes(api, healthy, 2.0)
    finally:
        stop.set()
        os.kill(pid, signal.SIGCONT)
        for t in threads:
            t.join(30)
    med_before, med_during = statistics.median(before), statistics.median(during)
    print(
        f"\npublish latency, users on healthy nodes: median {med_before * 1000:.1f} ms, "
        f"max {max(before) * 1000:.1f} ms; with node 0 hung: median {med_during * 1000:.1f} ms, "
        f"max {max(during) * 1000:.1f} ms; publishes to the hung node: "
        f"median {statistics.median(stalled) * 1000:.0f} ms ({len(stalled)})"
    )
    assert stalled and statistics.median(stalled) >= 0.2  # they did wait for the cache
    # Before the fix every publish on the host queued behind the hung node's 1 s timeouts.
    assert med_during < 0.1 and max(during) < 0.9, [round(t * 1000) for t in during]
    wait_for(
        "the hung node's keys repaired",
        lambda: backlog(stack) == 0,
        timeout=30,
        interval=0.2,
        retry_on=(),
    )


def test_an_app_just_restarted_answers_misses_when_the_other_restarts(pg_stack: Stack) -> None:
    """A rolling restart of the apps: app 1 restarted (nginx saw it refuse connections), then,
    3 s after it answers again, app 0 stopped: nginx must send misses to app 1 (a failed app is
    skipped for fastpoll_app_fail_timeout, 2 s), not answer 503 "no live upstreams"."""
    uid = new_uid()
    with pg_stack.api(0) as api:
        assert (
            api.post("/api/messages", json={"user_id": uid, "text": "rolling"}).status_code == 201
        )
    url = f"/Poll/getMessages?user_id={uid}"  # http_client signs it
    app1 = pg_stack.app_name(1)
    pg_stack.stop_proc(app1)
    try:
        with http_client(pg_stack) as c:
            for _ in range(6):  # round robin: some misses meet the stopped app and mark it
                Cache(pg_stack).delete(poll_key(uid))
                assert c.get(url).status_code == 200
    finally:
        pg_stack.start_app(1)
    time.sleep(3.0)
    pg_stack.stop_proc(pg_stack.app_name(0))
    try:
        with http_client(pg_stack) as c:
            for _ in range(4):
                Cache(pg_stack).delete(poll_key(uid))
                r = c.get(url)
                assert (r.status_code, r.headers.get("x-poll-source")) == (200, "app"), (
                    r.status_code,
                    r.text[:200],
                )
    finally:
        pg_stack.start_app(0)
