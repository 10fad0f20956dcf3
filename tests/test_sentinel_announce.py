"""Announcements through Redis Sentinel: with [redis] sentinels and no
[announce] server, the app publishes on the master the sentinels name and every poll server
subscribes there, on either backend; the sentinels require a password ([redis]
sentinel_password_file, their requirepass) that both programs send.

The drill, on each backend: a whole stack (nginx, the app, two poll servers) whose Redis is the
master, a replica and three sentinels on free loopback ports, all started and stopped by pid.
The master is killed with SIGKILL under a plain-poll load through nginx, and a publish is made
while it is down (its announcement is lost: nobody is subscribed). Checked: no poll fails
during the failover; the poll servers subscribe on the promoted replica without a restart; the
poll held across the failover is answered with the publish made during it well before the
re-check (set to 60 s here), since a new subscription is a gap that has every held key read
again; a poll held after the failover is woken by a publish within a second.
"""

from __future__ import annotations

import secrets
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from fastpoll_testkit.helpers import assert_no_failures, at, new_uid, prime
from fastpoll_testkit.loadgen import Load
from fastpoll_testkit.procs import free_port, wait_for
from fastpoll_testkit.stack import Stack
from fastpoll_testkit.standalone import Procs, own_procs

MASTER = "fpannounce"
RECHECK_MS = 60000  # far longer than any wait below: only an announcement or a gap wakes


@pytest.fixture()
def procs(tmp_path: Path) -> Iterator[Procs]:
    yield from own_procs(tmp_path)


def subscribed(stack: Stack) -> bool:
    """Every poll server subscribed to the announcements."""
    for port in stack.admin_ports[: len(stack.poller_ports)]:
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
        if "\nfastpoll_announce_subscribed 1\n" not in "\n" + text:
            return False
    return True


def sentinel_master(port: int, password: str) -> int:
    """The master's port the sentinel at `port` names (after AUTH)."""
    answer = redis_cmd_auth(port, password, "SENTINEL", "get-master-addr-by-name", MASTER)
    return int(answer.split(b"\r\n")[-2])


def redis_cmd_auth(port: int, password: str, *args: str) -> bytes:
    """One command after AUTH on one connection: the command's answer."""
    import socket

    def cmd(*a: str) -> bytes:
        return f"*{len(a)}\r\n".encode() + b"".join(
            f"${len(x.encode())}\r\n{x}\r\n".encode() for x in a
        )

    with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
        s.sendall(cmd("AUTH", password))
        assert s.recv(4096).startswith(b"+OK"), "AUTH refused"
        s.sendall(cmd(*args))
        return s.recv(65536)


def start_sentinels(
    procs: Procs, ports: list[int], master: int, redis_pass: str, sentinel_pass: str
) -> None:
    for port in ports:
        procs.sentinel(
            master,
            MASTER,
            f"sentinel down-after-milliseconds {MASTER} 1000",
            f"sentinel failover-timeout {MASTER} 5000",
            port=port,
            auth_pass=redis_pass,
            requirepass=sentinel_pass,
        )
    deadline = time.monotonic() + 30
    while not all(
        redis_cmd_auth(p, sentinel_pass, "SENTINEL", "replicas", MASTER).startswith(b"*1\r\n")
        and redis_cmd_auth(p, sentinel_pass, "SENTINEL", "sentinels", MASTER).startswith(
            b"*2\r\n"
        )
        for p in ports
    ):
        assert time.monotonic() < deadline, "the sentinels did not find each other"
        time.sleep(0.2)


class HeldPoll:
    """One wait=25 poll through nginx with the current ETag, in its own thread."""

    def __init__(self, stack: Stack, uid: int) -> None:
        self.url = stack.poll_url(uid)
        with httpx.Client(base_url=stack.base_url, timeout=10) as c:
            r = c.get(self.url)
            assert r.status_code == 200, r.status_code
            self.tag = r.headers["etag"]
        self.answer: httpx.Response | None = None
        self.answered = 0.0
        self.thread = threading.Thread(target=self._run, args=(stack.base_url,), daemon=True)
        self.thread.start()

    def _run(self, base_url: str) -> None:
        with httpx.Client(base_url=base_url, timeout=40) as c:
            self.answer = c.get(self.url + "&wait=25", headers={"If-None-Match": self.tag})
        self.answered = time.monotonic()

    def wait(self, timeout: float) -> httpx.Response:
        self.thread.join(timeout)
        assert self.answer is not None, f"the held poll was not answered within {timeout} s"
        return self.answer


def publish(stack: Stack, uid: int, text: str) -> float:
    """The time the publish was sent (its announcement may arrive before its answer)."""
    with stack.api() as api:
        t0 = time.monotonic()
        r = api.post("/api/messages", json={"user_id": uid, "text": text})
    assert r.status_code == 201, r.text
    return t0


