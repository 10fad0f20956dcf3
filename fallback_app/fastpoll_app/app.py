"""The ASGI application (Starlette): poll fallback and the messages API.

Handlers are async only to read bodies; every database/cache call goes through
run_in_threadpool so the event loop never blocks on them. Request bodies are checked by
pydantic models (strict: no coercion, no unknown fields); json's object_pairs_hook refuses
duplicate keys, which json.loads would silently resolve to the last one.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Annotated, Any, TypeVar
from urllib.parse import parse_qsl

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, model_validator
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from . import __version__, channels, conditional, config, eventstream, history, metrics, signing
from .announce import make_announcer
from .cache import RateLimitedLog, make_cache
from .channels import Listed, message_doc
from .config import Settings
from .service import POLL_PATH, FastPoll
from .store import (
    IdempotencyConflict,
    Message,
    Store,
    StoreError,
    Unavailable,
    UserBusy,
    WritesRefused,
    open_store,
)

log = logging.getLogger(__name__)

MOUNT = b"/Poll"
MAX_TEXT_CHARS = config.MAX_TEXT_CHARS  # a room's size is bounded by it (config.channel_value_max)
MAX_DATA_BYTES = config.MAX_DATA_BYTES  # and by this: a message's data, its compact JSON's bytes
MAX_USER_ID = 2**63 - 1
MAX_BATCH = 1000
# The app's publish must reach the cache even when the poll server's read
# timeout is tight: a failed publish leaves a possibly stale answer behind
# until the repair thread rewrites it.
MIN_PUBLISH_TIMEOUT_MS = 1000

_DIGITS = re.compile(r"[0-9]{1,19}")
# Printable ASCII, no spaces: what a client can put in a header without escaping.
IDEM_KEY_PATTERN = r"[\x21-\x7e]{1,128}"
_IDEM_KEY = re.compile(IDEM_KEY_PATTERN)
_JSON_TYPE = re.compile(r"application/json\s*(;.*)?", re.IGNORECASE)

UserId = Annotated[int, Field(ge=0, le=MAX_USER_ID)]


class _Body(BaseModel):
    # strict: true is not a user id, nor "42" or 42.0; forbid: an unknown field is an error.
    model_config = ConfigDict(strict=True, extra="forbid")


def _check_text(v: str) -> str:
    if not v.strip():
        raise ValueError("must not be only whitespace")
    if "\x00" in v:  # PostgreSQL's text cannot hold it (a 500 there, stored on SQLite)
        raise ValueError("must not contain NUL (U+0000)")
    try:
        v.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("is not valid Unicode (lone surrogate)") from None
    return v


def _check_data(v: Any) -> Any:
    try:
        size = len(channels.encode_data(v).encode("utf-8"))
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None
    except ValueError:
        raise ValueError("must be JSON: no NaN or infinity, no lone surrogate") from None
    if size > MAX_DATA_BYTES:
        raise ValueError(f"is {size} bytes as compact JSON, over {MAX_DATA_BYTES}")
    return v


def data_of(value: Any) -> str | None:
    """A request's data as stored (channels.encode_data); None without data (absent or null)."""
    return None if value is None else channels.encode_data(value)


def _check_channel(v: str) -> str:
    if not channels.valid_name(v.encode("utf-8", "replace")):
        raise ValueError(channels.NAME_RULE)
    return v


# The checks above as JSON Schema patterns, for the OpenAPI document (openapi.py): not only
# whitespace (str.isspace's characters) and no NUL; a channel name's bytes.
_TEXT_PATTERN = (
    r"^[^\u0000]*[^\u0000\t-\r\u001c-\u0020\u0085\u00a0\u1680\u2000-\u200a\u2028\u2029"
    r"\u202f\u205f\u3000][^\u0000]*$"
)
CHANNEL_NAME_PATTERN = r"^[A-Za-z0-9_.-]{1,64}$"
Text = Annotated[
    str,
    Field(min_length=1, max_length=MAX_TEXT_CHARS, json_schema_extra={"pattern": _TEXT_PATTERN}),
    AfterValidator(_check_text),
]
# Any JSON value; null is the same as no data.
Data = Annotated[
    Any,
    Field(
        description=f"Any JSON value, at most {MAX_DATA_BYTES} bytes as compact JSON; listed as "
        "`data` in every answer that lists the message (null: no data).",
    ),
    AfterValidator(_check_data),
]
ChannelName = Annotated[
    str, Field(json_schema_extra={"pattern": CHANNEL_NAME_PATTERN}), AfterValidator(_check_channel)
]


