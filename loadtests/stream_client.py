"""The event-stream client of loadtests/rooms.py: one asyncio process holding N streams, one per
member, each as an EventSource holds one, in the style of loadtests/longpoll_client.py (raw
asyncio streams, no HTTP library: thousands of streams per process).

A member's client sends `GET <target>` with `Accept: text/event-stream`, reads the response head
(a 200 of type text/event-stream, else an error and the member stops), then the body as it comes:
de-chunked if `Transfer-Encoding: chunked`, parsed into events (`data:` lines joined with LF,
`id:`, comments and `retry:` skipped), each event's data searched for the messages' markers
(`"lp<seq>"`). A response that ends while the run goes on is counted (`stream_ended`) and the
member reconnects at once with `Last-Event-ID: <the last id>`, as an EventSource does.

A message is delivered to a member at the read of the first event whose data holds its marker;
a marker never seen is a miss (every marker is looked for, not only the newest: a system that
skips an event is not credited by the next one).
"""

from __future__ import annotations

import asyncio
import re
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from loadtests.longpoll_client import CONNECT_BATCH, parse_head

SEQ = re.compile(rb'"lp(\d+)"')


class ChunkedDecoder:
    """HTTP/1.1 chunked transfer coding, fed as bytes arrive: feed() returns the payload so far
    (chunk extensions and trailers are skipped); `done` once the last chunk is read."""

    def __init__(self) -> None:
        self._buf = b""
        self._left = 0  # payload bytes left in the current chunk
        self._crlf = False  # a chunk's trailing CRLF is still to skip
        self.done = False

    def feed(self, data: bytes) -> bytes:
        self._buf += data
        out: list[bytes] = []
        while self._buf and not self.done:
            if self._left:
                take = self._buf[: self._left]
                out.append(take)
                self._left -= len(take)
                self._buf = self._buf[len(take) :]
                if not self._left:
                    self._crlf = True
                continue
            if self._crlf:
                if len(self._buf) < 2:
                    break
                if self._buf[:2] != b"\r\n":
                    raise ValueError("chunk without its CRLF")
                self._buf = self._buf[2:]
                self._crlf = False
                continue
            line, sep, rest = self._buf.partition(b"\r\n")
            if not sep:
                if len(self._buf) > 1024:
                    raise ValueError("chunk size line too long")
                break
            size = int(line.split(b";")[0].strip(), 16)
            self._buf = rest
            if size == 0:
                self.done = True
            else:
                self._left = size
        return b"".join(out)


@dataclass
class SseEvent:
    id: bytes | None  # None: the event had no id field
    data: bytes


class SseParser:
    """The event-stream format (WHATWG HTML, "Parsing an event stream"), fed as bytes arrive:
    feed() returns the events completed so far. Lines end with CRLF, LF or CR; `data` fields are
    joined with LF; an event with no data field is not dispatched; comments are skipped."""

    def __init__(self) -> None:
        self._buf = b""
        self._data: list[bytes] = []
        self._id: bytes | None = None
        self.last_id: bytes = b""

    def feed(self, data: bytes) -> list[SseEvent]:
        self._buf += data
        events: list[SseEvent] = []
        while True:
            ends = (self._buf.find(b"\n"), self._buf.find(b"\r"))
            i = min((j for j in ends if j >= 0), default=-1)
            if i < 0:
                return events
            if self._buf[i : i + 1] == b"\r" and i + 1 == len(self._buf):
                return events  # a CR at the end: wait to see whether an LF follows
            line = self._buf[:i]
            skip = 2 if self._buf[i : i + 2] == b"\r\n" else 1
            self._buf = self._buf[i + skip :]
            if not line:
                if self._data:
                    events.append(SseEvent(self._id, b"\n".join(self._data)))
                self._data = []
                self._id = None
                continue
            if line.startswith(b":"):
                continue
            name, _, value = line.partition(b":")
            if value.startswith(b" "):
                value = value[1:]
            if name == b"data":
                self._data.append(value)
            elif name == b"id":
                self._id = value
                self.last_id = value


