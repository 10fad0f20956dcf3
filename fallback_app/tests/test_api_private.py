"""The private write API: bearer token, bad input, idempotency keys, mark-read up to an id,
the config's sha256, the new config keys and the migrate command. Tests that touch the store run
on SQLite and on PostgreSQL (the `settings` fixture)."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from fastpoll_app import config
from fastpoll_app.app import create_app
from fastpoll_app.config import ConfigError, parse
from fastpoll_app.store import SCHEMA_VERSION

from .conftest import PgServer

TOKEN = "t" * 20 + "0123456789abcdef"
JSON = {"content-type": "application/json"}


def token_file(tmp_path: Path, text: str = TOKEN + "\n", mode: int = 0o640) -> Path:
    p = tmp_path / "api.token"
    p.write_text(text)
    p.chmod(mode)
    return p


@pytest.fixture
def api(settings: config.Settings, tmp_path: Path) -> Iterator[TestClient]:
    """The app with [app] api_token_file set; the client sends no token by itself."""
    app = dataclasses.replace(settings.app, api_token_file=str(token_file(tmp_path)))
    with TestClient(create_app(dataclasses.replace(settings, app=app))) as c:
        yield c


def auth(token: str = TOKEN) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


# ---- item 6: the write API needs the bearer token --------------------------------------------


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Bearer"},
        {"Authorization": "Bearer " + TOKEN[:-1]},
        {"Authorization": "Bearer " + TOKEN + "x"},
        {"Authorization": "Basic " + TOKEN},
        {"Authorization": "Bearer ☃".encode()},
    ],
)
def test_write_api_without_the_token_is_401(
    api: TestClient, headers: dict[str, str | bytes]
) -> None:
    for path, body in (
        ("/api/messages", {"user_id": 7, "text": "x"}),
        ("/api/messages/read", {"user_id": 7, "up_to_id": 9}),
        ("/api/poll-url", {"user_id": 7}),
    ):
        r = api.post(path, json=body, headers=headers)
        assert r.status_code == 401, (path, r.text)
        assert r.json() == {"error": "missing or invalid bearer token"}
        assert r.headers["www-authenticate"] == "Bearer"
    assert api.get("/Poll/getMessages?user_id=7").content == b""  # nothing was stored


def test_write_api_with_the_token(api: TestClient) -> None:
    r = api.post("/api/messages", json={"user_id": 7, "text": "x"}, headers=auth())
    assert r.status_code == 201
    r = api.post("/api/poll-url", json={"user_id": 7}, headers=auth())
    assert r.status_code == 200
    assert api.get("/Poll/getMessages?user_id=7").json()["unread"] == 1  # polls need none


@pytest.mark.parametrize(
    ("text", "mode", "why"),
    [
        (TOKEN + "\n", 0o644, "must not be readable by others"),
        (TOKEN + "\n", 0o660, "nor writable by the group"),
        ("", 0o600, "empty"),
        ("\n" + TOKEN, 0o600, "empty"),
        ("short\n", 0o600, "16.."),
        ("with space in the token\n", 0o600, "printable ASCII"),
    ],
)
def test_api_token_file_errors(tmp_path: Path, text: str, mode: int, why: str) -> None:
    p = token_file(tmp_path, text, mode)
    with pytest.raises(ConfigError, match=r"t\.ini:3: \[app\] api_token_file .*" + why):
        parse(f"[app]\ndatabase = x.db\napi_token_file = {p}\n", "t.ini")


def test_api_token_file_missing(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"t\.ini:2: \[app\] api_token_file .*cannot read"):
        parse(f"[app]\napi_token_file = {tmp_path}/none\n", "t.ini")


# ---- item 7: bad input is a 4xx with a JSON error ----------------------------------------------


@pytest.mark.parametrize(
    ("body", "status", "says"),
    [
        (b"[" * 100_000 + b"]" * 100_000, 413, "larger"),  # over max_body_size first
        (b'{"user_id": 1, "text": ' + b"[" * 30_000 + b"]" * 30_000 + b"}", 400, "too deeply"),
        (b'{"user_id": 1, "text": ' + b'{"a":' * 9_000 + b"1" + b"}" * 9_000 + b"}", 400, "deeply"),
        (b'{"user_id": 1, "text": "a", "text": "b"}', 400, "duplicate key 'text'"),
        (b'{"user_id": 1, "user_id": 2, "text": "b"}', 400, "duplicate key 'user_id'"),
        (b'{"user_id": 1, "text": {"a": {"b": 1}}}', 400, "text"),
    ],
)
def test_bad_json_is_a_4xx(client: TestClient, body: bytes, status: int, says: str) -> None:
    r = client.post("/api/messages", content=body, headers=JSON)
    assert r.status_code == status, r.text
    assert says in r.json()["error"]
    assert client.get("/Poll/getMessages?user_id=1").content == b""


@pytest.mark.parametrize(
    "ctype", [None, "text/plain", "application/x-www-form-urlencoded", "application/jsonx"]
)
def test_content_type_must_be_json(client: TestClient, ctype: str | None) -> None:
    headers = {"content-type": ctype} if ctype else {}
    for path, body in (
        ("/api/messages", b'{"user_id": 1, "text": "x"}'),
        ("/api/messages/read", b'{"user_id": 1, "up_to_id": 1}'),
        ("/api/poll-url", b'{"user_id": 1}'),
    ):
        r = client.post(path, content=body, headers=headers)
        assert r.status_code == 415, (path, r.text)
        assert r.json() == {"error": "Content-Type must be application/json"}
    ok = client.post(
        "/api/messages",
        content=b'{"user_id": 1, "text": "x"}',
        headers={"content-type": "application/json; charset=utf-8"},
    )
    assert ok.status_code == 201


def test_params_limit_as_the_poll_server() -> None:
    names = " ".join(["user_id"] + [f"p{i}" for i in range(15)])
    assert len(parse(f"[keys]\nparams = {names}\n").keys.params) == 16
    with pytest.raises(ConfigError, match=r"<string>:2: \[keys\] params: more than 16"):
        parse(f"[keys]\nparams = {names} p99\n")


# ---- item 5: idempotency key, up_to_id -------------------------------------------------------


def test_idempotent_publish_is_stored_once(client: TestClient) -> None:
    headers = {"Idempotency-Key": "order-17-attempt"}
    first = client.post("/api/messages", json={"user_id": 3, "text": "once"}, headers=headers)
    assert first.status_code == 201 and "idempotent-replayed" not in first.headers
    again = client.post("/api/messages", json={"user_id": 3, "text": "once"}, headers=headers)
    assert again.status_code == 201
    assert again.json() == first.json()
    assert again.headers["idempotent-replayed"] == "true"
    assert client.get("/Poll/getMessages?user_id=3").json()["unread"] == 1
    # The key is per user; another text under the same key is a conflict, not a new message.
    other = client.post("/api/messages", json={"user_id": 4, "text": "once"}, headers=headers)
    assert other.status_code == 201 and other.json()["id"] != first.json()["id"]
    clash = client.post("/api/messages", json={"user_id": 3, "text": "twice"}, headers=headers)
    assert clash.status_code == 409 and "error" in clash.json()
    assert client.get("/Poll/getMessages?user_id=3").json()["unread"] == 1


@pytest.mark.parametrize("key", ["", " ", "x" * 129, "tab\there", "☃"])
def test_bad_idempotency_key(client: TestClient, key: str) -> None:
    r = client.post(
        "/api/messages",
        json={"user_id": 3, "text": "x"},
        headers={"Idempotency-Key": key.encode()},
    )
    assert r.status_code == 400 and "Idempotency-Key" in r.json()["error"]


def test_mark_read_up_to_id_leaves_newer_messages(client: TestClient) -> None:
    seen = client.post("/api/messages", json={"user_id": 5, "text": "seen"}).json()["id"]
    later = client.post("/api/messages", json={"user_id": 5, "text": "not yet seen"}).json()
    r = client.post("/api/messages/read", json={"user_id": 5, "up_to_id": seen})
    assert r.status_code == 200 and r.json()["marked_read"] == 1
    answer = client.get("/Poll/getMessages?user_id=5").json()
    newest = {"id": later["id"], "text": "not yet seen"}
    assert answer == {"unread": 1, "newest": newest, "messages": [newest]}
    fp = client.app.state.fastpoll  # type: ignore[attr-defined]
    assert (
        fp._fill.get(b"/Poll/getMessages?user_id=5")
        == client.get("/Poll/getMessages?user_id=5").content
    )


# ---- the interface for the deploy: config sha256 ---------------------------------------------


def test_config_sha256_in_healthz_and_metrics(tmp_path: Path, memcached: object) -> None:
    ini = tmp_path / "f.ini"
    data = f"[app]\ndatabase = {tmp_path / 'db'}\n; a comment changes the hash too\n".encode()
    ini.write_bytes(data)
    want = hashlib.sha256(data).hexdigest()
    settings = config.load(ini)
    assert settings.sha256 == want
    with TestClient(create_app(settings)) as c:
        assert c.get("/healthz").json() == {"status": "ok", "config_sha256": want}
        assert f'fastpoll_config_info{{sha256="{want}"}} 1\n' in c.get("/metrics").text


def test_new_config_keys(tmp_path: Path) -> None:
    pw = tmp_path / "redis.pass"
    pw.write_text("secret\n")
    s = parse(
        f"[redis]\npassword_file = {pw}\nusername = fastpoll\n"
        "[app]\ndatabase = postgresql://fp@10.0.0.5:5432/fastpoll\n"
    )
    assert s.redis.username == "fastpoll" and s.app.is_postgresql
    assert parse("").redis.username is None


def test_multi_host_postgresql_url() -> None:
    """libpq's multi-host form: the app finds the primary among the hosts (failover)."""
    url = "postgresql://fp@10.0.0.5:5432,10.0.0.6:5432/fastpoll?target_session_attrs=read-write"
    s = parse(f"[app]\ndatabase = {url}\n")
    assert s.app.is_postgresql and s.app.database == url


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("postgresql://fp:secret@h:5432/db", "no password in the URL"),
        ("postgresql://h:5432/db", "needs a user"),
        ("postgresql://fp@h:5432/", "database name"),
        ("postgresql://fp@h:99999/db", "[Pp]ort"),
        ("postgresql://fp@h1:5432,h2:99999/db", "[Pp]ort"),
        ("postgresql://fp@h1:5432,:5432/db", "needs a host"),
        ("postgresql://fp:secret@h1:5432,h2:5432/db", "no password in the URL"),
    ],
)
def test_bad_postgresql_url(url: str, why: str) -> None:
    with pytest.raises(ConfigError, match=r"<string>:2: \[app\] database: .*" + why):
        parse(f"[app]\ndatabase = {url}\n")