class _Payload(_Body):
    """A message's payload: text, data, or both ("" is the text of a message of data only)."""

    text: Text = ""  # absent: "" (a default is not validated); given, checked as ever
    data: Data = None

    @model_validator(mode="after")
    def _text_or_data(self) -> _Payload:
        if not self.text and self.data is None:
            raise ValueError("a message has text, data or both")
        return self


class PublishBody(_Payload):
    user_id: UserId


class ChannelPublishBody(_Payload):
    pass


class BatchItem(_Payload):
    # _one_target, as JSON Schema: exactly one of them is given (and not null).
    model_config = ConfigDict(
        json_schema_extra={
            "oneOf": [
                {"required": ["user_id"], "properties": {"user_id": {"type": "integer"}}},
                {"required": ["channel"], "properties": {"channel": {"type": "string"}}},
            ]
        }
    )
    user_id: UserId | None = None
    channel: ChannelName | None = None

    @model_validator(mode="after")
    def _one_target(self) -> BatchItem:
        if (self.user_id is None) == (self.channel is None):
            raise ValueError("an item names exactly one of user_id and channel")
        return self


class BatchBody(_Body):
    items: Annotated[list[BatchItem], Field(min_length=1, max_length=MAX_BATCH)]


class ReadBody(_Body):
    user_id: UserId
    # Required: a message published after the client's last poll must not be marked read
    # unseen, so the client names the newest id it has shown.
    up_to_id: Annotated[int, Field(ge=0, le=MAX_USER_ID)]


class PollUrlBody(_Body):
    user_id: UserId
    channels: list[ChannelName] | None = None


B = TypeVar("B", bound=_Body)
T = TypeVar("T")


class _DuplicateKey(ValueError):
    pass


def _no_duplicates(pairs: list[tuple[str, object]]) -> dict[str, object]:
    doc: dict[str, object] = {}
    for k, v in pairs:
        if k in doc:
            raise _DuplicateKey(k)
        doc[k] = v
    return doc


def _error(status: int, message: str) -> HTTPException:
    return HTTPException(status_code=status, detail=message)


def _user_id_from_query(query: bytes) -> int:
    """The single user_id of a poll; same splitting rules as the key scheme."""
    pairs = parse_qsl(query.decode("latin-1"), keep_blank_values=True, encoding="latin-1")
    values = [v for n, v in pairs if n == "user_id"]
    if len(values) != 1:
        raise _error(400, "user_id must be given exactly once")
    return _check_user_id_text(values[0])


def _check_user_id_text(v: str) -> int:
    if not _DIGITS.fullmatch(v) or int(v) > MAX_USER_ID:
        raise _error(400, "user_id must be a non-negative integer")
    return int(v)


async def _read_body(request: Request, limit: int) -> bytes:
    """The request body, at most `limit` bytes (413 beyond, checked twice)."""
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.isdigit():
            raise _error(400, "invalid Content-Length")
        if int(declared) > limit:
            raise _error(413, f"body larger than {limit} bytes")
    buf = bytearray()
    async for chunk in request.stream():
        buf += chunk
        if len(buf) > limit:
            raise _error(413, f"body larger than {limit} bytes")
    return bytes(buf)


