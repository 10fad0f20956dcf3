"""memcached replicas: every key on its ketama node and on one replica
(ketama over the other servers), the poll server failing over to the replica when the primary is
down, hung, recovering or failing, and a membership change written to both placements.

Each test runs a stack of its own (3 memcached nodes, 2 pollers) and checks what clients see:
X-Poll-Source and the answer's newest message id. docs/design.md, "Replicas", explains the
design; docs/operations.md has the full drills' figures.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from fastpoll_app.cache import MemcachedCache, Placement
from fastpoll_testkit.helpers import http_client, new_uid, poll_key
from fastpoll_testkit.loadgen import Load, LoadResult
from fastpoll_testkit.procs import free_port, freeze, wait_for
from fastpoll_testkit.stack import Stack, memcached_ask

MakeStack = Callable[..., Stack]


@pytest.fixture()
def make_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MakeStack]:
    stacks: list[Stack] = []

    def make(**kw: Any) -> Stack:
        kw.setdefault("n_memcached", 3)
        kw.setdefault("n_pollers", 2)
        s = Stack(
            run_dir=tmp_path_factory.mktemp("replicas"), backend="memcached", **kw
        )
        stacks.append(s)
        s.start()
        return s

    yield make
    for s in stacks:
        for (
            name,
            proc,
        ) in s.procs.items():  # a test may leave a node stopped: wake it first
            if name.startswith("memcached"):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGCONT)
        s.stop()
    reports = [r for s in stacks for r in s.sanitizer_reports()]
    assert not reports, "\n".join(reports[:20])


def servers(stack: Stack) -> list[str]:
    return [f"127.0.0.1:{p}" for p in stack.memcached_ports]


def users_by_primary(stack: Stack, n: int) -> dict[int, list[int]]:
    """n fresh users, grouped by the index of their key's primary node."""
    placement = Placement(servers(stack), 1)
    out: dict[int, list[int]] = {}
    for _ in range(n):
        u = new_uid()
        primary = placement.nodes(poll_key(u).encode())[0]
        out.setdefault(servers(stack).index(primary), []).append(u)
    placement.close()
    return out


def prime(stack: Stack, uids: list[int]) -> dict[int, str]:
    """Poll each user once through nginx (a miss: the app fills both copies); signed URLs."""
    urls = {u: stack.poll_url(u) for u in uids}
    with httpx.Client(base_url=stack.base_url, timeout=10) as c:
        for u in uids:
            assert c.get(urls[u]).status_code == 200
        for u in uids:
            assert c.get(urls[u]).headers["x-poll-source"] == "cache", u
    return urls


def holders(stack: Stack, key: str) -> list[int]:
    return [
        i
        for i, port in enumerate(stack.memcached_ports)
        if memcached_ask(port, f"get {key}".encode()).startswith(b"VALUE")
    ]


def assert_no_failures(r: LoadResult, what: str) -> None:
    assert r.requests > 0, f"{what}: no requests ({r.summary()})"
    assert r.failed == 0, f"{what}: {r.failed} failed: {r.summary()}"


def metric(stack: Stack, i: int, name: str, server: str) -> float:
    """One series of poller i's /metrics, by its server label."""
    text = httpx.get(f"http://127.0.0.1:{stack.admin_ports[i]}/metrics", timeout=5).text
    for line in text.splitlines():
        if line.startswith(f'{name}{{server="{server}"}}'):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no {name} for {server}")


def newest_id(body: bytes) -> int:
    return int(json.loads(body)["newest"]["id"]) if body else 0


# ---- placement ------------------------------------------------------------------------------


def test_app_writes_each_key_to_its_primary_and_one_replica(
    make_stack: MakeStack,
) -> None:
    stack = make_stack(n_pollers=1)
    by_node = users_by_primary(stack, 60)
    assert len(by_node) == 3, {k: len(v) for k, v in by_node.items()}
    uids = [u for us in by_node.values() for u in us]
    prime(stack, uids)
    placement = Placement(servers(stack), 1)
    try:
        for u in uids:
            want = sorted(
                servers(stack).index(a) for a in placement.nodes(poll_key(u).encode())
            )
            assert len(want) == 2
            assert holders(stack, poll_key(u)) == want, u
    finally:
        placement.close()


# ---- a node killed under load -----------------------------------------------------------------