def markers(data: bytes) -> list[int]:
    return [int(m) for m in SEQ.findall(data)]


class StreamDeliveries:
    """The first read of each member's each marker: times[seq] = [read time per member]."""

    def __init__(self, progress: Any) -> None:
        self.seen: defaultdict[int, set[int]] = defaultdict(set)
        self.times: defaultdict[int, list[float]] = defaultdict(list)
        self.progress = progress  # a shared counter of deliveries (the parent watches it)
        self.superseded = 0  # stays 0: each marker is counted on its own

    def event(self, user: int, data: bytes, t: float) -> int:
        seen = self.seen[user]
        new = [s for s in markers(data) if s not in seen]
        for s in new:
            seen.add(s)
            self.times[s].append(t)
        if new:
            self.progress.value += len(new)
        return len(new)


@dataclass
class StreamRun:
    """N members' streams against one system (no publisher: the caller publishes)."""

    port: int
    users: list[int]
    target: Callable[[int], str]  # the request-target of a member's stream
    deliveries: StreamDeliveries
    statuses: Counter[str] = field(default_factory=Counter)  # "200" per response, "event" per event
    errors: Counter[str] = field(default_factory=Counter)
    connected: int = 0
    stopping: bool = False

    def _request(self, user: int, last_id: bytes) -> bytes:
        lines = [
            f"GET {self.target(user)} HTTP/1.1".encode(),
            b"Host: 127.0.0.1",
            b"Accept: text/event-stream",
            b"Cache-Control: no-cache",
        ]
        if last_id:
            lines.append(b"Last-Event-ID: " + last_id)
        return b"\r\n".join(lines) + b"\r\n\r\n"

    async def _stream(self, user: int, gate: asyncio.Semaphore, parser: SseParser) -> bool:
        """One connection's stream; True if it ended and the member should reconnect."""
        writer: asyncio.StreamWriter | None = None
        try:
            async with gate:
                reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
                writer.write(self._request(user, parser.last_id))
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
                status, headers = parse_head(head)
            self.connected += 1
            self.statuses[str(status)] += 1
            ctype = headers.get(b"content-type", b"").split(b";")[0].strip().lower()
            if status != 200 or ctype != b"text/event-stream":
                self.errors[f"status_{status}_{ctype.decode(errors='replace')}"] += 1
                return False
            chunked = headers.get(b"transfer-encoding", b"").lower() == b"chunked"
            dechunk = ChunkedDecoder() if chunked else None
            while not self.stopping:
                data = await reader.read(65536)
                if not data:
                    break
                now = time.monotonic()
                if dechunk is not None:
                    data = dechunk.feed(data)
                for ev in parser.feed(data):
                    self.statuses["event"] += 1
                    self.deliveries.event(user, ev.data, now)
                if dechunk is not None and dechunk.done:
                    break
            if not self.stopping:
                self.statuses["stream_ended"] += 1
            return not self.stopping
        except (
            OSError,
            TimeoutError,
            asyncio.IncompleteReadError,
            asyncio.LimitOverrunError,
            ValueError,
        ) as e:
            if not self.stopping:
                self.errors[type(e).__name__] += 1
            return False
        finally:
            if writer is not None:
                writer.close()

    async def _client(self, user: int, gate: asyncio.Semaphore) -> None:
        parser = SseParser()
        reconnects = 0
        while await self._stream(user, gate, parser) and reconnects < 100:
            reconnects += 1  # bounded: a system that ends every stream at once is not hammered
            await asyncio.sleep(0.1)

    async def hold(self) -> list[asyncio.Task[None]]:
        """Start every member's stream (connections opened CONNECT_BATCH at a time)."""
        gate = asyncio.Semaphore(CONNECT_BATCH)
        return [asyncio.create_task(self._client(u, gate)) for u in self.users]