def _parse(body: bytes, model: type[B]) -> B:
    """The body as `model`, or a 400 that says what is wrong."""
    try:
        doc = json.loads(body.decode("utf-8"), object_pairs_hook=_no_duplicates)
    except _DuplicateKey as exc:
        raise _error(400, f"duplicate key '{exc}' in the JSON object") from None
    except RecursionError:
        raise _error(400, "JSON nested too deeply") from None
    except (UnicodeDecodeError, ValueError):
        raise _error(400, "body must be a JSON object (UTF-8)") from None
    if not isinstance(doc, dict):
        raise _error(400, "body must be a JSON object")
    try:
        return model.model_validate(doc)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        where = ".".join(str(p) for p in first["loc"]) or "body"
        raise _error(400, f"{where}: {first['msg']}") from None
    except RecursionError:
        raise _error(400, "JSON nested too deeply") from None


def _check_json_type(request: Request) -> None:
    ctype = request.headers.get("content-type", "")
    if not _JSON_TYPE.fullmatch(ctype.strip()):
        raise _error(415, "Content-Type must be application/json")


@dataclass(frozen=True)
class _Context:
    """What the endpoints share, built once per worker by create_app (app.state.ctx)."""

    settings: Settings
    store: Store
    fp: FastPoll
    api_token: str | None
    secrets: list[bytes]  # signing secrets, newest first; empty: URLs are not signed
    warn: RateLimitedLog

    @property
    def limit(self) -> int:
        return self.settings.app.max_body_size


def _ctx(request: Request) -> _Context:
    ctx: _Context = request.app.state.ctx
    return ctx


async def poll(request: Request) -> Response:
    ctx = _ctx(request)
    fp, pacing = ctx.fp, ctx.settings.poll
    scope = request.scope
    query: bytes = scope.get("query_string", b"")
    # The key comes from the raw target, as the poll server sees it after
    # nginx strips /Poll; without a raw path we answer but do not fill.
    key = None
    raw_path: bytes | None = scope.get("raw_path")
    if raw_path is not None and raw_path.startswith(MOUNT + b"/"):
        target = raw_path[len(MOUNT) :] + (b"?" + query if query else b"")
        key = fp.derive(target)
    try:
        # Before the signature: a bad `ch` is the client's error whoever signed it, and the
        # poll server refuses it the same way (docs/channels.md).
        chans = channels.parse_ch(query, ctx.settings.channels.max)
    except channels.BadChannels as exc:
        raise _error(400, str(exc)) from None
    if ctx.secrets:
        # First, before the database, the cache or the body: the signature must
        # cover this request's key (and its channels), and that key must be the user's own.
        signed = None if key is None else channels.signed_key(key, chans and chans[0])
        if not signing.verify(ctx.secrets, signed, query, time.time()):
            raise _error(403, "missing, invalid or expired signature")
        if key != fp.user_key(_user_id_from_query(query)):
            raise _error(403, "the signature is not for this user's poll URL")
    user_id = _user_id_from_query(query)
    if history.is_history(query):
        return await _history_read(request, ctx, user_id, query, chans and chans[1])
    try:
        # Checked, and read for the pace only: the app answers at once (docs/api.md: only the poll
        # server holds polls; a held poll here would keep a worker thread and a database
        # connection, and fill nginx's fallback cap, exactly when the app is the fallback).
        wait_s = conditional.wait_seconds(query, pacing)
    except conditional.BadWait as exc:
        raise _error(400, str(exc)) from None
    headers = {"X-Poll-Source": "app", "Content-Type": ctx.settings.cache.content_type}
    if request.method == "POST":
        body = await _read_body(request, ctx.limit)
        headers["X-Request-Body-Length"] = str(len(body))
        headers["X-Request-Body-SHA256"] = hashlib.sha256(body).hexdigest()
    if chans is None:
        answer, filled = await run_in_threadpool(fp.poll_filled, user_id, key)
    else:
        answer, filled = await run_in_threadpool(fp.poll_channels_filled, user_id, key, chans[1])
    headers["ETag"] = etag = conditional.etag_of(answer)
    # A miss the app filled is paced as a hit; when the cache could not answer, later.
    headers["Poll-Interval-Ms"] = str(conditional.app_pace_ms(pacing, filled, wait_s))
    accept = (v for n, v in scope["headers"] if n == b"accept")
    if request.method == "GET" and eventstream.wants_stream(accept):
        # Paced as a long poll: a miss the app filled is streamed by the poll server at once.
        retry_ms = conditional.app_pace_ms(pacing, filled, max(wait_s, 1))
        seen = conditional.not_modified(
            (v for n, v in scope["headers"] if n in (b"if-none-match", b"last-event-id")), etag
        )
        metrics.STREAM_ANSWERS.inc()
        headers.update(
            {
                "Content-Type": eventstream.MEDIA_TYPE,
                "Cache-Control": "no-store",
                "X-Accel-Buffering": "no",
            }
        )
        headers["Poll-Interval-Ms"] = str(retry_ms)
        return Response(eventstream.short_stream(answer, etag, retry_ms, seen), headers=headers)
    # Conditional polls are GET and HEAD (RFC 9110 13.1.2 would have a POST answered 412;
    # a POST poll is a read, so its precondition is not evaluated: always the full answer).
    if request.method != "POST" and conditional.not_modified(
        (v for n, v in scope["headers"] if n == b"if-none-match"), etag
    ):
        metrics.NOT_MODIFIED.inc()
        del headers["Content-Type"]
        return Response(status_code=304, headers=headers)
    if request.method == "HEAD":
        headers["Content-Length"] = str(len(answer))
        return Response(b"", headers=headers)
    return Response(answer, headers=headers)