def test_kill9_node_under_load_its_keys_come_from_the_replica(
    make_stack: MakeStack,
) -> None:
    """kill -9 one of 3 nodes under wrk: 0 failed requests, and within a few seconds every key
    that lived on it is a cache hit again (its replica). Without replicas those keys go to the
    app for as long as the node is away (test_faults.py's hung-node test shows that). Both
    pollers active (not the default "auto", 1 of 2 on 2 cores), so both take the load."""
    stack = make_stack(nginx_vars={"fastpoll_active_pollers": 0})
    by_node = users_by_primary(stack, 90)
    urls = prime(stack, [u for us in by_node.values() for u in us])
    lost = by_node[0]

    load = Load(stack.base_url, list(urls.values()), seconds=8, connections=16)
    time.sleep(max(0.0, load.started + 2.0 - time.monotonic()))
    stack.stop_proc("memcached-0", signal.SIGKILL)
    killed = time.monotonic()

    def lost_keys_from_cache() -> bool:
        with httpx.Client(base_url=stack.base_url, timeout=10) as c:
            return all(
                c.get(urls[u]).headers.get("x-poll-source") == "cache" for u in lost
            )

    took = wait_for(
        "the killed node's keys served from the cache",
        lost_keys_from_cache,
        timeout=10, retry_on=(),
    )
    r = load.result()
    assert_no_failures(r, "kill -9 of a memcached node")
    assert r.sources.get("cache", 0) >= 0.95 * r.requests, r.summary()
    assert time.monotonic() - killed < 10, took
    # Both pollers read the replicas, and count it.
    for i in range(2):
        assert (
            metric(stack, i, "fastpoll_replica_reads_total", servers(stack)[1])
            + metric(stack, i, "fastpoll_replica_reads_total", servers(stack)[2])
            > 0
        )


# ---- a node hung, a publish meanwhile, then resumed -------------------------------------------


def test_sigstop_publish_during_hang_resume_never_the_old_answer(
    make_stack: MakeStack,
) -> None:
    """SIGSTOP a node under load, publish to users whose primary it is, SIGCONT it: every poll
    from then on, through nginx and from each poller directly, shows the new message. The node
    holds the old answers until the app's outbox rewrites them; the pollers read its keys from
    the replicas for recovery_ms after it answers again (fastpoll_backend_recovering)."""
    stack = make_stack()  # recovery_ms: the default, 5000
    by_node = users_by_primary(stack, 60)
    urls = prime(stack, [u for us in by_node.values() for u in us])
    hung = by_node[0][:4]
    node = servers(stack)[0]
    pid = stack.procs["memcached-0"].pid

    load = Load(stack.base_url, list(urls.values()), seconds=12, connections=8)
    time.sleep(max(0.0, load.started + 1.0 - time.monotonic()))
    freeze(pid)
    try:
        newest: dict[int, int] = {}

        def publish(u: int) -> None:
            with stack.api() as api:
                r = api.post(
                    "/api/messages", json={"user_id": u, "text": "during the hang"}
                )
                assert r.status_code == 201, r.text
                # The hung primary timed out: the outbox has it; the replica was written.
                assert r.headers["x-cache-publish"] == "pending", r.headers
                newest[u] = r.json()["id"]

        threads = [threading.Thread(target=publish, args=(u,)) for u in hung]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert sorted(newest) == sorted(hung)
        # During the hang: from the replica, already the new message.
        with httpx.Client(base_url=stack.base_url, timeout=10) as c:
            for u in hung:
                r = c.get(urls[u])
                assert (r.status_code, r.headers["x-poll-source"]) == (200, "cache")
                assert newest_id(r.content) == newest[u]
        # The stopped node still holds the old answers.
    finally:
        os.kill(pid, signal.SIGCONT)
    resumed = time.monotonic()

    stale: list[str] = []
    seen_recovering = [False, False]
    with http_client(stack, sign=False) as c:
        directs = [http_client(stack, port) for port in stack.poller_ports]
        try:
            while time.monotonic() - resumed < 7.0:
                for u in hung:
                    for where, cl, url in (
                        ("nginx", c, urls[u]),
                        ("poller-0", directs[0], f"/getMessages?user_id={u}"),
                        ("poller-1", directs[1], f"/getMessages?user_id={u}"),
                    ):
                        r = cl.get(url)
                        if r.status_code == 200 and newest_id(r.content) != newest[u]:
                            stale.append(
                                f"{where} user {u} at +{time.monotonic() - resumed:.2f}s"
                            )
                for i in range(2):
                    if metric(stack, i, "fastpoll_backend_recovering", node) == 1:
                        seen_recovering[i] = True
                time.sleep(0.05)
        finally:
            for d in directs:
                d.close()
    res = load.result()
    assert_no_failures(res, "a node hung and resumed")
    assert not stale, f"{len(stale)} stale answers after the resume: {stale[:5]}"
    assert all(seen_recovering), seen_recovering
    # The outbox rewrote the node itself: its own copy is the new answer.
    for u in hung:
        got = memcached_ask(stack.memcached_ports[0], f"get {poll_key(u)}".encode())
        assert f'"id":{newest[u]},'.encode() in got, (u, got[:120])
    # The window is over: the node is read again, not through its replicas.
    for i in range(2):
        assert metric(stack, i, "fastpoll_backend_recovering", node) == 0


