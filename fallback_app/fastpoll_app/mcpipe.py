"""Pipelined conditional writes to one memcached node (a batch publish, docs/channels.md): the
text protocol on a connection of its own, because pylibmc has neither a multi-key `gets` nor a
pipelined `cas`.

Two round trips for any number of keys: every key's `gets` in one request, then in one write a
`cas` with the unique it returned for each key present (an `add` for each key absent). A key
whose `cas` or `add` was not STORED (another write came in between, or the key was evicted) is
returned, for the caller to write alone with its read-and-retry loop; so each key's write stays
conditional on what it read, as MemcachedCache.put's is. So is a key whose value the node refused
as too large for its item size (the node read the value past and answers the next one): the
caller's own write then meets the refusal and deals with it (cache.py)."""

from __future__ import annotations

import io
import socket
from collections.abc import Sequence

# Keys per `gets` request: 100 keys of up to 250 bytes stay far below any line limit.
GETS_CHUNK = 100
# memcached's answer to a value over its item size (-I).
TOO_LARGE = b"SERVER_ERROR object too large for cache"


class PipeError(OSError):
    """The node did not answer as the protocol says (or not in time)."""


def _line(f: io.BufferedReader, limit: int = 4096) -> bytes:
    line = f.readline(limit)
    if not line.endswith(b"\r\n"):
        raise PipeError(f"memcached: truncated answer {line[:60]!r}")
    return line[:-2]


def put_node(
    addr: str, items: Sequence[tuple[bytes, bytes]], ttl: int, timeout: float
) -> list[bytes]:
    """Write every (key, value) on the node at host:port; the keys still to write one by one.
    OSError (PipeError included) if the node failed: then nothing is known of any key."""
    host, _, port = addr.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=timeout) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        f = s.makefile("rb")
        keys = [k for k, _ in items]
        req = b"".join(
            b"gets " + b" ".join(keys[i : i + GETS_CHUNK]) + b"\r\n"
            for i in range(0, len(keys), GETS_CHUNK)
        )
        s.sendall(req)
        uniques: dict[bytes, int] = {}
        for _ in range(0, len(keys), GETS_CHUNK):
            while (head := _line(f)) != b"END":
                parts = head.split()
                if len(parts) != 5 or parts[0] != b"VALUE":
                    raise PipeError(f"memcached gets: {head[:60]!r}")
                f.read(int(parts[3]) + 2)
                uniques[parts[1]] = int(parts[4])
        out = bytearray()
        for key, value in items:
            unique = uniques.get(key)
            if unique is None:
                out += b"add %s 0 %d %d\r\n" % (key, ttl, len(value))
            else:
                out += b"cas %s 0 %d %d %d\r\n" % (key, ttl, len(value), unique)
            out += value + b"\r\n"
        s.sendall(out)
        lost: list[bytes] = []
        for key in keys:
            reply = _line(f)
            if reply in (b"EXISTS", b"NOT_FOUND", b"NOT_STORED", TOO_LARGE):
                lost.append(key)
            elif reply != b"STORED":
                raise PipeError(f"memcached cas/add: {reply[:60]!r}")
        return lost
