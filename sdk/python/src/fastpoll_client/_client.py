"""The client of fastpoll's private write API (docs/api.md, "API"), for the site's backend.

Retries: a 503 (the app's `Retry-After` honoured, bounded, with jitter) and a connection that
could not be made are retried on every call; a publish sends an `Idempotency-Key` (a new uuid4
per call unless given), so every failure of one (a timeout, a connection broken after the
request was sent) is retried too and still stores the message once. A batch has no key: it is
retried only when nothing can have been stored (a 503, or no connection made).
"""

from __future__ import annotations

import logging
import random
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import httpx

log = logging.getLogger("fastpoll_client")

MAX_RETRY_AFTER = 30.0  # seconds: a longer Retry-After is waited this long at most


class FastpollError(Exception):
    """Any failure of a call; `status` is the HTTP status (None: no answer)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message if status is None else f"{status}: {message}")
        self.message = message
        self.status = status


class Unauthorized(FastpollError):
    """401: the bearer token is missing or not the app's."""


class BadRequest(FastpollError):
    """The app refused the request as sent (400, 413, 415); `message` is its reason."""


class NotFound(FastpollError):
    """404: no such route (a channel name holding '/')."""


class Conflict(FastpollError):
    """409: the Idempotency-Key was used for another message's text or data."""


class Unavailable(FastpollError):
    """503, or no connection, after the retries; `retry_after` is the app's last hint (s)."""

    def __init__(
        self, message: str, status: int | None = None, retry_after: float | None = None
    ) -> None:
        super().__init__(message, status)
        self.retry_after = retry_after


_ERRORS: dict[int, type[FastpollError]] = {
    400: BadRequest,
    401: Unauthorized,
    404: NotFound,
    409: Conflict,
    413: BadRequest,
    415: BadRequest,
}


@dataclass(frozen=True)
class Message:
    """A user's stored message. `cache_publish`: "ok", "pending" (the outbox rewrites the poll
    key) or None on a replay (`replayed`: an earlier call with this key stored it)."""

    id: int
    user_id: int
    text: str  # "" for a message of data alone
    created: float
    read: bool
    replayed: bool = False
    cache_publish: str | None = None
    data: Any = None  # the message's data as published (None: none)


@dataclass(frozen=True)
class ChannelMessage:
    id: int
    channel: str
    text: str
    created: float
    replayed: bool = False
    cache_publish: str | None = None
    data: Any = None


@dataclass(frozen=True)
class BatchItem:
    """One message of a batch: to a user (`user_id`) or to a channel (`channel`); its text,
    its data (any JSON value) or both."""

    text: str | None = None
    user_id: int | None = None
    channel: str | None = None
    data: Any = None

    def as_json(self) -> dict[str, object]:
        if (self.user_id is None) == (self.channel is None):
            raise ValueError("a batch item names exactly one of user_id and channel")
        target: dict[str, object] = (
            {"user_id": self.user_id} if self.channel is None else {"channel": self.channel}
        )
        return target | _payload(self.text, self.data)


@dataclass(frozen=True)
class MarkRead:
    user_id: int
    marked_read: int
    cache_publish: str | None = None


@dataclass(frozen=True)
class PollUrl:
    """A signed poll URL; `expires` is Unix time (None: URLs are not signed)."""

    user_id: int
    url: str
    expires: int | None
    channels: tuple[str, ...] = ()