def test_a_hang_no_poll_saw_is_still_followed_by_the_recovery_window(
    make_stack: MakeStack,
) -> None:
    """No poll reaches the node while it is stopped: the poll server's idle probe (a get of a key
    no one writes, every second) sees the hang, so after SIGCONT it still reads the node's keys
    from their replicas while the outbox rewrites it. Without the probe the first polls after the
    resume read the old answer from the node."""
    stack = make_stack(n_pollers=1)
    u = users_by_primary(stack, 30)[0][0]
    prime(stack, [u])
    node = servers(stack)[0]
    pid = stack.procs["memcached-0"].pid
    time.sleep(1.5)  # idle
    freeze(pid)
    try:
        time.sleep(2.5)  # no polls: only the probe can notice
        with stack.api() as api:
            r = api.post("/api/messages", json={"user_id": u, "text": "unseen hang"})
        assert r.headers["x-cache-publish"] == "pending", r.headers
        want = r.json()["id"]
    finally:
        os.kill(pid, signal.SIGCONT)
    resumed = time.monotonic()
    seen: list[tuple[float, int]] = []
    with http_client(stack, stack.poller_ports[0]) as direct:
        while time.monotonic() - resumed < 3.0:
            p = direct.get(f"/getMessages?user_id={u}")
            assert p.status_code == 200, p.status_code
            seen.append((round(time.monotonic() - resumed, 2), newest_id(p.content)))
            time.sleep(0.02)
    stale = [x for x in seen if x[1] != want]
    assert not stale, f"{len(stale)} of {len(seen)} stale after the resume: {stale[:5]}"
    assert metric(stack, 0, "fastpoll_backend_recovering", node) == 1


# ---- the recovery window ------------------------------------------------------------------------


def test_recovery_window_reads_the_replica_then_the_primary(
    make_stack: MakeStack,
) -> None:
    """A node that comes back is read through its keys' replicas for recovery_ms, then again
    itself. Shown with a value planted on the primary only (what a node back from a hang would
    hold): invisible during the window, served after it."""
    stack = make_stack(n_pollers=1, extra_ini={"memcached": {"recovery_ms": "3000"}})
    by_node = users_by_primary(stack, 30)
    u = by_node[0][0]
    key = poll_key(u)
    urls = prime(stack, [u])
    with http_client(stack, stack.poller_ports[0]) as direct:
        stack.stop_proc("memcached-0", signal.SIGKILL)
        # A poll finds the node down and moves to the replica at once.
        assert direct.get(f"/getMessages?user_id={u}").status_code == 200
        stack.start_memcached(0)
        marker = b'{"unread":9,"newest":{"id":999999,"text":"planted"}}'
        one = MemcachedCache((servers(stack)[0],), 300, 1000)
        try:
            one.put(key.encode(), marker, 0)  # the primary only
        finally:
            one.close()
        node = servers(stack)[0]
        wait_for(
            "the poller notices the node is back",
            lambda: (
                metric(stack, 0, "fastpoll_backend_recovering", node) == 1
                or direct.get(f"/getMessages?user_id={u}").content == marker
            ),
            timeout=10, retry_on=(),
        )
        back = time.monotonic()
        during: list[bytes] = []
        while True:
            got = direct.get(f"/getMessages?user_id={u}").content
            # Counted only when the window is still open after the answer: the poll surely
            # fell inside it (read before the poll, the window could end in between).
            if metric(stack, 0, "fastpoll_backend_recovering", node) != 1:
                break
            during.append(got)
            time.sleep(0.05)
        window = time.monotonic() - back
        assert during and marker not in during, "the recovering primary was read"
        assert 1.5 < window < 5.0, window
        assert direct.get(f"/getMessages?user_id={u}").content == marker
    assert urls


def test_replicas_off_a_dead_nodes_keys_fall_back_to_the_app(
    make_stack: MakeStack,
) -> None:
    """[memcached] replicas = 0: the seed's behaviour (one copy); the dead node's keys fall back."""
    stack = make_stack(n_pollers=1, extra_ini={"memcached": {"replicas": "0"}})
    by_node = users_by_primary(stack, 30)
    urls = prime(stack, by_node[0])
    assert all(holders(stack, poll_key(u)) == [0] for u in by_node[0])
    stack.stop_proc("memcached-0", signal.SIGKILL)
    with httpx.Client(base_url=stack.base_url, timeout=10) as c:
        assert all(c.get(urls[u]).headers["x-poll-source"] == "app" for u in by_node[0])


