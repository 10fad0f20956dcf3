"""Metrics (docs/operations.md): under a known request mix the counters move by exactly that mix,
on both backends; coalescing, the app's fills and publishes, and the admin listeners staying on
loopback. No timing is asserted."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from fastpoll_testkit.helpers import Cache, http_client, new_uid, poll_key
from fastpoll_testkit.procs import Server, free_port, freeze, wait_for
from fastpoll_testkit.stack import POLL_SERVER, Stack, http_status
from fastpoll_testkit.status import parse_metrics, parse_stub_status, total

Metrics = dict[str, list[tuple[dict[str, str], float]]]
REQ = "fastpoll_requests_total"


def scrape(port: int, path: str = "/metrics") -> Metrics:
    r = httpx.get(f"http://127.0.0.1:{port}{path}", timeout=5)
    assert r.status_code == 200
    return parse_metrics(r.text)


def deltas(before: Metrics, after: Metrics, name: str) -> dict[tuple, float]:
    """{sorted label items: change} for every series of `name` that moved."""

    def series(m: Metrics) -> dict[tuple, float]:
        return {tuple(sorted(lb.items())): v for lb, v in m.get(name, [])}

    a, b = series(before), series(after)
    return {k: v - a.get(k, 0) for k, v in b.items() if v != a.get(k, 0)}


def req_key(method: str, outcome: str) -> tuple:
    return (("method", method), ("outcome", outcome))


class Poller:
    """One more poll server on the stack's config, but without [signing]: the one place where
    an invalid key reaches the key check instead of the signature check (403)."""

    def __init__(self, stack: Stack, tmp: Path) -> None:
        ini = tmp / "unsigned.ini"
        text, skip = [], False
        for line in stack.ini_path.read_text().splitlines():
            if line.startswith("["):
                skip = line.strip() == "[signing]"
            if not skip:
                text.append(line)
        ini.write_text("\n".join(text) + "\n")
        self.port, self.admin_port = free_port(), free_port()
        argv = [str(stack.poll_server), "-c", str(ini), "-p", str(self.port)]
        argv += ["--admin-port", str(self.admin_port)]
        url = f"http://127.0.0.1:{self.admin_port}/healthz"
        self.proc = Server(
            "poller",
            argv,
            self.port,
            log=tmp / "unsigned-poller.log",
            ready=lambda: http_status(url) == 200,
            timeout=30,
        ).start()

    def stop(self) -> None:
        if self.proc.running:
            # SIGCONT first (in case a test left it stopped), then SIGTERM: a clean exit
            assert self.proc.stop() == 0


@pytest.fixture(scope="module")
def unsigned(
    stack: Stack, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Poller]:
    p = Poller(stack, tmp_path_factory.mktemp(f"unsigned-{stack.backend}"))
    yield p
    p.stop()


def test_request_mix_moves_counters_exactly(unsigned: Poller, cache: Cache) -> None:
    hit_uid, miss_uids = new_uid(), [new_uid() for _ in range(12)]
    cache.set(poll_key(hit_uid), b'{"unread":1}')
    before = scrape(unsigned.admin_port)
    with httpx.Client(base_url=f"http://127.0.0.1:{unsigned.port}", timeout=10) as c:
        hit = f"/getMessages?user_id={hit_uid}"
        for _ in range(100):
            assert c.get(hit).status_code == 200
        for _ in range(3):
            assert c.head(hit).status_code == 200
        for uid in miss_uids[:10]:
            assert c.get(f"/getMessages?user_id={uid}").status_code == 404
        for uid in miss_uids[10:]:
            assert (
                c.post(f"/getMessages?user_id={uid}", content=b"x=1").status_code == 404
            )
        for bad in (
            "%00",
            "a%20b",
            "%0d%0a",
            "x" * 300,
            "%7F",
        ):  # never sent to a cache
            assert c.get(f"/getMessages?user_id={bad}").status_code == 404
        assert c.delete(hit).status_code == 405
        assert c.put(hit, content=b"").status_code == 405
    after = scrape(unsigned.admin_port)

    assert deltas(before, after, REQ) == {
        req_key("GET", "hit"): 100,
        req_key("HEAD", "hit"): 3,
        req_key("GET", "miss"): 10,
        req_key("POST", "miss"): 2,
        req_key("GET", "invalid_key"): 5,
        req_key("other", "method_not_allowed"): 2,
    }
    # One at a time, so no coalescing: one cache get per lookup, none for the invalid keys.
    gets = "fastpoll_backend_gets_total"
    assert total(after, gets, result="hit") - total(before, gets, result="hit") == 103
    assert total(after, gets, result="miss") - total(before, gets, result="miss") == 12
    assert total(after, gets) - total(before, gets) == 115
    assert (
        total(after, "fastpoll_cache_gets_total")
        - total(before, "fastpoll_cache_gets_total")
        == 115
    )
    assert total(after, "fastpoll_coalesced_requests_total") == total(
        before, "fastpoll_coalesced_requests_total"
    )
    lat = "fastpoll_backend_latency_seconds_count"
    assert total(after, lat) - total(before, lat) == 115
    # Every cache server is known by name, and up.
    ups = after["fastpoll_backend_up"]
    n_servers = len(cache.stack.memcached_ports) if cache.backend == "memcached" else 1
    assert len(ups) == n_servers and all(v == 1 for _, v in ups)
    assert total(after, "fastpoll_build_info") == 1
    assert after["fastpoll_build_info"][0][0]["backend"] == cache.backend


def test_signed_poller_counts_forbidden(stack: Stack, cache: Cache) -> None:
    """The stack's own pollers sign-check: an unsigned poll is a 403, counted as forbidden."""
    uid = new_uid()
    cache.set(poll_key(uid), b"x")
    admin = stack.admin_ports[0]
    before = scrape(admin)
    with http_client(stack, stack.poller_ports[0]) as signed:
        for _ in range(4):
            assert signed.get(f"/getMessages?user_id={uid}").status_code == 200
    with http_client(stack, stack.poller_ports[0], sign=False) as plain:
        for _ in range(5):
            assert plain.get(f"/getMessages?user_id={uid}").status_code == 403
    after = scrape(admin)
    assert deltas(before, after, REQ) == {
        req_key("GET", "hit"): 4,
        req_key("GET", "forbidden"): 5,
    }


