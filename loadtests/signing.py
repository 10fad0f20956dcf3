"""Signed poll URLs for the load generators (docs/security.md, "A user reads only their own
answers: signed, expiring poll URLs").

The stack signs poll URLs as production does: a poll without a valid `exp`/`sig` gets 403. The
signature covers the cache key, not the request, so every URL is signed once before the load and
replayed by wrk/ab until it expires. The bench writes the query strings of every user it will poll
to a file, one per line (`user_id=N&exp=E&sig=S`), and poll.lua builds its requests from it.

Bulk signing uses the app's own functions (fastpoll_app.keys.derive_key, fastpoll_app.signing.
signed_query) with the stack's secret, as Stack.sign() does, without its per-call overhead
(~85 µs a URL); the bench's sanity checks prove the URLs are accepted by nginx, the poll servers
and the app before any load.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from fastpoll_app.keys import derive_key
from fastpoll_app.signing import load_secrets, signed_query
from loadtests.preload import PARAMS, POLL_PATH, PREFIX

if TYPE_CHECKING:
    from fastpoll_testkit.stack import Stack

TTL_S = 3600  # the stack's [signing] ttl: longer than any run, not longer than allowed


class Signer:
    def __init__(self, stack: Stack) -> None:
        self.stack = stack
        secret_path: Path = stack.secret_path
        self.enabled = bool(getattr(stack, "signing", False)) and secret_path.exists()
        self.secret = load_secrets(secret_path)[0] if self.enabled else b""
        self.exp = int(time.time()) + TTL_S

    def query(self, uid: str) -> str:
        """`user_id=<uid>` plus its signature, for /Poll/getMessages (nginx) or /getMessages."""
        q = f"user_id={uid}"
        if not self.enabled:
            return q
        key = derive_key(PREFIX, POLL_PATH + b"?" + q.encode(), PARAMS)
        return f"{q}&{signed_query(self.secret, key, self.exp).decode()}"

    def write(self, path: Path, uids: Iterable[str]) -> Path:
        with path.open("w") as f:
            for uid in uids:
                f.write(self.query(uid) + "\n")
        return path