class Client:
    """`Client("http://app-host:8000", token)`: the app's own listener and its API token.

    `timeout`: seconds per attempt (keep it above 3 s: the app answers 503 after a user's order
    stayed taken 3 s). `retries`: attempts after the first. `public_url`: the public edge's base
    (https://poll.example.com); poll_url() then returns absolute URLs, else the path.
    """

    def __init__(
        self,
        base_url: str,
        token: str,
        timeout: float = 10.0,
        retries: int = 3,
        *,
        public_url: str | None = None,
        backoff: float = 0.2,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        if retries < 0:
            raise ValueError("retries must be >= 0")
        self.retries = retries
        self.backoff = backoff
        self.public_url = public_url.rstrip("/") if public_url else None
        self._http = httpx.Client(
            base_url=base_url,
            timeout=timeout,
            headers={"Authorization": f"Bearer {token}"},
            transport=transport,
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # ---- the API ---------------------------------------------------------------------------

    def publish(
        self,
        user_id: int,
        text: str | None = None,
        idempotency_key: str | None = None,
        *,
        data: Any = None,
    ) -> Message:
        """Store a message for the user (201: durable): its text, its data (any JSON value, at
        most 8,192 bytes as compact JSON) or both; retried safely with its key."""
        r = self._call(
            "/api/messages",
            {"user_id": user_id, **_payload(text, data)},
            idempotency_key or str(uuid.uuid4()),
        )
        d = r.json()
        return Message(
            d["id"],
            d["user_id"],
            d["text"],
            d["created"],
            d["read"],
            *_publish_headers(r),
            data=d.get("data"),
        )

    def publish_channel(
        self,
        name: str,
        text: str | None = None,
        idempotency_key: str | None = None,
        *,
        data: Any = None,
    ) -> ChannelMessage:
        """Store a message in a channel (room), as publish(); retried safely with its key."""
        if "/" in name:
            raise BadRequest("a channel name is 1-64 bytes of A-Z a-z 0-9 _ . -")
        r = self._call(
            f"/api/channels/{name}/messages",
            _payload(text, data),
            idempotency_key or str(uuid.uuid4()),
        )
        d = r.json()
        return ChannelMessage(
            d["id"],
            d["channel"],
            d["text"],
            d["created"],
            *_publish_headers(r),
            data=d.get("data"),
        )

    def publish_batch(self, items: Iterable[BatchItem | Mapping[str, Any]]) -> list[int]:
        """Store many messages in one transaction; their ids, in the items' order. Retried only
        when nothing can have been stored (a 503, or no connection)."""
        body = [i.as_json() if isinstance(i, BatchItem) else dict(i) for i in items]
        r = self._call("/api/messages/batch", {"items": body}, None, safe=False)
        return [int(i) for i in r.json()["ids"]]

    def mark_read(self, user_id: int, up_to_id: int) -> MarkRead:
        """Mark the user's messages with id <= up_to_id read (the newest id the user saw)."""
        r = self._call("/api/messages/read", {"user_id": user_id, "up_to_id": up_to_id})
        d = r.json()
        return MarkRead(d["user_id"], d["marked_read"], r.headers.get("x-cache-publish"))

    def poll_url(self, user_id: int, channels: Sequence[str] | None = None) -> str:
        """The user's signed poll URL (with `channels`, one URL for the user and the rooms)."""
        url = self.poll_url_info(user_id, channels).url
        return self.public_url + url if self.public_url else url

    def poll_url_info(self, user_id: int, channels: Sequence[str] | None = None) -> PollUrl:
        """poll_url() with its expiry: ask again before `expires`, or when a poll gets 403."""
        body: dict[str, object] = {"user_id": user_id}
        if channels is not None:
            body["channels"] = list(channels)
        d = self._call("/api/poll-url", body).json()
        return PollUrl(d["user_id"], d["url"], d["expires"], tuple(d.get("channels", ())))

    # ---- one call, with its retries ----------------------------------------------------------

    def _call(
        self,
        path: str,
        body: dict[str, object],
        idempotency_key: str | None = None,
        *,
        safe: bool = True,
    ) -> httpx.Response:
        """POST the body; `safe`: a repeat cannot store anything twice (idempotent, or keyed),
        so an attempt that may have reached the app is retried too."""
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
        attempt = 0
        while True:
            try:
                r = self._http.post(path, json=body, headers=headers)
            except httpx.TransportError as exc:
                # A connection never made stored nothing; anything else may have.
                if attempt >= self.retries or not (safe or isinstance(exc, httpx.ConnectError)):
                    raise Unavailable(f"{path}: {type(exc).__name__}: {exc}") from exc
                delay = self._backoff(attempt)
                log.info("%s: %s, retry %d in %.2f s", path, type(exc).__name__, attempt + 1, delay)
            else:
                if r.status_code < 400:
                    return r
                message = _message(r)
                if r.status_code != 503:
                    raise _ERRORS.get(r.status_code, FastpollError)(message, r.status_code)
                hint = _retry_after(r)
                if attempt >= self.retries:
                    raise Unavailable(message, 503, hint)
                delay = self._backoff(attempt) if hint is None else hint
                delay = min(delay, MAX_RETRY_AFTER) * random.uniform(1.0, 1.25)  # spread retries
                log.info("%s: 503 (%s), retry %d in %.2f s", path, message, attempt + 1, delay)
            time.sleep(delay)
            attempt += 1

    def _backoff(self, attempt: int) -> float:
        """Full jitter: 0 to backoff × 2^attempt seconds, at most 5 s."""
        return random.uniform(0, min(5.0, self.backoff * 2**attempt))


def _payload(text: str | None, data: Any) -> dict[str, object]:
    """A message's fields: its text, its data (None: none), at least one of them."""
    if text is None and data is None:
        raise ValueError("a message has text, data or both")
    doc: dict[str, object] = {} if text is None else {"text": text}
    return doc if data is None else doc | {"data": data}


def _publish_headers(r: httpx.Response) -> tuple[bool, str | None]:
    return r.headers.get("idempotent-replayed") == "true", r.headers.get("x-cache-publish")


def _message(r: httpx.Response) -> str:
    try:
        doc = r.json()
    except ValueError:
        return r.text[:200] or r.reason_phrase
    return str(doc.get("error", doc)) if isinstance(doc, dict) else str(doc)


def _retry_after(r: httpx.Response) -> float | None:
    value = r.headers.get("retry-after", "")
    return float(value) if value.isdigit() else None