def test_coalesced_counter_moves(unsigned: Poller, cache: Cache) -> None:
    """Requests for one key read in the same loop turn share one get. They are made to arrive
    together by stopping the poller while they are sent: ordering, not timing."""
    uid = new_uid()
    cache.set(poll_key(uid), b"same")
    n = 10
    before = scrape(unsigned.admin_port)
    request = f"GET /getMessages?user_id={uid} HTTP/1.1\r\nHost: x\r\n\r\n".encode()
    freeze(unsigned.proc.pid)
    try:
        socks = [
            socket.create_connection(("127.0.0.1", unsigned.port), timeout=10)
            for _ in range(n)
        ]
        for s in socks:
            s.sendall(request)
    finally:
        os.kill(unsigned.proc.pid, signal.SIGCONT)
    for s in socks:
        with s:
            assert s.recv(4096).startswith(b"HTTP/1.1 200")
    after = scrape(unsigned.admin_port)
    assert deltas(before, after, REQ) == {req_key("GET", "hit"): n}
    coalesced = total(after, "fastpoll_coalesced_requests_total") - total(
        before, "fastpoll_coalesced_requests_total"
    )
    gets = total(after, "fastpoll_cache_gets_total") - total(
        before, "fastpoll_cache_gets_total"
    )
    assert coalesced >= 1
    assert coalesced + gets == n  # each request cost a get of its own or shared one


def test_app_metrics_move_on_fill_and_publish(
    stack: Stack, client: httpx.Client
) -> None:
    app = stack.app_port
    uid = new_uid()
    before = scrape(app)
    first = client.get(
        f"/Poll/getMessages?user_id={uid}"
    )  # a miss: the app answers, fills
    assert (first.status_code, first.headers["x-poll-source"]) == (200, "app")
    with stack.api() as api:
        r = api.post("/api/messages", json={"user_id": uid, "text": "hello"})
    assert r.status_code == 201 and r.headers["x-cache-publish"] == "ok"
    after = scrape(app)
    fills = deltas(before, after, "fastpoll_app_cache_fills_total")
    assert fills == {(("result", "stored"),): 1}
    assert deltas(before, after, "fastpoll_app_publishes_total") == {
        (("result", "written"),): 1
    }
    reqs = deltas(before, after, "fastpoll_app_requests_total")
    assert reqs[(("method", "GET"), ("route", "poll"), ("status", "200"))] == 1
    assert reqs[(("method", "POST"), ("route", "publish"), ("status", "201"))] == 1
    db = "fastpoll_app_db_seconds_count"
    assert total(after, db, op="read") > total(before, db, op="read")
    assert total(after, db, op="commit") > total(before, db, op="commit")
    assert total(after, "fastpoll_app_build_info") == 1


def test_metrics_are_not_served_through_nginx(
    stack: Stack, client: httpx.Client
) -> None:
    for path in ("/metrics", "/metrics/", "/metrics/x"):
        r = client.get(path)
        assert r.status_code == 404
        assert "fastpoll_app" not in r.text
    assert httpx.get(f"http://127.0.0.1:{stack.app_port}/metrics").status_code == 200