async def _history_read(
    request: Request, ctx: _Context, user_id: int, query: bytes, names: list[bytes] | None
) -> Response:
    """The history read (docs/api.md, "The history read"): after the poll's checks (ch, the
    signature, user_id), the user's or one of the URL's channels' unread messages after
    `after`, from the database; never cached."""
    try:
        read = history.parse(query, names)
    except history.BadHistory as exc:
        raise _error(400, str(exc)) from None
    fp = ctx.fp

    def run() -> bytes:
        owner = user_id if read.of is None else fp.channel_owner(read.of.decode("ascii"))
        return fp.history(owner, read.after, read.limit)

    body = await run_in_threadpool(run)
    headers = {"Cache-Control": "no-store", "Content-Type": "application/json"}
    if request.method == "HEAD":
        headers["Content-Length"] = str(len(body))
        return Response(b"", headers=headers)
    return Response(body, headers=headers)


async def _api_body(request: Request, model: type[B]) -> B:
    """The write API's checks, in order: the bearer token (before the body is read),
    the Content-Type, the size, the JSON, the fields."""
    ctx = _ctx(request)
    if ctx.api_token is not None:
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not config.token_matches(ctx.api_token, given.strip()):
            raise HTTPException(
                401, "missing or invalid bearer token", {"WWW-Authenticate": "Bearer"}
            )
    _check_json_type(request)
    return _parse(await _read_body(request, ctx.limit), model)


async def post_message(request: Request) -> Response:
    body = await _api_body(request, PublishBody)
    idem_key = _idem_key(request)
    fp = _ctx(request).fp
    msg, headers = await _publish(fp.publish, body.user_id, body, idem_key)
    return JSONResponse(msg.as_json(), status_code=201, headers=headers)


def _idem_key(request: Request) -> str | None:
    idem_key = request.headers.get("idempotency-key")
    if idem_key is not None and not _IDEM_KEY.fullmatch(idem_key):
        raise _error(400, "Idempotency-Key must be 1-128 printable ASCII characters")
    return idem_key


async def _publish(
    op: Callable[[T, str, str | None, str | None], tuple[Message, bool | None]],
    target: T,
    body: _Payload,
    idem_key: str | None,
) -> tuple[Message, dict[str, str]]:
    text, data = body.text, data_of(body.data)
    try:
        msg, written = await run_in_threadpool(op, target, text, idem_key, data)
    except IdempotencyConflict:
        raise _error(409, "Idempotency-Key already used for another message") from None
    if written is None:
        return msg, {"Idempotent-Replayed": "true"}
    return msg, {"X-Cache-Publish": "ok" if written else "pending"}


