"""An EventSource as a browser runs one, for tests, the contract checker and the benchmarks.

It opens a poll URL with Accept: text/event-stream, hands each event to its caller, and when the
response ends (the app's one-event stream, a poller's drain or lifetime end) reconnects after the
last `retry` hint with Last-Event-ID, as the WHATWG EventSource does. A non-200 answer or another
content type ends it, as it fails an EventSource (the browser client then polls).
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx
from httpx_sse import EventSource as _Parser

MEDIA_TYPE = "text/event-stream"


def read_first_event(s: socket.socket, timeout: float = 3.0) -> bytes:
    """What a raw socket's stream sent up to the end of its first event (the head and the event;
    less if it closed first)."""
    s.settimeout(timeout)
    out = b""
    while b"\n\n" not in out.partition(b"\r\n\r\n")[2]:
        chunk = s.recv(65536)
        if not chunk:
            break
        out += chunk
    return out


@dataclass(frozen=True)
class Event:
    """One event as the client got it: when (monotonic), its id, its data, who sent it."""

    at: float
    id: str
    data: str
    source: str  # X-Poll-Source of the response it came on: cache (a poller) or app
    connection: int  # which connection of this client (0, 1, ...)
    sent: float = 0.0  # when that connection's request was sent (monotonic)

    @property
    def answer(self) -> bytes:
        """The poll answer the event carries (the empty answer arrives as one LF)."""
        return b"" if self.data == "\n" else self.data.encode()


class StreamFailed(Exception):
    """The stream's answer was not a 200 event stream: an EventSource fails on it."""

    def __init__(self, status: int, content_type: str) -> None:
        super().__init__(f"{status} {content_type}")
        self.status = status
        self.content_type = content_type


class EventStreamClient:
    """Follows one poll URL's stream until stop() or a failure; on_event(event) per event."""

    def __init__(
        self,
        url: str,
        on_event: Callable[[Event], None],
        *,
        client: httpx.Client | None = None,
        last_event_id: str = "",
        max_retry_s: float = 5.0,
        read_timeout: float = 60.0,
    ) -> None:
        self.url = url
        self.on_event = on_event
        self.last_event_id = last_event_id
        self.retry_ms = 1000
        self.max_retry_s = max_retry_s
        self.connections = 0
        # (connection, request sent, response ended, status, X-Poll-Source), monotonic times
        self.log: list[tuple[int, float, float, int, str]] = []
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._own = client is None
        self._client = client or httpx.Client(timeout=httpx.Timeout(5.0, read=read_timeout))
        self._response: httpx.Response | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> EventStreamClient:
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        resp = self._response
        if resp is not None:
            resp.close()
        self._thread.join(timeout)
        if self._own:
            self._client.close()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def _one(self) -> None:
        headers = {"Accept": MEDIA_TYPE, "Cache-Control": "no-cache"}
        if self.last_event_id:
            headers["Last-Event-ID"] = self.last_event_id
        conn = self.connections
        self.connections += 1
        sent, status, source = time.monotonic(), 0, ""
        try:
            with self._client.stream("GET", self.url, headers=headers) as resp:
                self._response = resp
                status = resp.status_code
                ctype = resp.headers.get("content-type", "")
                if resp.status_code != 200 or not ctype.startswith(MEDIA_TYPE):
                    raise StreamFailed(resp.status_code, ctype)
                source = resp.headers.get("x-poll-source", "")
                for sse in _Parser(resp).iter_sse():
                    if sse.retry is not None:
                        self.retry_ms = sse.retry
                    if sse.id:
                        self.last_event_id = sse.id
                    if sse.data or sse.event != "message":
                        at = time.monotonic()
                        self.on_event(Event(at, sse.id, sse.data, source, conn, sent))
                    if self._stop.is_set():
                        return
        finally:
            self.log.append((conn, sent, time.monotonic(), status, source))

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._one()
            except StreamFailed as exc:
                self.error = exc
                return
            except (httpx.HTTPError, OSError) as exc:
                if self._stop.is_set():
                    return
                self.error = exc  # a dropped connection: reconnect, as EventSource does
            finally:
                self._response = None
            self._stop.wait(min(self.retry_ms / 1000.0, self.max_retry_s))
