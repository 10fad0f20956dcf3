"""The OpenAPI 3.1 document of the private write API (docs/api.md, "OpenAPI document").

Generated, not written: the request bodies' schemas are pydantic's JSON Schema of the very
models the endpoints validate with (app.py: PublishBody, BatchBody, ...), the answers' schemas
those of the models below, and the two limits that come from the config (`[app]
max_body_size`, `[channels] max`) are the running app's. The app serves it at GET
/openapi.json on its own listener, which nginx's public server does not route.

No generator from PyPI is used: those that fit Starlette (spectree, starlette-apispec) would
validate requests themselves or read YAML from docstrings, and the app's checks run in an
order of their own (the token before the body, 415, 413, duplicate keys, then the models).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from pydantic.json_schema import JsonSchemaMode, models_json_schema

from . import __version__
from . import app as _app

REF = "#/components/schemas/{model}"


# ---- the answers' shapes (app.py builds them as dicts; tests/test_openapi.py checks real
# answers against these schemas) ------------------------------------------------------------


class _Answer(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Message(_Answer):
    """A stored message of a user."""

    id: int = Field(ge=1, description="The message's id: unique, increasing, never reused.")
    user_id: int = Field(ge=0, le=_app.MAX_USER_ID)
    text: str = Field(description='The text; "" for a message published with data only.')
    data: Any = Field(None, description="The data as published: only when the message has data.")
    created: float = Field(description="When it was stored: Unix time, seconds.")
    read: bool


class ChannelMessage(_Answer):
    """A stored message of a channel."""

    id: int = Field(ge=1)
    channel: str
    text: str
    data: Any = Field(None, description="The data as published: only when the message has data.")
    created: float


class BatchResult(_Answer):
    ids: list[int] = Field(description="The stored messages' ids, in the items' order.")


class MarkReadResult(_Answer):
    user_id: int = Field(ge=0, le=_app.MAX_USER_ID)
    marked_read: int = Field(ge=0, description="How many messages this call marked read.")


class PollUrl(_Answer):
    user_id: int = Field(ge=0, le=_app.MAX_USER_ID)
    channels: list[str] = Field(
        default_factory=list,
        description="The channels the URL names, sorted (only when the request named some).",
    )
    url: str = Field(description="The signed poll path: GET it through the public edge.")
    expires: int | None = Field(
        description="Unix time after which the URL is refused (403); null when URLs are not signed."
    )


class Error(_Answer):
    error: str = Field(description="What is wrong, for a human.")


# ---- the operations ---------------------------------------------------------------------


@dataclass(frozen=True)
class Operation:
    path: str
    method: str
    operation_id: str
    summary: str
    body: type[BaseModel]
    status: int
    answer: type[BaseModel]
    description: str = ""
    idempotency_key: bool = False  # takes Idempotency-Key (and may answer 409)
    cache_publish: bool = True  # answers X-Cache-Publish
    extra: dict[int, str] = field(default_factory=dict)  # more statuses: description


OPERATIONS = [
    Operation(
        "/api/messages",
        "post",
        "publish",
        "Publish a message to a user",
        _app.PublishBody,
        201,
        Message,
        "201 means durable (committed); the user's poll key was rewritten before the answer "
        "(X-Cache-Publish: ok) or the outbox will rewrite it (pending).",
        idempotency_key=True,
    ),
    Operation(
        "/api/messages/batch",
        "post",
        "publish_batch",
        "Publish many messages (users and channels) in one transaction",
        _app.BatchBody,
        201,
        BatchResult,
        "Each item names exactly one of user_id and channel. No Idempotency-Key: after a "
        "broken connection, read the owners' answers before sending it again.",
    ),
    Operation(
        "/api/channels/{name}/messages",
        "post",
        "publish_channel",
        "Publish a message to a channel (room)",
        _app.ChannelPublishBody,
        201,
        ChannelMessage,
        idempotency_key=True,
        extra={404: "The path names no channel (a name holding '/')."},
    ),
    Operation(
        "/api/messages/read",
        "post",
        "mark_read",
        "Mark a user's messages read, up to the newest id the client has shown",
        _app.ReadBody,
        200,
        MarkReadResult,
    ),
    Operation(
        "/api/poll-url",
        "post",
        "poll_url",
        "A user's signed, expiring poll URL (optionally with channels)",
        _app.PollUrlBody,
        200,
        PollUrl,
        "Answered with Cache-Control: no-store.",
        cache_publish=False,
    ),
]

CHANNEL_NAME = {"type": "string", "pattern": _app.CHANNEL_NAME_PATTERN}


def _error(description: str, headers: dict[str, Any] | None = None) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "description": description,
        "content": {"application/json": {"schema": {"$ref": REF.format(model="Error")}}},
    }
    if headers:
        doc["headers"] = headers
    return doc


def _header(ref: str) -> dict[str, str]:
    return {"$ref": f"#/components/headers/{ref}"}


def _operation(op: Operation) -> dict[str, Any]:
    headers: dict[str, Any] = {}
    if op.cache_publish:
        headers["X-Cache-Publish"] = _header("X-Cache-Publish")
    if op.idempotency_key:
        headers["Idempotent-Replayed"] = _header("Idempotent-Replayed")
    if op.operation_id == "poll_url":
        headers["Cache-Control"] = {"schema": {"type": "string", "const": "no-store"}}
    ok: dict[str, Any] = {
        "description": "Done." if op.status == 200 else "Stored.",
        "content": {"application/json": {"schema": {"$ref": REF.format(model=op.answer.__name__)}}},
    }
    if headers:
        ok["headers"] = headers
    responses: dict[str, Any] = {str(op.status): ok}
    for status in (400, 401, 413, 415):
        responses[str(status)] = {"$ref": f"#/components/responses/{status}"}
    if op.idempotency_key:
        responses["409"] = _error(
            "The Idempotency-Key was used for another message's text or data."
        )
    for status, text in op.extra.items():
        responses[str(status)] = _error(text)
    responses["503"] = {"$ref": "#/components/responses/503"}
    doc: dict[str, Any] = {
        "operationId": op.operation_id,
        "summary": op.summary,
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {"schema": {"$ref": REF.format(model=op.body.__name__)}}
            },
        },
        "responses": dict(sorted(responses.items())),
    }
    if op.description:
        doc["description"] = op.description
    params: list[dict[str, Any]] = []
    if "{name}" in op.path:
        params.append({"name": "name", "in": "path", "required": True, "schema": CHANNEL_NAME})
    if op.idempotency_key:
        params.append({"$ref": "#/components/parameters/Idempotency-Key"})
    if params:
        doc["parameters"] = params
    return doc


def _schemas(channels_max: int) -> dict[str, Any]:
    models: list[tuple[type[BaseModel], JsonSchemaMode]] = [
        (op.body, "validation") for op in OPERATIONS
    ]
    answers: list[type[BaseModel]] = [*{op.answer for op in OPERATIONS}, Error]
    models += [(m, "serialization") for m in answers]
    _, top = models_json_schema(sorted(models, key=lambda m: m[0].__name__), ref_template=REF)
    schemas: dict[str, Any] = top["$defs"]
    # A payload's text or data (app._Payload): an absent text is "", which its string schema
    # (1 to MAX_TEXT_CHARS characters) does not take, so no default is documented.
    for name in ("PublishBody", "ChannelPublishBody", "BatchItem"):
        del schemas[name]["properties"]["text"]["default"]
        schemas[name].setdefault("anyOf", [{"required": ["text"]}, {"required": ["data"]}])
    # The running app's bound on a poll URL's channels (app.py checks it, not the model).
    channels = schemas["PollUrlBody"]["properties"]["channels"]
    for alt in channels["anyOf"]:
        if alt.get("type") == "array":
            alt |= {"minItems": 1, "maxItems": channels_max, "uniqueItems": True}
    return dict(sorted(schemas.items()))


def document(max_body_size: int, channels_max: int) -> dict[str, Any]:
    """The document, for an app with these limits."""
    error = {"$ref": REF.format(model="Error")}
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "fastpoll private write API",
            "version": __version__,
            "summary": "Publish messages, mark them read and hand out signed poll URLs.",
            "description": "For the site's own backend, on the app's own listener (nginx's "
            "public server does not route /api/). Every request is JSON "
            "(Content-Type: application/json) of at most [app] max_body_size bytes "
            f"({max_body_size} here), checked in this order: the bearer token (401), "
            "the Content-Type (415), the size (413), the JSON and its fields (400: "
            "strict types, no unknown field, no duplicate key). A 503 carries "
            "Retry-After; retry a publish with the same Idempotency-Key.",
            "license": {"name": "Apache-2.0", "identifier": "Apache-2.0"},
        },
        "security": [{"bearer": []}],
        "paths": {op.path: {op.method: _operation(op)} for op in OPERATIONS},
        "components": {
            "schemas": _schemas(channels_max),
            "securitySchemes": {
                "bearer": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "The first line of [app] api_token_file.",
                }
            },
            "parameters": {
                "Idempotency-Key": {
                    "name": "Idempotency-Key",
                    "in": "header",
                    "required": False,
                    "description": "One per message: a retry with the same key, text and data "
                    "is answered with the stored message (Idempotent-Replayed: true) and stores "
                    "nothing; the same key with another text or data is 409.",
                    "schema": {"type": "string", "pattern": f"^{_app.IDEM_KEY_PATTERN}$"},
                }
            },
            "headers": {
                "X-Cache-Publish": {
                    "description": "ok: the poll key was rewritten; pending: the outbox will "
                    "(absent on a replay).",
                    "schema": {"type": "string", "enum": ["ok", "pending"]},
                },
                "Idempotent-Replayed": {
                    "description": "true: an earlier request with this Idempotency-Key "
                    "stored the message; nothing was stored now.",
                    "schema": {"type": "string", "const": "true"},
                },
                "Retry-After": {
                    "description": "Seconds to wait before trying again.",
                    "schema": {"type": "integer", "minimum": 0},
                },
                "WWW-Authenticate": {"schema": {"type": "string", "const": "Bearer"}},
            },
            "responses": {
                "400": _error("The JSON or a field is refused; nothing is stored."),
                "401": _error(
                    "Missing or invalid bearer token.",
                    {"WWW-Authenticate": _header("WWW-Authenticate")},
                ),
                "413": _error(f"The body is larger than {max_body_size} bytes."),
                "415": _error("The Content-Type is not application/json."),
                "503": {
                    "description": "The database is unavailable or refuses writes, or this "
                    "user's (channel's) order stayed taken: try again after Retry-After.",
                    "headers": {"Retry-After": _header("Retry-After")},
                    "content": {"application/json": {"schema": error}},
                },
            },
        },
    }


@lru_cache(maxsize=4)
def document_bytes(max_body_size: int, channels_max: int) -> bytes:
    return json.dumps(document(max_body_size, channels_max), indent=1).encode()