async def post_channel_message(request: Request) -> Response:
    name = request.path_params["name"]
    if not channels.valid_name(name.encode("utf-8", "replace")):
        raise _error(400, channels.NAME_RULE)
    body = await _api_body(request, ChannelPublishBody)
    fp = _ctx(request).fp
    msg, headers = await _publish(fp.publish_channel, name, body, _idem_key(request))
    doc = {"id": msg.id, "channel": name} | message_doc((msg.id, msg.text, msg.data))
    doc["created"] = msg.created
    return JSONResponse(doc, status_code=201, headers=headers)


async def post_batch(request: Request) -> Response:
    body = await _api_body(request, BatchBody)
    fp = _ctx(request).fp

    def run() -> tuple[list[Message], bool]:
        owners = {n: fp.channel_owner(n) for n in {i.channel for i in body.items if i.channel}}
        items: list[Listed] = [
            (owners[i.channel] if i.channel else i.user_id or 0, i.text, data_of(i.data))
            for i in body.items
        ]
        return fp.publish_batch(items)

    msgs, written = await run_in_threadpool(run)
    return JSONResponse(
        {"ids": [m.id for m in msgs]},
        status_code=201,
        headers={"X-Cache-Publish": "ok" if written else "pending"},
    )


async def mark_read(request: Request) -> Response:
    body = await _api_body(request, ReadBody)
    fp = _ctx(request).fp
    count, written = await run_in_threadpool(fp.mark_read, body.user_id, body.up_to_id)
    return JSONResponse(
        {"user_id": body.user_id, "marked_read": count},
        headers={"X-Cache-Publish": "ok" if written else "pending"},
    )


async def poll_url(request: Request) -> Response:
    # The seam where the site's backend, which authenticated the user, asks for that
    # user's URL; with [app] api_token_file only that backend can call it.
    body = await _api_body(request, PollUrlBody)
    user_id = body.user_id
    ctx = _ctx(request)
    path = MOUNT + POLL_PATH + b"?user_id=%d" % user_id
    signed = ctx.fp.user_key(user_id)
    doc: dict[str, object] = {"user_id": user_id}
    if body.channels is not None:
        names = sorted(n.encode("ascii") for n in body.channels)
        if len(set(names)) != len(names):
            raise _error(400, "channels: a channel is named twice")
        if not 1 <= len(names) <= ctx.settings.channels.max:
            raise _error(400, f"channels: 1 to {ctx.settings.channels.max} channels")
        ch = b",".join(names)
        path += b"&ch=" + ch
        signed = channels.signed_key(signed, ch)
        doc["channels"] = [n.decode() for n in names]
    exp = int(time.time()) + ctx.settings.signing.ttl
    if ctx.secrets:
        path += b"&" + signing.signed_query(ctx.secrets[0], signed, exp)
    doc |= {"url": path.decode(), "expires": exp if ctx.secrets else None}
    return JSONResponse(doc, headers={"Cache-Control": "no-store"})


async def openapi_json(request: Request) -> Response:
    # The write API's OpenAPI document, with this app's limits (openapi.py imports this module).
    from . import openapi

    settings = _ctx(request).settings
    doc = openapi.document_bytes(settings.app.max_body_size, settings.channels.max)
    return Response(doc, media_type="application/json")


async def healthz(request: Request) -> Response:
    # Asks the database each time: an app that cannot reach it, or whose database refuses
    # writes (WritesRefused), is not healthy.
    ctx = _ctx(request)
    try:
        await run_in_threadpool(ctx.store.ping)
    except StoreError as exc:
        ctx.warn.warning("healthz", f"/healthz: database unavailable: {exc}")
        return JSONResponse(
            {"status": "database unavailable", "config_sha256": ctx.settings.sha256},
            status_code=503,
        )
    return JSONResponse({"status": "ok", "config_sha256": ctx.settings.sha256})


async def metrics_page(request: Request) -> Response:
    # Not through nginx (its public server answers 404 for /metrics): scraped directly.
    body, content_type = await run_in_threadpool(metrics.render)
    return Response(body, headers={"Content-Type": content_type})


async def http_error(request: Request, exc: Exception) -> Response:
    if not isinstance(exc, HTTPException):
        return await server_error(request, exc)
    return JSONResponse({"error": exc.detail}, status_code=exc.status_code, headers=exc.headers)


