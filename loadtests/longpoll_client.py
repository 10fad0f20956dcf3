"""The long-poll client of loadtests/longpoll.py: one asyncio process holding N connections, one
per user, each polling as a browser client would, and a publisher sending to a random 1% of the
users per second. It measures publish-to-delivery per message.

- fastpoll (`mode="etag"`): as client/fastpoll.js does, `GET <signed poll URL>&wait=25` with
  `If-None-Match: <the last ETag>` (none on the first poll, which is answered at once), and the
  pause the answer names in `Poll-Interval-Ms` before the next poll.
- Nchan (`mode="nchan"`): its long-poll protocol, `If-Modified-Since: <Last-Modified>` and
  `If-None-Match: <Etag>` of the last message (none at first: the first poll waits for the first
  message), the next poll at once.

A publish carries a unique marker (`"lp<seq>"`, a JSON string in the message's text); its clock
starts just before the publish request is written. A message is delivered when its user's client
reads a 200 whose body holds the marker (or a later marker of that user: fastpoll's answer shows
the newest message, which supersedes the ones before it). Nothing is asserted here: everything
unexpected is counted and reported (errors, must be 0).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter, deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

CONNECT_BATCH = 200  # connections opened at once: a burst of thousands overflows the backlog


@dataclass
class Response:
    status: int
    headers: dict[bytes, bytes]
    body: bytes
    nbytes: int  # head + body as read from the socket


def parse_head(head: bytes) -> tuple[int, dict[bytes, bytes]]:
    """A response head (up to its blank line): the status and the headers, names lowercased."""
    lines = head.rstrip(b"\r\n").split(b"\r\n")
    parts = lines[0].split(b" ", 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
        raise ValueError(f"bad status line {lines[0][:80]!r}")
    headers: dict[bytes, bytes] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        if not sep:
            raise ValueError(f"bad header line {line[:80]!r}")
        headers[name.strip().lower()] = value.strip()
    return int(parts[1]), headers


async def read_response(reader: asyncio.StreamReader) -> Response:
    """One HTTP/1.1 response: Content-Length, chunked, or none (304, 204)."""
    head = await reader.readuntil(b"\r\n\r\n")
    status, headers = parse_head(head)
    body = b""
    if b"content-length" in headers:
        body = await reader.readexactly(int(headers[b"content-length"]))
    elif headers.get(b"transfer-encoding", b"").lower() == b"chunked":
        chunks: list[bytes] = []
        nread = 0
        while True:
            size_line = await reader.readuntil(b"\r\n")
            nread += len(size_line)
            size = int(size_line.split(b";")[0].strip(), 16)
            data = await reader.readexactly(size + 2)  # the chunk and its CRLF
            nread += len(data)
            if size == 0:
                break
            chunks.append(data[:-2])
        body = b"".join(chunks)
        return Response(status, headers, body, len(head) + nread)
    elif status not in (204, 304) and headers.get(b"connection", b"").lower() == b"close":
        body = await reader.read()
    return Response(status, headers, body, len(head) + len(body))


@dataclass
class Deliveries:
    """Pending publishes per user and the publish-to-delivery times of those delivered."""

    pending: dict[int, deque[tuple[bytes, float]]] = field(default_factory=dict)
    latencies_s: list[float] = field(default_factory=list)
    superseded: int = 0  # delivered by a later message's answer (fastpoll shows the newest)
    # The part after the publish request was answered (the write path excluded): from its
    # answer to the delivery, for the messages whose answer came back before their delivery.
    answered_at: dict[bytes, float] = field(default_factory=dict)
    after_answer_s: list[float] = field(default_factory=list)
    before_answer: int = 0  # delivered before the publish request's answer was read

    def published(self, user: int, marker: bytes, t: float) -> None:
        self.pending.setdefault(user, deque()).append((marker, t))

    def publish_answered(self, marker: bytes, t: float) -> None:
        if any(marker == m for q in self.pending.values() for m, _ in q):
            self.answered_at[marker] = t

    def answer(self, user: int, body: bytes, t: float) -> int:
        """A 200 for user: the newest pending marker it holds delivers it and every older one."""
        q = self.pending.get(user)
        if not q:
            return 0
        last = -1
        for i, (marker, _) in enumerate(q):
            if marker in body:
                last = i
        for i in range(last + 1):
            marker, sent = q.popleft()
            self.latencies_s.append(t - sent)
            if marker in self.answered_at:
                self.after_answer_s.append(t - self.answered_at.pop(marker))
            else:
                self.before_answer += 1
            if i < last:
                self.superseded += 1
        return last + 1

    def undelivered(self) -> int:
        return sum(len(q) for q in self.pending.values())


def quantile_ms(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    return round(s[min(len(s) - 1, int(q * len(s)))] * 1000, 2)


def marker_of(seq: int) -> bytes:
    return b'"lp%d"' % seq


@dataclass
class HoldRun:
    """N held clients against one system, and a publisher."""

    port: int
    users: list[int]
    target: Callable[[int], str]  # the request-target of a user's poll
    mode: str  # "etag" (fastpoll) or "nchan"
    publish: Callable[[int, str], Awaitable[int]]  # (user, text) -> HTTP status
    publish_ok: tuple[int, ...] = (201,)
    wait_s: int = 25
    deliveries: Deliveries = field(default_factory=Deliveries)
    statuses: Counter[str] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)
    connected: int = 0
    polls: int = 0
    stopping: bool = False

    def _request(self, user: int, state: dict[bytes, bytes]) -> bytes:
        lines = [f"GET {self.target(user)} HTTP/1.1".encode(), b"Host: 127.0.0.1"]
        if self.mode == "etag":
            if b"etag" in state:
                lines.append(b"If-None-Match: " + state[b"etag"])
        else:
            if b"last-modified" in state:
                lines.append(b"If-Modified-Since: " + state[b"last-modified"])
            if b"etag" in state:
                lines.append(b"If-None-Match: " + state[b"etag"])
        return b"\r\n".join(lines) + b"\r\n\r\n"

    async def _client(self, user: int, gate: asyncio.Semaphore) -> None:
        state: dict[bytes, bytes] = {}
        writer: asyncio.StreamWriter | None = None
        try:
            async with gate:
                reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
            self.connected += 1
            while not self.stopping:
                writer.write(self._request(user, state))
                try:
                    r = await asyncio.wait_for(read_response(reader), self.wait_s + 15)
                except TimeoutError:
                    self.errors["timeout"] += 1
                    return
                self.polls += 1
                now = time.monotonic()
                self.statuses[str(r.status)] += 1
                pause = 0.0
                if r.status == 200:
                    self.deliveries.answer(user, r.body, now)
                    for h in (b"etag", b"last-modified"):
                        if h in r.headers:
                            state[h] = r.headers[h]
                elif r.status == 304 or (self.mode == "nchan" and r.status == 408):
                    pass  # the wait ended with nothing new (Nchan's longpoll timeout is a 408)
                else:
                    self.errors[f"status_{r.status}"] += 1
                    return
                if self.mode == "etag":
                    pace = r.headers.get(b"poll-interval-ms", b"")
                    pause = int(pace) / 1000 if pace.isdigit() else 1.0
                if r.headers.get(b"connection", b"").lower() == b"close":
                    self.errors["server_closed"] += 1
                    return
                if pause:
                    await asyncio.sleep(pause)
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as e:
            if not self.stopping:
                self.errors[type(e).__name__] += 1
        finally:
            if writer is not None:
                writer.close()

    async def hold(self) -> list[asyncio.Task[None]]:
        """Start every client (connections opened CONNECT_BATCH at a time)."""
        gate = asyncio.Semaphore(CONNECT_BATCH)
        return [asyncio.create_task(self._client(u, gate)) for u in self.users]

    async def publish_for(self, seconds: float, rate: float, seed: int = 7) -> dict[str, object]:
        """Publish `rate` messages a second to random users for `seconds`; each publish is its
        own task, so a slow publish does not delay the next one."""
        rng = random.Random(seed)
        tasks: list[asyncio.Task[None]] = []
        pub_status: Counter[str] = Counter()
        answered: list[float] = []  # the publish request's own time, until its answer
        seq = 0

        async def one(user: int, n: int) -> None:
            sent = time.monotonic()
            self.deliveries.published(user, marker_of(n), sent)
            try:
                status = await self.publish(user, f"lp{n}")
            except Exception as e:  # noqa: BLE001 - counted: the run goes on
                self.errors[f"publish_{type(e).__name__}"] += 1
                return
            done = time.monotonic()
            answered.append(done - sent)
            self.deliveries.publish_answered(marker_of(n), done)
            pub_status[str(status)] += 1
            if status not in self.publish_ok:
                self.errors[f"publish_status_{status}"] += 1

        start = time.monotonic()
        while True:
            due = start + seq / rate
            if due - start >= seconds:
                break
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            seq += 1
            tasks.append(asyncio.create_task(one(rng.choice(self.users), seq)))
        await asyncio.gather(*tasks)
        return {
            "published": seq,
            "publish_status": dict(pub_status),
            "publish_answered_p50_ms": quantile_ms(answered, 0.5),
            "publish_answered_p99_ms": quantile_ms(answered, 0.99),
        }

    async def drain(self, grace_s: float) -> None:
        """Wait until every publish is delivered, or grace_s."""
        end = time.monotonic() + grace_s
        while self.deliveries.undelivered() and time.monotonic() < end:
            await asyncio.sleep(0.05)
