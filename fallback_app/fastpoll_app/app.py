"""The ASGI application (Starlette): poll fallback and the messages API.

Handlers are async only to read bodies; every SQLite/cache call goes through
run_in_threadpool so the event loop never blocks on them.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from urllib.parse import parse_qsl

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from . import __version__, config, metrics, signing
from .cache import make_cache
from .config import Settings
from .service import POLL_PATH, FastPoll
from .store import Store

log = logging.getLogger(__name__)

MOUNT = b"/Poll"
MAX_TEXT_CHARS = 2000
MAX_USER_ID = 2**63 - 1
# The app's publish must reach the cache even when the poll server's read
# timeout is tight: a failed publish leaves a possibly stale answer behind
# until the repair thread rewrites it.
MIN_PUBLISH_TIMEOUT_MS = 1000

_DIGITS = re.compile(r"[0-9]{1,19}")


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


def _json_object(body: bytes) -> dict[str, object]:
    try:
        doc = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise _error(400, "body must be a JSON object (UTF-8)") from None
    if not isinstance(doc, dict):
        raise _error(400, "body must be a JSON object")
    return doc


def _fields(doc: dict[str, object], required: tuple[str, ...]) -> None:
    unknown = sorted(set(doc) - set(required))
    if unknown:
        raise _error(400, f"unknown field '{unknown[0]}'")
    for name in required:
        if name not in doc:
            raise _error(400, f"missing field '{name}'")


def _json_user_id(doc: dict[str, object]) -> int:
    v = doc["user_id"]
    # bool is an int subclass: true must not become user 1.
    if type(v) is not int or not 0 <= v <= MAX_USER_ID:
        raise _error(400, "user_id must be a non-negative integer")
    return v


def _json_text(doc: dict[str, object]) -> str:
    v = doc["text"]
    if not isinstance(v, str):
        raise _error(400, "text must be a string")
    if not v.strip():
        raise _error(400, "text must not be empty")
    if len(v) > MAX_TEXT_CHARS:
        raise _error(400, f"text longer than {MAX_TEXT_CHARS} characters")
    try:
        v.encode("utf-8")
    except UnicodeEncodeError:
        raise _error(400, "text is not valid Unicode (lone surrogate)") from None
    return v


def create_app(settings: Settings | None = None) -> Starlette:
    """Build the app; without settings, read the file named by $FASTPOLL_CONFIG."""
    if settings is None:
        settings = config.load()
    store = Store(settings.app.database)
    timeout = settings.cache.timeout_ms
    fp = FastPoll(
        settings,
        store,
        fill_cache=make_cache(settings),
        publish_cache=make_cache(settings, max(timeout, MIN_PUBLISH_TIMEOUT_MS)),
    )
    limit = settings.app.max_body_size
    content_type = settings.cache.content_type
    # Signed poll URLs (docs/security.md): without a secret file they are not checked.
    secrets = (
        signing.load_secrets(settings.signing.secret_file) if settings.signing.secret_file else []
    )

    async def poll(request: Request) -> Response:
        scope = request.scope
        query: bytes = scope.get("query_string", b"")
        # The key comes from the raw target, as the poll server sees it after
        # nginx strips /Poll; without a raw path we answer but do not fill.
        key = None
        raw_path: bytes | None = scope.get("raw_path")
        if raw_path is not None and raw_path.startswith(MOUNT + b"/"):
            target = raw_path[len(MOUNT) :] + (b"?" + query if query else b"")
            key = fp.derive(target)
        if secrets:
            # First, before the database, the cache or the body: the signature must
            # cover this request's key, and that key must be the user's own.
            if not signing.verify(secrets, key, query, time.time()):
                raise _error(403, "missing, invalid or expired signature")
            if key != fp.user_key(_user_id_from_query(query)):
                raise _error(403, "the signature is not for this user's poll URL")
        user_id = _user_id_from_query(query)
        headers = {"X-Poll-Source": "app", "Content-Type": content_type}
        if request.method == "POST":
            body = await _read_body(request, limit)
            headers["X-Request-Body-Length"] = str(len(body))
            headers["X-Request-Body-SHA256"] = hashlib.sha256(body).hexdigest()
        answer = await run_in_threadpool(fp.poll, user_id, key)
        if request.method == "HEAD":
            headers["Content-Length"] = str(len(answer))
            return Response(b"", headers=headers)
        return Response(answer, headers=headers)

    async def post_message(request: Request) -> Response:
        doc = _json_object(await _read_body(request, limit))
        _fields(doc, ("user_id", "text"))
        user_id, text = _json_user_id(doc), _json_text(doc)
        msg, written = await run_in_threadpool(fp.publish, user_id, text)
        return JSONResponse(
            msg.as_json(),
            status_code=201,
            headers={"X-Cache-Publish": "ok" if written else "pending"},
        )

    async def mark_read(request: Request) -> Response:
        doc = _json_object(await _read_body(request, limit))
        _fields(doc, ("user_id",))
        user_id = _json_user_id(doc)
        count, written = await run_in_threadpool(fp.mark_read, user_id)
        return JSONResponse(
            {"user_id": user_id, "marked_read": count},
            headers={"X-Cache-Publish": "ok" if written else "pending"},
        )

    async def poll_url(request: Request) -> Response:
        # The seam where the application authenticates the user: the demo API has
        # no user accounts and trusts its caller, as POST /api/messages does.
        doc = _json_object(await _read_body(request, limit))
        _fields(doc, ("user_id",))
        user_id = _json_user_id(doc)
        path = MOUNT + POLL_PATH + b"?user_id=%d" % user_id
        exp = int(time.time()) + settings.signing.ttl
        if secrets:
            path += b"&" + signing.signed_query(secrets[0], fp.user_key(user_id), exp)
        return JSONResponse(
            {"user_id": user_id, "url": path.decode(), "expires": exp if secrets else None},
            headers={"Cache-Control": "no-store"},
        )

    async def healthz(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def metrics_page(request: Request) -> Response:
        # Not through nginx (its public server answers 404 for /metrics): scraped directly.
        body, content_type = await run_in_threadpool(metrics.render)
        return Response(body, headers={"Content-Type": content_type})

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        return JSONResponse({"error": exc.detail}, status_code=exc.status_code, headers=exc.headers)

    async def server_error(request: Request, exc: Exception) -> Response:
        log.error("unhandled error on %s %s: %r", request.method, request.url.path, exc)
        return JSONResponse({"error": "internal error"}, status_code=500)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        where = (
            " ".join(settings.memcached.servers)
            if settings.cache.backend == "memcached"
            else settings.redis.server
        )
        log.info(
            "fastpoll_app %s: database %s, cache %s %s, ttl %ss, config %s",
            __version__,
            settings.app.database,
            settings.cache.backend,
            where,
            settings.cache.ttl,
            settings.source,
        )
        metrics.started()
        fp.start()
        try:
            yield
        finally:
            await run_in_threadpool(fp.close)

    app = Starlette(
        routes=[
            Route("/Poll/getMessages", poll, methods=["GET", "HEAD", "POST"]),
            Route("/api/messages", post_message, methods=["POST"]),
            Route("/api/messages/read", mark_read, methods=["POST"]),
            Route("/api/poll-url", poll_url, methods=["POST"]),
            Route("/healthz", healthz, methods=["GET", "HEAD"]),
            Route("/metrics", metrics_page, methods=["GET"]),
        ],
        middleware=[Middleware(metrics.MetricsMiddleware)],
        exception_handlers={HTTPException: http_error, 500: server_error},
        lifespan=lifespan,
    )
    app.state.fastpoll = fp
    return app