def woken_by_publish(stack: Stack, text: str) -> float:
    """A held poll woken by a publish's announcement within a second: the seconds it took."""
    uid = new_uid()
    held = HeldPoll(stack, uid)
    time.sleep(0.5)
    sent = publish(stack, uid, text)
    r = held.wait(5)
    assert r.status_code == 200 and text in r.text, r.text
    took = held.answered - sent
    assert took < 1.0, f"woken {took:.2f} s after the publish"
    return took


@pytest.mark.parametrize("backend", ["memcached", "redis"])
def test_announcements_follow_a_failover(procs: Procs, tmp_path: Path, backend: str) -> None:
    sentinel_ports = [free_port() for _ in range(3)]
    run_dir = tmp_path / "stack"
    run_dir.mkdir()
    sentinel_pass = secrets.token_hex(16)
    pass_file = run_dir / "sentinel.pass"
    pass_file.write_text(sentinel_pass + "\n")
    pass_file.chmod(0o600)
    stack = Stack(
        run_dir=run_dir,
        backend=backend,
        n_pollers=2,
        announce=False,  # no [announce] server: the sentinels name where
        extra_ini={
            "redis": {
                "sentinels": ",".join(f"127.0.0.1:{p}" for p in sentinel_ports),
                "master_name": MASTER,
                "sentinel_password_file": str(pass_file),
            },
            "server": {"recheck_ms": str(RECHECK_MS), "recheck_subscribed_ms": str(RECHECK_MS)},
        },
    )
    stack.redis_port = free_port()
    try:
        stack.start()  # its Redis is the master; the sentinels come next
        redis_pass = (run_dir / "redis.pass").read_text().strip()
        replica = procs.redis(
            f"replicaof 127.0.0.1 {stack.redis_port}",
            f"masterauth {redis_pass}",
            f"requirepass {redis_pass}",
        )
        start_sentinels(procs, sentinel_ports, stack.redis_port, redis_pass, sentinel_pass)
        wait_for("the poll servers subscribed through the sentinels", lambda: subscribed(stack))

        woken_by_publish(stack, "before the failover")

        # The failover under plain-poll load; a poll held across it.
        urls = prime(stack, 20)
        across_uid = new_uid()
        across = HeldPoll(stack, across_uid)
        load = Load(stack.base_url, urls, seconds=12, connections=4)
        at(load, 2.0)
        killed = time.monotonic()
        stack.stop_proc("redis", signal.SIGKILL)
        # Published while the master is down: its announcement is lost (or, with the Redis
        # backend, waits in the outbox until the cache write succeeds on the new master).
        publish(stack, across_uid, "during the failover")
        wait_for(
            "the failover",
            lambda: sentinel_master(sentinel_ports[0], sentinel_pass) == replica,
            timeout=30,
        )
        promoted = time.monotonic() - killed
        wait_for("subscribed on the new master", lambda: subscribed(stack), timeout=15)
        resubscribed = time.monotonic() - killed
        r = across.wait(15)
        woken = across.answered - killed
        assert r.status_code == 200 and "during the failover" in r.text, r.text
        assert woken < 15, f"the held poll was woken {woken:.1f} s after the kill"
        result = load.result()
        assert_no_failures(result, "the master killed under load")

        after = woken_by_publish(stack, "after the failover")
        print(
            f"{backend}: master killed; promoted after {promoted:.1f} s, subscribed again "
            f"{resubscribed:.1f} s, the poll held across woken {woken:.1f} s after the kill; "
            f"a publish after it woke its held poll in {after * 1000:.0f} ms; "
            f"{result.summary()}"
        )
    finally:
        stack.stop()
    reports = stack.sanitizer_reports()
    assert not reports, "\n".join(reports[:20])


def test_sentinel_password_refused(procs: Procs, tmp_path: Path) -> None:
    """A wrong sentinel password: the poll server is not subscribed, says why in its log, and
    keeps running (it asks again with the backoff)."""
    redis = procs.redis()
    ports = [free_port()]
    procs.sentinel(redis, MASTER, quorum=1, port=ports[0], requirepass="right")
    wrong = tmp_path / "wrong.pass"
    wrong.write_text("wrong\n")
    wrong.chmod(0o600)
    p = procs.poller(
        {
            "cache": {"backend": "memcached"},
            "memcached": {"servers": f"127.0.0.1:{free_port()}"},
            "redis": {
                "sentinels": f"127.0.0.1:{ports[0]}",
                "master_name": MASTER,
                "sentinel_password_file": str(wrong),
            },
        }
    )
    wait_for("the refusal logged", lambda: "does not name master" in p.log(), timeout=10)
    assert p.proc.popen.poll() is None
