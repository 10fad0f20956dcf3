"""python -m fastpoll_app as a real process (uvicorn, 2 workers)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from .conftest import Server, free_port


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fastpoll_app", *args],
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_check_ok_and_bad(tmp_path: Path) -> None:
    good = tmp_path / "good.ini"
    good.write_text(f"[cache]\nttl = 5\n[app]\ndatabase = {tmp_path / 'db'}\n")
    r = run_cli("--config", str(good), "--check")
    assert r.returncode == 0, r.stderr
    bad = tmp_path / "bad.ini"
    bad.write_text("[cache]\nttl = 5\nttll = 6\n")
    r = run_cli("--config", str(bad), "--check")
    assert r.returncode == 1
    assert f"{bad}:3: unknown key 'ttll' in [cache]" in r.stderr


def test_bad_database_path(tmp_path: Path) -> None:
    ini = tmp_path / "f.ini"
    ini.write_text(f"[app]\ndatabase = {tmp_path}/missing/dir/db\n")
    r = run_cli("--config", str(ini), "--check")
    assert r.returncode == 1
    assert "[app] database" in r.stderr


def test_serves_with_two_workers(tmp_path: Path, memcached: Server) -> None:
    ini = tmp_path / "fastpoll.ini"
    ini.write_text(
        f"[memcached]\nservers = {memcached.addr}\n[app]\ndatabase = {tmp_path / 'db.sqlite'}\n"
    )
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "fastpoll_app", "--config", str(ini), "--port", str(port),
         "--workers", "2"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        base = f"http://127.0.0.1:{port}"
        end = time.monotonic() + 30
        while True:
            try:
                if httpx.get(base + "/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < end, "app did not come up"
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            time.sleep(0.1)
        with httpx.Client(base_url=base, timeout=10) as c:
            r = c.get("/Poll/getMessages?user_id=3")
            assert r.status_code == 200 and r.content == b""
            assert r.headers["x-poll-source"] == "app"
            assert "server" not in r.headers
            for i in range(20):  # spread over both workers
                assert (
                    c.post("/api/messages", json={"user_id": 3, "text": f"t{i}"}).status_code == 201
                )
            r = c.get("/Poll/getMessages?user_id=3")
            assert r.content.startswith(b'{"unread":20,')
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0