def test_database_password_file_only_for_postgresql(tmp_path: Path) -> None:
    pw = tmp_path / "pw"
    pw.write_text("secret\n")
    pw.chmod(0o600)
    with pytest.raises(ConfigError, match=r":3: \[app\] database_password_file is for"):
        parse(f"[app]\ndatabase = x.db\ndatabase_password_file = {pw}\n")
    pw.chmod(0o644)
    with pytest.raises(ConfigError, match="must not be readable by others"):
        parse(f"[app]\ndatabase = postgresql://u@h/d\ndatabase_password_file = {pw}\n")


# ---- migrate -----------------------------------------------------------------------------------


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"}
    return subprocess.run(
        [sys.executable, "-m", "fastpoll_app", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


def test_migrate_and_refusal_on_an_unmigrated_postgresql(
    postgres_session: PgServer, tmp_path: Path
) -> None:
    import psycopg

    srv = postgres_session
    pg = srv.pg
    with psycopg.connect(pg.url, password=pg.password, autocommit=True) as conn:
        conn.execute("DROP DATABASE IF EXISTS fresh")
        conn.execute("CREATE DATABASE fresh")
    url = pg.url.rsplit("/", 1)[0] + "/fresh"
    ini = tmp_path / "f.ini"
    ini.write_text(
        f"[app]\ndatabase = {url}\ndatabase_password_file = {srv.password_file}\nopen_api = true\n"
    )
    r = run_cli("--config", str(ini), "--check")
    assert r.returncode == 1
    assert "schema is version 0" in r.stderr and "fastpoll_app migrate" in r.stderr
    r = run_cli("migrate", "--config", str(ini))
    assert r.returncode == 0 and f"migrated 0 -> {SCHEMA_VERSION}" in r.stderr, r.stderr
    r = run_cli("migrate", "--config", str(ini))  # idempotent
    assert r.returncode == 0 and f"already at version {SCHEMA_VERSION}" in r.stderr, r.stderr
    r = run_cli("--config", str(ini), "--check")
    assert r.returncode == 0, r.stderr


def test_sqlite_migrates_an_old_file(tmp_path: Path) -> None:
    """A database written by the app before versioning (messages only) is upgraded in place."""
    import sqlite3

    db = tmp_path / "old.db"
    conn = sqlite3.connect(db)
    conn.executescript(
        "CREATE TABLE messages (id INTEGER PRIMARY KEY, user_id INTEGER NOT NULL, "
        "text TEXT NOT NULL, created REAL NOT NULL, read INTEGER NOT NULL DEFAULT 0);"
        "INSERT INTO messages (user_id, text, created) VALUES (8, 'kept', 0);"
    )
    conn.commit()
    conn.close()
    ini = tmp_path / "f.ini"
    ini.write_text(f"[app]\ndatabase = {db}\n")
    r = run_cli("migrate", "--config", str(ini))
    assert r.returncode == 0 and f"migrated 0 -> {SCHEMA_VERSION}" in r.stderr, r.stderr
    from fastpoll_app.store import SqliteStore

    store = SqliteStore(str(db))
    assert b"kept" in store.poll_answer(8)
    store.close()