async def unavailable(request: Request, exc: Exception) -> Response:
    # 503 and when to try again: the database is down or restarting, every connection is
    # busy, or this user's order stayed taken (UserBusy). A retry with the same
    # Idempotency-Key is safe.
    _ctx(request).warn.warning(
        type(exc).__name__, f"503 on {request.method} {request.url.path}: {exc}"
    )
    if isinstance(exc, UserBusy):
        what = "this user's messages are busy, try again"
    elif isinstance(exc, WritesRefused):
        what = "the database refuses writes now (read-only), try again"
    else:
        what = "the database is unavailable, try again"
    return JSONResponse({"error": what}, status_code=503, headers={"Retry-After": "1"})


async def server_error(request: Request, exc: Exception) -> Response:
    log.error("unhandled error on %s %s: %r", request.method, request.url.path, exc)
    return JSONResponse({"error": "internal error"}, status_code=500)


@asynccontextmanager
async def lifespan(app: Starlette) -> AsyncIterator[None]:
    ctx: _Context = app.state.ctx
    settings = ctx.settings
    where = (
        " ".join(settings.memcached.servers)
        if settings.cache.backend == "memcached"
        else settings.redis.server
    )
    log.info(
        "fastpoll_app %s: database %s (%s), cache %s %s, ttl %ss, config %s",
        __version__,
        settings.app.database,
        ctx.store.kind,
        settings.cache.backend,
        where,
        settings.cache.ttl,
        settings.source,
    )
    metrics.started()
    ctx.fp.start()
    try:
        yield
    finally:
        await run_in_threadpool(ctx.fp.close)


ROUTES = [
    Route("/Poll/getMessages", poll, methods=["GET", "HEAD", "POST"]),
    Route("/api/messages", post_message, methods=["POST"]),
    Route("/api/messages/read", mark_read, methods=["POST"]),
    Route("/api/messages/batch", post_batch, methods=["POST"]),
    Route("/api/channels/{name}/messages", post_channel_message, methods=["POST"]),
    Route("/api/poll-url", poll_url, methods=["POST"]),
    Route("/openapi.json", openapi_json, methods=["GET"]),
    Route("/healthz", healthz, methods=["GET", "HEAD"]),
    Route("/metrics", metrics_page, methods=["GET"]),
]


def create_app(settings: Settings | None = None) -> Starlette:
    """Build the app; without settings, read the file named by $FASTPOLL_CONFIG. Only the
    wiring: the store, the caches and the service, shared with the endpoints as app.state.ctx."""
    if settings is None:
        settings = config.load()
    store = open_store(settings.app, history=settings.channels.history)
    metrics.set_config_sha256(settings.sha256)
    api_token = config.read_api_token(settings.app)
    if api_token is None:
        log.warning(
            "THE WRITE API IS OPEN: no [app] api_token_file, anyone who reaches this listener "
            "can publish and mark read (%s)",
            "open_api = true" if settings.app.open_api else "the command line refuses this",
        )
    timeout = settings.cache.timeout_ms
    fp = FastPoll(
        settings,
        store,
        fill_cache=make_cache(settings),
        publish_cache=make_cache(settings, max(timeout, MIN_PUBLISH_TIMEOUT_MS)),
        announcer=make_announcer(settings),
    )
    # Signed poll URLs (docs/security.md): without a secret file they are not checked.
    secrets = (
        signing.load_secrets(settings.signing.secret_file) if settings.signing.secret_file else []
    )
    app = Starlette(
        routes=ROUTES,
        middleware=[Middleware(metrics.MetricsMiddleware)],
        exception_handlers={
            HTTPException: http_error,
            Unavailable: unavailable,
            500: server_error,
        },
        lifespan=lifespan,
    )
    # No redirect from /Poll/getMessages/ to the slashless path: Starlette's would answer 307
    # with a Location built from the request's Host, before any signature check. A path that
    # is not a route is 404.
    app.router.redirect_slashes = False
    app.state.ctx = _Context(settings, store, fp, api_token, secrets, RateLimitedLog(log))
    app.state.fastpoll = fp
    return app
