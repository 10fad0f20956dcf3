"""uvicorn's HTTP/1.1 protocol with TCP_NODELAY on every accepted TCP connection.

uvicorn writes a response's head and body in two send()s. asyncio only sets TCP_NODELAY when
the listening socket was made with proto IPPROTO_TCP, and uvicorn makes it with proto 0 when it
runs several workers: Nagle then holds the body until the peer ACKs the head, which nginx (or
any client) delays by 40 ms, on every answer of a keep-alive connection."""

from __future__ import annotations

import asyncio
import contextlib
import socket

from uvicorn.protocols.http.h11_impl import H11Protocol


class NoDelayH11Protocol(H11Protocol):
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            # OSError: the peer is already gone, which the protocol will see.
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        super().connection_made(transport)
