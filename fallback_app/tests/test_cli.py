"""python -m fastpoll_app as a real process (uvicorn, 2 workers)."""

from __future__ import annotations

import http.client
import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import httpx
import pytest

from fastpoll_app.accesslog import mask_target
from fastpoll_testkit.procs import Server, free_port

from .conftest import REPO_ROOT, app_process


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fastpoll_app", *args],
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_version_is_the_package_version() -> None:
    """--version prints the version pip installed (fallback_app/pyproject.toml's), needs no
    config and starts nothing."""
    project = tomllib.loads((REPO_ROOT / "fallback_app" / "pyproject.toml").read_text())
    r = run_cli("--version", "--config", "/nonexistent.ini")
    assert r.returncode == 0, r.stderr
    assert r.stdout == f"fastpoll_app {project['project']['version']}\n"


def test_check_ok_and_bad(tmp_path: Path) -> None:
    good = tmp_path / "good.ini"
    good.write_text(f"[cache]\nttl = 5\n[app]\ndatabase = {tmp_path / 'db'}\nopen_api = true\n")
    r = run_cli("--config", str(good), "--check")
    assert r.returncode == 0, r.stderr
    bad = tmp_path / "bad.ini"
    bad.write_text("[cache]\nttl = 5\nttll = 6\n")
    r = run_cli("--config", str(bad), "--check")
    assert r.returncode == 1
    assert f"{bad}:3: unknown key 'ttll' in [cache]" in r.stderr


def test_refuses_to_serve_an_open_write_api(tmp_path: Path) -> None:
    """Without [app] api_token_file the write API would take anyone's writes: the app refuses to
    start (and --check fails) unless open_api = true says that is meant; with a token it runs."""
    ini = tmp_path / "f.ini"
    ini.write_text(f"[app]\ndatabase = {tmp_path / 'db'}\n")
    for args in (["--check"], ["--port", str(free_port())]):
        r = run_cli("--config", str(ini), *args)
        assert r.returncode == 1
        assert f"{ini}: [app] api_token_file is not set" in r.stderr, r.stderr
        assert "open_api = true" in r.stderr
    token = tmp_path / "api.token"
    token.write_text("t" * 32 + "\n")
    token.chmod(0o600)
    ini.write_text(f"[app]\ndatabase = {tmp_path / 'db'}\napi_token_file = {token}\n")
    assert run_cli("--config", str(ini), "--check").returncode == 0
    ini.write_text(f"[app]\ndatabase = {tmp_path / 'db'}\nopen_api = yes\n")
    r = run_cli("--config", str(ini), "--check")
    assert r.returncode == 1 and "open_api must be true or false" in r.stderr


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
        "open_api = true\n"
    )
    with app_process(ini, workers=2) as base, httpx.Client(base_url=base, timeout=10) as c:
        r = c.get("/Poll/getMessages?user_id=3")
        assert r.status_code == 200 and r.content == b""
        assert r.headers["x-poll-source"] == "app"
        assert "server" not in r.headers
        for i in range(20):  # spread over both workers
            assert c.post("/api/messages", json={"user_id": 3, "text": f"t{i}"}).status_code == 201
        r = c.get("/Poll/getMessages?user_id=3")
        assert r.content.startswith(b'{"unread":20,')


def _head(base: str, method: str, target: str, body: str | None = None) -> list[str]:
    """The answer's header lines as they came on the wire (http.client keeps their case)."""
    host, port = base.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        headers = {"Content-Type": "application/json", "Idempotency-Key": "k-1"} if body else {}
        conn.request(method, target, body=body, headers=headers)
        r = conn.getresponse()
        r.read()
        return [f"{n}: {v}" for n, v in r.getheaders()]
    finally:
        conn.close()


