"""The write API's OpenAPI document (fastpoll_app/openapi.py): a valid OpenAPI 3.1 document,
served at GET /openapi.json, naming exactly the routes the app has under /api, with this app's
limits, and describing the answers the app really gives (each checked against its schema)."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from openapi_schema_validator import OAS31Validator
from openapi_spec_validator import validate
from starlette.routing import Route
from starlette.testclient import TestClient

from fastpoll_app import app as app_module
from fastpoll_app.app import create_app
from fastpoll_testkit.procs import Server

from .conftest import make_settings

TOKEN = "o" * 20 + "0123456789abcdef"
AUTH = {"Authorization": f"Bearer {TOKEN}", "content-type": "application/json"}


@pytest.fixture
def api(memcached: Server, tmp_path: Path) -> Iterator[TestClient]:
    token = tmp_path / "api.token"
    token.write_text(TOKEN + "\n")
    token.chmod(0o640)
    settings = make_settings(
        tmp_path,
        f"[cache]\nbackend = memcached\n[memcached]\nservers = {memcached.addr}\n"
        "[channels]\nmax = 3\n",
        f"database = {tmp_path / 'messages.db'}\nmax_body_size = 4096\n",
    )
    settings = dataclasses.replace(
        settings, app=dataclasses.replace(settings.app, api_token_file=str(token))
    )
    with TestClient(create_app(settings)) as c:
        yield c


@pytest.fixture
def doc(api: TestClient) -> dict[str, Any]:
    r = api.get("/openapi.json")  # no token: documentation, on the private listener only
    assert r.status_code == 200
    assert r.headers["content-type"] == "application/json"
    body: dict[str, Any] = r.json()
    return body


def test_document_is_valid_openapi_3_1(doc: dict[str, Any]) -> None:
    assert doc["openapi"].startswith("3.1.")
    validate(doc)  # raises on any violation of the OpenAPI 3.1 schema and its rules
    assert doc["components"]["securitySchemes"]["bearer"] == {
        "type": "http",
        "scheme": "bearer",
        "description": "The first line of [app] api_token_file.",
    }
    assert doc["security"] == [{"bearer": []}]


def test_every_api_route_is_documented_and_nothing_else() -> None:
    routed = {
        (r.path, m.lower())
        for r in app_module.ROUTES
        if isinstance(r, Route) and r.path.startswith("/api/")
        for m in r.methods or ()
        if m != "HEAD"
    }
    from fastpoll_app import openapi

    paths = openapi.document(65536, 16)["paths"]
    documented = {(p, m) for p, ops in paths.items() for m in ops}
    assert routed == documented
    assert len(routed) == 5


def test_the_documents_limits_are_this_apps(doc: dict[str, Any]) -> None:
    schemas = doc["components"]["schemas"]
    (array,) = [
        a for a in schemas["PollUrlBody"]["properties"]["channels"]["anyOf"] if "items" in a
    ]
    assert array["maxItems"] == 3
    assert "4096 bytes" in doc["components"]["responses"]["413"]["description"]
    assert schemas["BatchBody"]["properties"]["items"]["maxItems"] == app_module.MAX_BATCH
    text = schemas["PublishBody"]["properties"]["text"]
    assert text["maxLength"] == app_module.MAX_TEXT_CHARS


def test_the_text_pattern_is_the_apps_check(doc: dict[str, Any]) -> None:
    """The JSON Schema pattern of `text` refuses exactly what _check_text refuses (but for lone
    surrogates, which no JSON Schema pattern can name), on every code point alone and beside
    a letter."""
    pattern = doc["components"]["schemas"]["PublishBody"]["properties"]["text"]["pattern"]
    check = OAS31Validator({"type": "string", "pattern": pattern})
    for cp in [*range(0, 0xD800), *range(0xE000, 0x110000, 7)]:
        c = chr(cp)
        for text in (c, c + " " + c, "a" + c):
            ok = bool(text.strip()) and "\x00" not in text
            assert check.is_valid(text) == ok, (hex(cp), text)


def _schema(doc: dict[str, Any], ref: dict[str, str]) -> OAS31Validator:
    # The document as the root, so that its #/components/... references resolve.
    return OAS31Validator({**doc, "$ref": ref["$ref"]})


def _check(doc: dict[str, Any], path: str, r: httpx.Response) -> None:
    """The answer's status is documented for the operation, its body matches that status's
    schema and its documented headers are there."""
    (op,) = doc["paths"][path].values()
    assert str(r.status_code) in op["responses"], (path, r.status_code, r.text)
    resp = op["responses"][str(r.status_code)]
    if "$ref" in resp:
        resp = doc["components"]["responses"][resp["$ref"].rsplit("/", 1)[1]]
    _schema(doc, resp["content"]["application/json"]["schema"]).validate(r.json())
    for name in resp.get("headers", {}):
        if name not in ("X-Cache-Publish", "Idempotent-Replayed"):  # one or the other
            assert name.lower() in r.headers, (path, r.status_code, name)


def test_real_answers_match_the_document(api: TestClient, doc: dict[str, Any]) -> None:
    def post(path: str, body: object, **headers: str) -> httpx.Response:
        r = api.post(path, json=body, headers={**AUTH, **headers})
        _check(doc, re.sub(r"/channels/[^/]+/", "/channels/{name}/", path), r)
        return r

    m = post("/api/messages", {"user_id": 7, "text": "hi"}, **{"Idempotency-Key": "k1"})
    assert m.status_code == 201 and m.headers["x-cache-publish"] == "ok"
    assert (
        post("/api/messages", {"user_id": 7, "text": "hi"}, **{"Idempotency-Key": "k1"}).headers[
            "idempotent-replayed"
        ]
        == "true"
    )
    assert (
        post("/api/messages", {"user_id": 7, "text": "ho"}, **{"Idempotency-Key": "k1"}).status_code
        == 409
    )
    assert post("/api/messages", {"user_id": 7, "text": " "}).status_code == 400
    assert post("/api/channels/room.a/messages", {"text": "all"}).status_code == 201
    assert post("/api/channels/bad!/messages", {"text": "all"}).status_code == 400
    assert post("/api/messages", {"user_id": 7, "data": {"k": [1]}}).json()["data"] == {"k": [1]}
    assert post("/api/channels/room.a/messages", {"data": 2}).json()["data"] == 2
    assert post("/api/messages", {"user_id": 7}).status_code == 400  # neither text nor data
    batch = post(
        "/api/messages/batch",
        {"items": [{"user_id": 7, "text": "x"}, {"channel": "room.a", "text": "y"}]},
    )
    assert batch.status_code == 201 and len(batch.json()["ids"]) == 2
    batch = post(
        "/api/messages/batch", {"items": [{"user_id": 7, "channel": "room.a", "text": "y"}]}
    )
    assert batch.status_code == 400
    read = post("/api/messages/read", {"user_id": 7, "up_to_id": m.json()["id"]})
    assert read.status_code == 200 and read.json()["marked_read"] == 1
    url = post("/api/poll-url", {"user_id": 7, "channels": ["room.a"]})
    assert url.status_code == 200 and url.json()["channels"] == ["room.a"]
    assert url.headers["cache-control"] == "no-store"
    assert post("/api/poll-url", {"user_id": 7}).json()["expires"] is None
    assert (
        post("/api/poll-url", {"user_id": 7, "channels": ["a", "b", "c", "d"]}).status_code == 400
    )

    for path in doc["paths"]:
        real = path.replace("{name}", "room.a")
        r = api.post(real, json={}, headers={"content-type": "application/json"})
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
        _check(doc, path, r)
        r = api.post(real, content=b"{}", headers={**AUTH, "content-type": "text/plain"})
        assert r.status_code == 415
        _check(doc, path, r)
        r = api.post(real, content=b"[" * 5000, headers=AUTH)
        assert r.status_code == 413
        _check(doc, path, r)
