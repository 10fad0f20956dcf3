"""Event streams (docs/api.md, "Event streams"): a poll whose Accept names text/event-stream.

The poll server holds such a poll open and writes one event per change. When it cannot (a miss,
a cache that fails) nginx's fallback brings the poll here, and the app answers it as a stream
that ends after its one event: the client's EventSource reconnects after the `retry` hint, with
Last-Event-ID, and the poll server, whose cache the app has just filled, streams from then on.
An event's id is its answer's ETag, so Last-Event-ID means what If-None-Match means.
"""

from __future__ import annotations

from collections.abc import Iterable

MEDIA_TYPE = "text/event-stream"


def wants_stream(accept_lines: Iterable[bytes]) -> bool:
    """Does an Accept line list text/event-stream (any case, parameters after ';' ignored)?

    The poll server's rule (httpparse.c) too: a media range qualifies by its type alone."""
    for line in accept_lines:
        for item in line.split(b","):
            if item.split(b";", 1)[0].strip().lower() == MEDIA_TYPE.encode():
                return True
    return False


def _data_lines(answer: bytes) -> bytes:
    """The answer as data lines: each of its lines (CRLF, CR or LF) a `data:` line of its own.

    The empty answer is two empty data lines (the client gets "\\n"): an EventSource delivers
    no event whose data is empty."""
    if not answer:
        return b"data: \ndata: \n"
    lines = answer.replace(b"\r\n", b"\n").replace(b"\r", b"\n").split(b"\n")
    return b"".join(b"data: " + line + b"\n" for line in lines)


def event(answer: bytes, etag: str) -> bytes:
    """One event: the answer, with its ETag as the event's id."""
    return b"id: " + etag.encode("ascii") + b"\n" + _data_lines(answer) + b"\n"


def short_stream(answer: bytes, etag: str, retry_ms: int, seen: bool) -> bytes:
    """A stream that ends after its one event (none if the client has seen this answer)."""
    head = b"retry: %d\n" % retry_ms
    return head + (b"\n" if seen else event(answer, etag))
