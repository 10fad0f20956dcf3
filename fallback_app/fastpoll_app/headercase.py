"""The app's response header names spelled as the poll server writes them (X-Poll-Source, ETag,
Poll-Interval-Ms, Content-Type), not in lower case.

HTTP header names are case-insensitive, but a reader comparing the app's answer with the poll
server's (curl -i, the README's walk-through, a log of raw heads) sees one spelling on both.
Starlette keeps header names in lower case (as ASGI asks); uvicorn's h11 writes each name as it
is given. So this ASGI wrapper respells them in the `http.response.start` message, on the way
out, and adds the Date header itself (uvicorn runs with date_header=False: its own is `date`).
Only the spelling changes otherwise; no header is dropped or reordered.
"""

from __future__ import annotations

import time
from email.utils import formatdate

from starlette.types import ASGIApp, Message, Receive, Scope, Send

# Names whose usual spelling is not one capital per dash-separated word.
_SPECIAL = {b"etag": b"ETag", b"www-authenticate": b"WWW-Authenticate"}


def spell(name: bytes) -> bytes:
    """b"x-poll-source" -> b"X-Poll-Source"; b"etag" -> b"ETag"."""
    low = name.lower()
    return _SPECIAL.get(low) or b"-".join(w[:1].upper() + w[1:] for w in low.split(b"-"))


class HeaderCase:
    """ASGI middleware: every response header name through spell(), and a Date header."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self._second = -1
        self._date = b""

    def date(self) -> bytes:
        """The Date header's value (RFC 9110's IMF-fixdate), made once a second."""
        now = int(time.time())
        if now != self._second:
            self._second, self._date = now, formatdate(now, usegmt=True).encode("ascii")
        return self._date

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def respelled(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [(spell(n), v) for n, v in message.get("headers", [])]
                message = {**message, "headers": [(b"Date", self.date()), *headers]}
            await send(message)

        await self.app(scope, receive, respelled)


def create_app() -> ASGIApp:
    """What uvicorn serves (python -m fastpoll_app): the app, its header names respelled."""
    from .app import create_app as create

    return HeaderCase(create())