# ---- membership change --------------------------------------------------------------------------


def test_membership_change_both_placements_written_no_stale_on_either_list(
    make_stack: MakeStack,
) -> None:
    """Adding a third node: the app runs servers = a b c with previous_servers = a b; poller 0
    still runs the old list (a b), poller 1 the new one. Answers cached under the old placement
    before the change, then publishes and polls interleaved: neither poller ever shows an
    answer older than the last publish, and both read from the cache."""
    ports = [free_port() for _ in range(3)]
    old = " ".join(f"127.0.0.1:{p}" for p in ports[:2])
    stack = make_stack(
        memcached_ports=ports,
        extra_ini={"memcached": {"previous_servers": old}},
        poller_args={0: ["-s", old]},
    )
    uids = [new_uid() for _ in range(40)]
    # Before the change: the answers cached where the old list puts them (the old app's fills).
    before = MemcachedCache(tuple(old.split()), 300, 1000, replicas=1)
    try:
        for u in uids:
            assert before.fill(poll_key(u).encode(), b"", 0)
    finally:
        before.close()

    newest = dict.fromkeys(uids, 0)
    stale: list[str] = []
    sources: dict[str, int] = {}
    with stack.api() as api:
        directs = [http_client(stack, port) for port in stack.poller_ports]
        try:
            for rnd in range(3):
                for u in uids:
                    r = api.post(
                        "/api/messages", json={"user_id": u, "text": f"r{rnd}"}
                    )
                    assert r.status_code == 201, r.text
                    assert r.headers["x-cache-publish"] == "ok"
                    newest[u] = r.json()["id"]
                    for i, d in enumerate(directs):
                        p = d.get(f"/getMessages?user_id={u}")
                        src = f"poller-{i} {p.status_code}"
                        sources[src] = sources.get(src, 0) + 1
                        if p.status_code == 200 and newest_id(p.content) != newest[u]:
                            stale.append(f"poller-{i} user {u} round {rnd}")
        finally:
            for d in directs:
                d.close()
    assert not stale, f"{len(stale)} stale answers: {stale[:5]}"
    assert set(sources) == {"poller-0 200", "poller-1 200"}, sources


# ---- configuration ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("memcached", "key"),
    [
        (
            "servers = 127.0.0.1:1\nreplicas = 1",
            "replicas",
        ),  # no other server for a replica
        ("servers = 127.0.0.1:1 127.0.0.1:2\nreplicas = 2", "replicas"),
        ("servers = 127.0.0.1:1 127.0.0.1:2\nrecovery_ms = -1", "recovery_ms"),
        ("servers = 127.0.0.1:1\nprevious_servers = nohost", "previous_servers"),
    ],
)
def test_both_programs_refuse_the_same_bad_keys(
    tmp_path: Path, memcached: str, key: str
) -> None:
    """The poll server (-t) and the app read the same file and name the key and the line."""
    from fastpoll_app import config
    from fastpoll_testkit.stack import POLL_SERVER

    ini = tmp_path / "bad.ini"
    ini.write_text(f"[cache]\nbackend = memcached\n[memcached]\n{memcached}\n")
    c = subprocess.run(
        [str(POLL_SERVER), "-t", "-c", str(ini)],
        check=False,
        capture_output=True,
        text=True,
        timeout=10,
    )
    assert c.returncode != 0
    assert f"{ini}:5: [memcached] {key}" in c.stderr, c.stderr
    with pytest.raises(config.ConfigError) as e:
        config.load(str(ini))
    assert f"{ini}:5: [memcached] {key}" in str(e.value), e.value


def test_replicas_default_follows_the_server_list() -> None:
    from fastpoll_app import config

    two = config.parse("[memcached]\nservers = 127.0.0.1:1 127.0.0.1:2\n")
    one = config.parse("[memcached]\nservers = 127.0.0.1:1\n")
    assert (two.memcached.replicas, one.memcached.replicas) == (1, 0)
    assert two.memcached.recovery_ms == 5000
    off = config.parse("[memcached]\nservers = 127.0.0.1:1 127.0.0.1:2\nreplicas = 0\n")
    assert off.memcached.replicas == 0
    prev = config.parse(
        "[memcached]\nservers = 127.0.0.1:1 127.0.0.1:2\nprevious_servers = 127.0.0.1:1\n"
        "previous_servers = 127.0.0.1:3\n"
    )
    assert prev.memcached.previous_servers == ("127.0.0.1:1", "127.0.0.1:3")