def test_header_names_spelled_as_the_poll_server(tmp_path: Path, memcached: Server) -> None:
    """The app's own headers on the wire as poll_server/src/response.c writes them
    (X-Poll-Source: app, not x-poll-source: app), and the API's as docs/api.md does."""
    ini = tmp_path / "f.ini"
    ini.write_text(
        f"[memcached]\nservers = {memcached.addr}\n[app]\ndatabase = {tmp_path / 'db'}\n"
        "open_api = true\n"
    )
    with app_process(ini) as base:
        head = _head(base, "GET", "/Poll/getMessages?user_id=5")
        assert "X-Poll-Source: app" in head, head
        names = [line.split(":")[0] for line in head]
        assert {"Content-Type", "ETag", "Poll-Interval-Ms", "Content-Length"} <= set(names), head
        assert names.count("Date") == 1 and all(n[0].isupper() for n in names), head
        body = '{"user_id": 5, "text": "hi"}'
        first = _head(base, "POST", "/api/messages", body)
        assert "X-Cache-Publish: ok" in first and "Idempotent-Replayed: true" not in first, first
        again = _head(base, "POST", "/api/messages", body)
        assert "Idempotent-Replayed: true" in again, again


def test_access_log_masks_the_signature(tmp_path: Path, memcached: Server) -> None:
    """A signed poll URL is a bearer token: --access-log writes it as nginx's log does, up to
    `sig=` and `sig=-` in its place (before, the whole signature was logged)."""
    ini = tmp_path / "f.ini"
    ini.write_text(
        f"[memcached]\nservers = {memcached.addr}\n[app]\ndatabase = {tmp_path / 'db'}\n"
        "open_api = true\n"
    )
    with app_process(ini, args=("--access-log",)) as base:
        r = httpx.get(f"{base}/Poll/getMessages?user_id=3&exp=9&sig=SECRETSIG&x=1", timeout=10)
        assert r.status_code == 200
    log = (tmp_path / "app.log").read_text()
    assert "SECRETSIG" not in log
    assert '"GET /Poll/getMessages?user_id=3&exp=9&sig=- HTTP/1.1" 200' in log, log


ISO_TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}[+-]\d\d:\d\d")


@pytest.mark.parametrize("log_format", ["json", "text"])
def test_log_format_of_the_app(tmp_path: Path, memcached: Server, log_format: str) -> None:
    """[log] format, as the poll server reads it: json gives one JSON object a line (time with
    its UTC offset, pid, level, logger, msg), text the poll server's time and the rest."""
    ini = tmp_path / "f.ini"
    ini.write_text(
        f"[memcached]\nservers = {memcached.addr}\n[app]\ndatabase = {tmp_path / 'db'}\n"
        f"open_api = true\n[log]\nlevel = warn\nformat = {log_format}\n"
    )
    with app_process(ini, args=("--access-log",)) as base:
        assert httpx.get(f'{base}/Poll/getMessages?user_id=3&q="x"', timeout=10).is_success
    lines = (tmp_path / "app.log").read_text().splitlines()
    access = [ln for ln in lines if "GET /Poll/getMessages" in ln]
    assert len(access) == 1, lines
    if log_format == "text":
        assert all(ISO_TIME.match(ln) for ln in lines), lines
        return
    docs = [json.loads(ln) for ln in lines]
    assert all(set(d) == {"time", "pid", "level", "logger", "msg"} for d in docs), docs
    assert all(ISO_TIME.fullmatch(d["time"]) and isinstance(d["pid"], int) for d in docs), docs
    [hit] = [d for d in docs if "GET /Poll/getMessages" in d["msg"]]
    assert hit["logger"] == "uvicorn.access" and hit["level"] == "info", hit
    assert '"GET /Poll/getMessages?user_id=3&q=%22x%22 HTTP/1.1" 200' in hit["msg"], hit


@pytest.mark.parametrize(
    ("target", "logged"),
    [
        ("/Poll/getMessages?user_id=1&exp=2&sig=abc", "/Poll/getMessages?user_id=1&exp=2&sig=-"),
        ("/Poll/getMessages?sig=abc&user_id=1", "/Poll/getMessages?sig=-"),
        ("/Poll/getMessages?user_id=1&xsig=abc", "/Poll/getMessages?user_id=1&xsig=abc"),
        ("/Poll/getMessages?user_id=1", "/Poll/getMessages?user_id=1"),
        ("/a/sig=1", "/a/sig=1"),
    ],
)
def test_mask_target_as_nginx(target: str, logged: str) -> None:
    assert mask_target(target) == logged
