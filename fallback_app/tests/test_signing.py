"""Signed poll URLs on the app side: shared vectors, the secret file, issuing and checking."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from fastpoll_app import config, signing
from fastpoll_app.app import create_app
from fastpoll_testkit.procs import Server

from .conftest import make_settings

VECTORS = Path(__file__).resolve().parents[2] / "tests" / "vectors" / "signing.json"
S32 = "0123456789abcdef0123456789abcdef"


def test_sign_vectors() -> None:
    doc = json.loads(VECTORS.read_text())
    for c in doc["sign"]:
        got = signing.sign(c["secret"].encode(), c["exp"].encode(), c["key"].encode())
        assert got.decode() == c["sig"], c


def test_check_vectors() -> None:
    doc = json.loads(VECTORS.read_text())
    for c in doc["check"]:
        query = c["target"].encode().partition(b"?")[2]
        secrets = [s.encode() for s in c["secrets"]]
        got = signing.verify(secrets, c["key"].encode(), query, c["now"])
        assert got == c["valid"], c["why"]


def write(path: Path, text: str, mode: int) -> Path:
    path.write_text(text)
    path.chmod(mode)
    return path


def test_secret_file_rules(tmp_path: Path) -> None:
    f = tmp_path / "s"
    assert signing.load_secrets(write(f, S32 + "\n", 0o600)) == [S32.encode()]
    assert signing.load_secrets(write(f, f"{S32}a\r\n\n{S32}b", 0o640)) == [
        (S32 + "a").encode(),
        (S32 + "b").encode(),
    ]
    for text, mode, why in [
        (S32, 0o644, "0644"),
        (S32, 0o620, "0620"),
        ("short\n", 0o600, "line 1"),
        (S32 + " x\n", 0o600, "line 1"),
        ("\n\n", 0o600, "no secret"),
        ((S32 + "\n") * 5, 0o600, "more than 4"),
    ]:
        with pytest.raises(signing.SecretFileError, match=why) as exc:
            signing.load_secrets(write(f, text, mode))
        assert "short" not in str(exc.value)  # never echo a secret
    with pytest.raises(signing.SecretFileError, match="cannot read"):
        signing.load_secrets(tmp_path / "missing")


def test_write_secret_file_is_0600(tmp_path: Path) -> None:
    f = tmp_path / "new.key"
    signing.write_secret_file(f)
    assert f.stat().st_mode & 0o777 == 0o600
    assert len(signing.load_secrets(f)[0]) == 64


def test_config_signing_section(tmp_path: Path) -> None:
    key = write(tmp_path / "k", S32 + "\n", 0o600)
    s = config.parse(f"[signing]\nsecret_file = {key}\nttl = 60\n", "t.ini")
    assert (s.signing.secret_file, s.signing.ttl) == (str(key), 60)
    assert config.parse("", "t.ini").signing.secret_file is None
    write(key, S32 + "\n", 0o644)
    with pytest.raises(config.ConfigError, match=r"t.ini:2: \[signing\] secret_file: .*0644"):
        config.parse(f"[signing]\nsecret_file = {key}\n", "t.ini")
    with pytest.raises(config.ConfigError, match="t.ini:2: .*ttl"):
        config.parse("[signing]\nttl = 0\n", "t.ini")
    with pytest.raises(config.ConfigError, match="reserved"):
        config.parse("[keys]\nparams = user_id exp\n", "t.ini")
    with pytest.raises(config.ConfigError, match="unknown key"):
        config.parse("[signing]\nsecret = x\n", "t.ini")


@pytest.fixture
def signed_client(memcached: Server, tmp_path: Path) -> Iterator[TestClient]:
    key = write(tmp_path / "signing.key", S32 + "\n", 0o600)
    settings = make_settings(
        tmp_path,
        f"[cache]\nbackend = memcached\n[memcached]\nservers = {memcached.addr}\n"
        f"[signing]\nsecret_file = {key}\nttl = 600\n",
    )
    with TestClient(create_app(settings)) as c:
        yield c


def cached(client: TestClient, uid: int) -> bytes | None:
    return client.app.state.fastpoll._fill.get(b"/Poll/getMessages?user_id=%d" % uid)  # type: ignore[attr-defined]


def test_issued_url_is_accepted_and_fills(signed_client: TestClient) -> None:
    r = signed_client.post("/api/poll-url", json={"user_id": 42})
    assert r.status_code == 200
    doc = r.json()
    assert doc["user_id"] == 42
    assert doc["url"].startswith("/Poll/getMessages?user_id=42&exp=")
    assert time.time() + 590 < doc["expires"] <= time.time() + 600
    assert r.headers["cache-control"] == "no-store"
    for method in ("GET", "HEAD", "POST"):
        p = signed_client.request(method, doc["url"], content=b"x" if method == "POST" else None)
        assert p.status_code == 200, method
    assert cached(signed_client, 42) == b""


@pytest.mark.parametrize(
    "mangle",
    [
        lambda u: u.split("&exp=")[0],  # no signature
        lambda u: u[:-1] + ("A" if u[-1] != "A" else "B"),  # tampered sig
        lambda u: u.replace("user_id=42", "user_id=43"),  # another user
        lambda u: u.replace("user_id=42", "user_id=042"),  # another spelling, another key
        lambda u: u + "&user_id=43",  # a second user_id
        lambda u: u.replace("&exp=", "&exp=1&exp="),  # repeated exp
    ],
)
def test_bad_signature_is_403_before_db_and_cache(signed_client: TestClient, mangle) -> None:
    url = signed_client.post("/api/poll-url", json={"user_id": 42}).json()["url"]
    r = signed_client.get(mangle(url))
    assert r.status_code == 403
    assert "signature" in r.json()["error"]
    assert cached(signed_client, 42) is None and cached(signed_client, 43) is None


def test_expired_signature_is_403(signed_client: TestClient) -> None:
    secret = S32.encode()
    key = b"/Poll/getMessages?user_id=42"
    past = int(time.time()) - 1
    url = "/Poll/getMessages?user_id=42&" + signing.signed_query(secret, key, past).decode()
    assert signed_client.get(url).status_code == 403
    later = int(time.time()) + 100
    url = "/Poll/getMessages?user_id=42&" + signing.signed_query(secret, key, later).decode()
    assert signed_client.get(url).status_code == 200


def test_poll_url_rejects_bad_bodies(signed_client: TestClient) -> None:
    for body in (b"{}", b'{"user_id": "1"}', b'{"user_id": 1, "x": 2}', b"nope"):
        r = signed_client.post(
            "/api/poll-url", content=body, headers={"content-type": "application/json"}
        )
        assert r.status_code == 400, body


def test_unsigned_deployment_issues_plain_urls(client: TestClient) -> None:
    doc = client.post("/api/poll-url", json={"user_id": 7}).json()
    assert doc == {"user_id": 7, "url": "/Poll/getMessages?user_id=7", "expires": None}
    assert client.get(doc["url"]).status_code == 200