def test_nginx_stub_status_on_loopback_only(stack: Stack) -> None:
    port = stack.nginx_status_port
    r = httpx.get(f"http://127.0.0.1:{port}/nginx_status", timeout=5)
    assert r.status_code == 200
    status = parse_stub_status(r.text)
    assert status["active"] >= 1 and status["requests"] >= 1
    assert httpx.get(f"http://127.0.0.1:{port}/", timeout=5).status_code == 404
    site = (stack.run_dir / "nginx" / "fastpoll.conf").read_text()
    assert f"listen 127.0.0.1:{port};" in site
    # Bound to 127.0.0.1 itself, not to every address: another address of the host is refused.
    for port_ in (port, *stack.admin_ports):
        for addr in other_addresses():
            with pytest.raises(OSError):
                socket.create_connection((addr, port_), timeout=2).close()


def other_addresses() -> list[str]:
    """Addresses of this host other than 127.0.0.1: another loopback one, and any others."""
    found = {"127.0.0.2"}
    try:
        for info in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET):
            found.add(str(info[4][0]))
    except OSError:
        pass
    found.discard("127.0.0.1")
    return sorted(found)


def test_access_log_shows_where_the_answer_came_from(
    stack: Stack, cache: Cache
) -> None:
    """The `fastpoll` log format: src= is X-Poll-Source as sent, us= every upstream tried."""
    log = stack.run_dir / "nginx" / "access-test.log"
    stack.nginx_vars["fastpoll_access_log"] = str(log)
    stack.reload_nginx()
    try:
        hit_uid, miss_uid = new_uid(), new_uid()
        cache.set(poll_key(hit_uid), b"x")
        with http_client(stack) as c:
            # Old workers (no log) finish after the reload; poll until the new ones log.
            for _ in range(120):
                assert c.get(f"/Poll/getMessages?user_id={hit_uid}").status_code == 200
                if f"user_id={hit_uid}&" in read(log):
                    break
                time.sleep(0.5)  # the log is flushed every 5 s
            assert c.get(f"/Poll/getMessages?user_id={miss_uid}").status_code == 200
        wait_for("log", lambda: f"user_id={miss_uid}&" in read(log), timeout=30)
        lines = read(log).splitlines()
        hit = next(ln for ln in lines if f"user_id={hit_uid}&" in ln)
        miss = next(ln for ln in lines if f"user_id={miss_uid}&" in ln)
        assert " 200 " in hit and "src=cache" in hit and "us=200 " in hit
        assert " 200 " in miss and "src=app" in miss and "us=404 : 200 " in miss
        # A signed poll URL is a bearer token: the log keeps the target up to sig= only.
        assert "&sig=- HTTP/1.1" in hit and "&exp=" in hit
        assert not re.search(r"sig=(?!-)", read(log)), "a signature in the access log"
    finally:
        del stack.nginx_vars["fastpoll_access_log"]
        stack.reload_nginx()


def read(path: Path) -> str:
    return path.read_text() if path.exists() else ""


def test_admin_healthz_and_unknown_paths(stack: Stack) -> None:
    admin = stack.admin_ports[0]
    r = httpx.get(f"http://127.0.0.1:{admin}/healthz", timeout=5)
    assert (r.status_code, r.text) == (200, "ok\n")
    assert httpx.get(f"http://127.0.0.1:{admin}/nope", timeout=5).status_code == 404
    assert httpx.post(f"http://127.0.0.1:{admin}/metrics", timeout=5).status_code == 405
    m = scrape(admin)
    assert total(m, "fastpoll_loop_iterations_total") > 0  # the loop probe runs
    assert total(m, "fastpoll_loop_registered_fds") > 0
    assert total(m, "fastpoll_open_connections") >= 0
    assert total(m, "fastpoll_uptime_seconds") > 0


def test_cli_version_and_admin_config(tmp_path: Path) -> None:
    binary = str(POLL_SERVER)
    v = subprocess.run(
        [binary, "--version"], capture_output=True, text=True, check=True
    )
    assert v.stdout.startswith("poll_server ") and v.stdout.split()[1][0].isdigit()
    ini = tmp_path / "f.ini"
    ini.write_text("[admin]\nlisten = 127.0.0.1\nport = 9101\n")
    ok = subprocess.run(
        [binary, "-t", "-c", str(ini)], capture_output=True, text=True, check=False
    )
    assert ok.returncode == 0, ok.stderr
    ini.write_text("[admin]\nlisten = 127.0.0.1\nport = 70000\n")
    bad = subprocess.run(
        [binary, "-t", "-c", str(ini)], capture_output=True, text=True, check=False
    )
    assert bad.returncode == 1 and f"{ini}:3" in bad.stderr and "port" in bad.stderr
    flag = subprocess.run(
        [binary, "-t", "--admin-port", "x"], capture_output=True, text=True, check=False
    )
    assert flag.returncode == 1 and "admin-port" in flag.stderr


def test_status_command_reads_the_stack(stack: Stack) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "fastpoll_testkit.status", "--run-dir",
         str(stack.run_dir), "--interval", "0.2"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    for name in ("poller-0", "nginx", "app", "all up"):
        assert name in r.stdout
