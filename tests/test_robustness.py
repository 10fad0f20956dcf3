"""Poll server robustness: each defect reproduced against a real poll server
and a real memcached or Redis on free loopback ports, without nginx or the app (the poll server's
own answers are what is checked). Each test fails on the poll server before the fix.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from fastpoll_testkit.procs import wait_for
from fastpoll_testkit.scripted import CLOSE, ScriptedServer
from fastpoll_testkit.stack import POLL_SERVER
from fastpoll_testkit.standalone import Poller, Procs, key, own_procs, redis_cmd


@pytest.fixture()
def procs(tmp_path: Path) -> Iterator[Procs]:
    yield from own_procs(tmp_path)




def mc_set(port: int, k: str, value: bytes) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(f"set {k} 0 0 {len(value)}\r\n".encode() + value + b"\r\n")
        assert s.recv(100).startswith(b"STORED")


# ---- a value over the poll server's limit ------------------------------------------------


def test_oversized_value_fails_alone_node_stays_up(procs: Procs) -> None:
    """A 2 MiB value (memcached -I 4m stores it; the poll server's limit is 1 MiB) next to a
    normal key on the same, only, node: the big one falls back (503) without taking the
    connection down; the normal key stays a hit, before and after, and nothing reconnects."""
    mc = procs.memcached("-I", "4m")
    big, small = 1, 2
    mc_set(mc, key(big), b"x" * (2 * 1024 * 1024))
    mc_set(mc, key(small), b'{"unread":0}')
    p = procs.poller(
        {"memcached": {"servers": f"127.0.0.1:{mc}"}, "cache": {"timeout_ms": "500"}}
    )
    assert p.status(small) == 200
    with httpx.Client(base_url=f"http://127.0.0.1:{p.port}", timeout=5) as c:
        for _ in range(20):
            assert c.get(f"/getMessages?user_id={big}").status_code == 503
            r = c.get(f"/getMessages?user_id={small}")
            assert r.status_code == 200 and r.content == b'{"unread":0}'
    log = p.log()
    assert log.count("connected") == 1, log  # one connection, never dropped
    assert log.count("over the 1048576 byte limit") == 1, log  # rate-limited


@pytest.fixture()
def fake() -> Iterator[Callable[[Callable[[bytes], bytes | None]], ScriptedServer]]:
    servers: list[ScriptedServer] = []

    def make(answer: Callable[[bytes], bytes | None]) -> ScriptedServer:
        servers.append(ScriptedServer(answer))
        return servers[-1]

    yield make
    for srv in servers:
        srv.close()


def memcached_script(line: bytes) -> bytes:
    if line == b"mn":
        return b"ERROR\r\n"  # classic gets
    if line.endswith(b"user_id=1"):
        return b"CLIENT_ERROR bad data chunk\r\n"
    if line.endswith(b"user_id=2"):
        return b"VALUE " + line[4:] + b" 0 2\r\nok\r\nEND\r\n"
    if line.endswith(b"user_id=3"):
        return b"garbage\r\n"
    return b"END\r\n"


def test_client_error_fails_alone_garbage_backs_off(
    procs: Procs, fake: Callable[[Callable[[bytes], bytes | None]], ScriptedServer]
) -> None:
    """A fake memcached that answers CLIENT_ERROR to one key, a hit to another, and garbage to a
    third: CLIENT_ERROR fails its request alone (the connection stays); garbage drops the
    connection and the poll server reconnects after a backoff, not in a loop."""
    srv = fake(memcached_script)
    p = procs.poller({"memcached": {"servers": f"127.0.0.1:{srv.port}"}})
    wait_for("the poll server connects", lambda: srv.accepted >= 1, timeout=10, retry_on=())
    with httpx.Client(base_url=f"http://127.0.0.1:{p.port}", timeout=5) as c:
        for _ in range(10):
            assert c.get("/getMessages?user_id=1").status_code == 503
            assert c.get("/getMessages?user_id=2").status_code == 200
        assert srv.accepted == 1, "CLIENT_ERROR must not drop the connection"
        # Garbage: each poll drops the connection; the reconnects wait the backoff.
        n0 = srv.accepted
        end = time.monotonic() + 2.0
        while time.monotonic() < end:
            c.get("/getMessages?user_id=3")
            time.sleep(0.005)
    reconnects = srv.accepted - n0
    # Retrying at once would reconnect on every poll (hundreds in 2 s); with the backoff
    # (>= 50 ms, doubling to 1-2 s) it is a handful.
    assert 1 <= reconnects <= 8, reconnects


# ---- out of descriptors on accept ---------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_emfile_pauses_accepting_then_service_resumes(procs: Procs) -> None:
    """With `ulimit -n 64` and 120 clients holding connections, accept() fails with EMFILE:
    the poll server must not spin (CPU stays low), must not flood its log, counts the errors
    in fastpoll_accept_errors_total{reason="emfile"}, and serves again once clients leave."""
    mc = procs.memcached()
    mc_set(mc, key(7), b"seven")
    p = procs.poller(
        {"memcached": {"servers": f"127.0.0.1:{mc}"}},
        prefix=["prlimit", "--nofile=64:64", "--"],
    )
    assert p.status(7) == 200
    held: list[socket.socket] = []
    try:
        for _ in range(120):  # more than the limit; the kernel's backlog takes the rest
            held.append(socket.create_connection(("127.0.0.1", p.port), timeout=2))
        time.sleep(0.5)
        pid = p.proc.popen.pid
        c0, t0 = cpu_seconds(pid), time.monotonic()
        time.sleep(2.0)
        cpu = (cpu_seconds(pid) - c0) / (time.monotonic() - t0)
        assert cpu < 0.25, f"poll server at {cpu:.0%} CPU while out of descriptors"
    finally:
        for s in held:
            s.close()
    # Descriptors free again: the backlog's connections are accepted (and closed by their
    # clients), new requests and scrapes are answered.
    wait_for(
        "serving again after EMFILE",
        lambda: p.status(7, timeout=2) == 200,
        timeout=10,
        retry_on=(),
    )
    assert p.get(7).content == b"seven"
    assert p.metric('fastpoll_accept_errors_total{reason="emfile"}') >= 1
    lines = p.log().splitlines()
    assert len(lines) < 30, f"{len(lines)} log lines:\n" + "\n".join(lines[-10:])
    assert any("accept failed: Too many open files" in line for line in lines), lines[
        -10:
    ]


# ---- open connections through the unix socket ---------------------------------------------


def test_open_connections_counts_unix_socket_clients(
    procs: Procs, request: pytest.FixtureRequest
) -> None:
    """nginx reaches the pollers through a unix socket by default; the gauge must see them."""
    mc = procs.memcached()
    # A short path (sun_path: 107 bytes), removed at the end.
    sock_dir = Path(tempfile.mkdtemp(prefix="fp-rob-", dir="/tmp"))
    request.addfinalizer(lambda: shutil.rmtree(sock_dir, ignore_errors=True))
    path = sock_dir / "p.sock"
    p = procs.poller(
        {
            "memcached": {"servers": f"127.0.0.1:{mc}"},
            "server": {"listen": f"127.0.0.1 unix:{path}"},
        }
    )
    base = p.metric("fastpoll_open_connections")
    clients = []
    try:
        for _ in range(5):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(str(path))
            s.sendall(b"GET /getMessages?user_id=5 HTTP/1.1\r\nHost: x\r\n\r\n")
            assert b" 404 " in s.recv(4096)
            clients.append(s)
        assert p.metric("fastpoll_open_connections") == base + 5
    finally:
        for s in clients:
            s.close()
    wait_for(
        "the closes are counted",
        lambda: p.metric("fastpoll_open_connections") == base,
        timeout=10, retry_on=(),
    )


# ---- SIGHUP, the config hash, config errors ----------------------------------------------


def test_sighup_reopens_the_log_file(procs: Procs, tmp_path: Path) -> None:
    mc = procs.memcached()
    mc_set(mc, key(9), b"nine")
    log = tmp_path / "poller.log"
    p = procs.poller(
        {"memcached": {"servers": f"127.0.0.1:{mc}"}, "log": {"file": str(log)}}
    )
    wait_for(
        "logs to the file",
        lambda: log.exists() and "listening on" in log.read_text(),
        timeout=10, retry_on=(),
    )
    rotated = tmp_path / "poller.log.1"
    log.rename(rotated)  # as logrotate does
    os.kill(p.proc.popen.pid, signal.SIGHUP)
    wait_for(
        "a new log file",
        lambda: log.exists() and "reopened" in log.read_text(),
        timeout=10,
        retry_on=(),
    )
    assert p.proc.popen.poll() is None, "SIGHUP killed the poll server"
    assert p.get(9).content == b"nine"
    assert "reopened" not in rotated.read_text()


def test_metrics_carry_the_config_hash(procs: Procs) -> None:
    mc = procs.memcached()
    p = procs.poller({"memcached": {"servers": f"127.0.0.1:{mc}"}})
    want = hashlib.sha256(p.ini.read_bytes()).hexdigest()
    assert f'fastpoll_config_info{{sha256="{want}"}} 1' in p.metrics().splitlines()
    assert httpx.get(f"http://127.0.0.1:{p.admin}/healthz", timeout=5).text == "ok\n"


@pytest.mark.parametrize(
    ("ini", "want"),
    [
        (
            "[redis]\nsentinels = 127.0.0.1:26379\n",
            ":2: [redis] sentinels needs [redis] master_name",
        ),
        (
            "[redis]\n\nusername = app\n",
            ":3: [redis] username needs [redis] password_file",
        ),
    ],
)
def test_config_errors_between_keys_name_key_and_line(
    tmp_path: Path, ini: str, want: str
) -> None:
    path = tmp_path / "bad.ini"
    path.write_text(ini)
    r = subprocess.run(
        [str(POLL_SERVER), "-t", "-c", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert r.returncode != 0
    assert f"{path}{want}" in r.stderr, r.stderr


# ---- Redis: setup failures, error replies, ACL users --------------------------------------


def redis_connections(port: int) -> int:
    """Connections Redis has accepted since it started (INFO stats)."""
    with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
        s.sendall(b"INFO stats\r\n")
        data = b""
        while b"total_connections_received:" not in data or not data.endswith(b"\r\n"):
            data += s.recv(65536)
    line = next(
        ln
        for ln in data.split(b"\r\n")
        if ln.startswith(b"total_connections_received:")
    )
    return int(line.split(b":")[1])




def poll_for(p: Poller, uid: int, seconds: float) -> dict[int, int]:
    """Polls uid for a while; status -> count."""
    seen: dict[int, int] = {}
    end = time.monotonic() + seconds
    with httpx.Client(base_url=f"http://127.0.0.1:{p.port}", timeout=5) as c:
        while time.monotonic() < end:
            st = c.get(f"/getMessages?user_id={uid}").status_code
            seen[st] = seen.get(st, 0) + 1
            time.sleep(0.005)
    return seen


def test_redis_select_of_a_missing_database_serves_nothing(procs: Procs) -> None:
    """`databases 1` and [redis] db = 5: SELECT fails. Every poll must fall back (503), none
    may be served database 0's value (another tenant's data), and the poll server reconnects
    with the backoff, not in a loop."""
    rd = procs.redis("databases 1")
    assert redis_cmd(rd, "SET", key(11), "db0-secret").startswith(b"+OK")
    p = procs.poller(
        {
            "cache": {"backend": "redis"},
            "redis": {"server": f"127.0.0.1:{rd}", "db": "5"},
        },
        wait=False,
    )
    wait_for("poll server", lambda: p.status(-1) in (404, 503), proc=p.proc.popen)
    c0 = redis_connections(rd)
    seen = poll_for(p, 11, 2.0)
    assert set(seen) == {503}, seen
    reconnects = redis_connections(rd) - c0
    assert reconnects <= 10, f"{reconnects} connections in 2 s: no backoff"
    assert "setup command refused" in p.log()


def test_redis_error_reply_does_not_reset_the_backoff(
    procs: Procs, fake: Callable[[Callable[[bytes], bytes | None]], ScriptedServer]
) -> None:
    """A Redis at its maxclients answers "-ERR max number of clients reached" and closes. That
    error reply must not count as an answer: the reconnects back off instead of following
    every poll."""

    def answer(line: bytes) -> bytes | None:
        # RESP: the command's name is a line of its own
        if line.upper() == b"GET":
            return b"-ERR max number of clients reached\r\n" + CLOSE
        return b""

    srv = fake(answer)
    p = procs.poller(
        {"cache": {"backend": "redis"}, "redis": {"server": f"127.0.0.1:{srv.port}"}},
        wait=False,
    )
    wait_for("poll server", lambda: p.status(-1) in (404, 503), proc=p.proc.popen)
    n0 = srv.accepted
    seen = poll_for(p, 12, 2.0)
    assert set(seen) == {503}, seen
    reconnects = srv.accepted - n0
    # a backoff doubling to 2 s: a handful; reset by the error reply: one per poll
    assert reconnects <= 10, f"{reconnects} reconnects in 2 s"


def test_redis_late_reply_fails_alone_no_reconnect(
    procs: Procs, fake: Callable[[Callable[[bytes], bytes | None]], ScriptedServer]
) -> None:
    """A Redis that answers every GET, in order, 40 ms after the previous one (a slow but
    answering server). 12 polls at once with a 200 ms timeout: the first ones are hits, the
    ones whose turn comes after 200 ms get 503 alone, and the connection stays: replies kept
    coming, so Redis is late, not hung (the failure model memcached has)."""
    state = {"get": False}

    def slow(line: bytes) -> bytes | None:
        if line.upper() == b"GET":
            state["get"] = True
        elif state["get"] and not line.startswith(b"$"):
            state["get"] = False
            time.sleep(0.04)
            return b"$2\r\nok\r\n"
        return b""

    srv = fake(slow)
    sub = fake(lambda line: b"")  # the announcement subscriber's own server (never answers)
    p = procs.poller(
        {
            "cache": {"backend": "redis", "timeout_ms": "200"},
            "redis": {"server": f"127.0.0.1:{srv.port}"},
            "announce": {"server": f"127.0.0.1:{sub.port}"},
        }
    )
    assert p.status(40) == 200
    # Connect first, then send the 12 requests back to back: threads each connecting on a busy
    # machine arrived spread out by more than 40 ms, and then none waited its turn past 200 ms.
    socks = [socket.create_connection(("127.0.0.1", p.port), timeout=10) for _ in range(12)]
    try:
        for i, s in enumerate(socks):
            s.sendall(b"GET /getMessages?user_id=%d HTTP/1.1\r\nHost: x\r\n\r\n" % (100 + i))
        statuses = sorted(int(s.recv(64).split(b" ", 2)[1]) for s in socks)
    finally:
        for s in socks:
            s.close()
    assert statuses.count(200) >= 2 and statuses.count(503) >= 2, statuses
    assert srv.accepted == 1, "a late reply must not drop the connection"
    assert "no reply within" not in p.log()
    time.sleep(0.6)  # the late replies are read and dropped; the connection serves on
    assert p.status(41) == 200


def test_redis_acl_username(procs: Procs, tmp_path: Path) -> None:
    rd = procs.redis("user default off", "user app on >s3cret ~* +@all")
    pw = tmp_path / "redis.pass"
    pw.write_text("s3cret\n")
    p = procs.poller(
        {
            "cache": {"backend": "redis"},
            "redis": {
                "server": f"127.0.0.1:{rd}",
                "username": "app",
                "password_file": str(pw),
            },
        }
    )
    with socket.create_connection(("127.0.0.1", rd), timeout=2) as s:
        s.sendall(b"AUTH app s3cret\r\n")
        assert s.recv(100).startswith(b"+OK")
        v = b"acl-ok"
        k = key(13).encode()
        s.sendall(
            b"*3\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n" % (len(k), k, len(v), v)
        )
        assert s.recv(100).startswith(b"+OK")
    wait_for("served through the ACL user", lambda: p.status(13) == 200, timeout=10, retry_on=())
    assert p.get(13).content == b"acl-ok"
