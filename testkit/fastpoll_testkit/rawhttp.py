"""Raw-socket HTTP for the bad-input and security tests: send exactly these bytes, read what
comes back until the server closes (or a bound runs out), split it into responses."""

from __future__ import annotations

import contextlib
import socket
import time
from dataclasses import dataclass, field


@dataclass
class Response:
    status: int
    reason: bytes
    headers: dict[bytes, bytes]
    body: bytes

    def header(self, name: str) -> str | None:
        v = self.headers.get(name.lower().encode())
        return None if v is None else v.decode("latin-1")


@dataclass
class Exchange:
    responses: list[Response] = field(default_factory=list)
    closed: bool = False  # the server closed the connection
    trailing: bytes = b""  # bytes that were not a whole response
    seconds: float = 0.0

    @property
    def statuses(self) -> list[int]:
        return [r.status for r in self.responses]


def parse(
    data: bytes, head_for: set[int] | None = None
) -> tuple[list[Response], bytes]:
    """Whole responses in data, and what is left over. head_for: indexes of responses to HEAD
    requests (their Content-Length describes a body that is not sent)."""
    out: list[Response] = []
    while True:
        end = data.find(b"\r\n\r\n")
        if end < 0 or not data.startswith(b"HTTP/1."):
            return out, data
        lines = data[:end].split(b"\r\n")
        parts = lines[0].split(b" ", 2)
        if len(parts) < 2 or not parts[1].isdigit():
            return out, data
        headers: dict[bytes, bytes] = {}
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            headers[name.strip().lower()] = value.strip()
        rest = data[end + 4 :]
        status = int(parts[1])
        if (
            (head_for and len(out) in head_for)
            or status in (204, 304)
            or 100 <= status < 200
        ):
            body = b""
        elif headers.get(b"transfer-encoding", b"").lower() == b"chunked":
            body = b""
            while True:
                eol = rest.find(b"\r\n")
                if eol < 0:
                    return out, data
                size = int(rest[:eol].split(b";")[0], 16)
                if len(rest) < eol + 2 + size + 2:
                    return out, data
                body += rest[eol + 2 : eol + 2 + size]
                rest = rest[eol + 2 + size + 2 :]
                if size == 0:
                    break
        elif b"content-length" in headers:
            n = int(headers[b"content-length"])
            if len(rest) < n:
                return out, data
            body, rest = rest[:n], rest[n:]
        else:  # until close
            body, rest = rest, b""
        out.append(Response(status, parts[2] if len(parts) > 2 else b"", headers, body))
        data = rest


def exchange(
    port: int,
    data: bytes,
    timeout: float = 5.0,
    expect: int | None = None,
    head_for: set[int] | None = None,
) -> Exchange:
    """Sends data on a new connection and reads until the server closes it, `expect` whole
    responses came back, or `timeout` seconds passed."""
    t0 = time.monotonic()
    got = b""
    closed = False
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        with contextlib.suppress(OSError):  # the server may answer and close before reading all
            s.sendall(data)
        while time.monotonic() - t0 < timeout:
            if expect is not None and len(parse(got, head_for)[0]) >= expect:
                break
            s.settimeout(max(0.05, timeout - (time.monotonic() - t0)))
            try:
                chunk = s.recv(65536)
            except TimeoutError:
                break
            except OSError:  # reset after an early answer
                closed = True
                break
            if not chunk:
                closed = True
                break
            got += chunk
    responses, rest = parse(got, head_for)
    return Exchange(responses, closed, rest, time.monotonic() - t0)


def request(
    method: str, target: str, headers: dict[str, str] | None = None, body: bytes = b""
) -> bytes:
    h = {"Host": "fastpoll", **(headers or {})}
    if body and "Content-Length" not in h and "Transfer-Encoding" not in h:
        h["Content-Length"] = str(len(body))
    head = f"{method} {target} HTTP/1.1\r\n" + "".join(
        f"{k}: {v}\r\n" for k, v in h.items()
    )
    return head.encode("latin-1") + b"\r\n" + body
