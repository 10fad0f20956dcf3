"""Preload poll answers for users 1..N, the way the app writes them.

Keys come from the app's own key function (fastpoll_app.keys.derive_key, the Python twin of the
poll server's key_derive), and are spread over the memcached servers by pylibmc with ketama, as the
app does, so the poll server finds each one where it looks. Values never expire during a run.
"""

from __future__ import annotations

import random

import pylibmc
from fastpoll_app.keys import derive_key

PREFIX = b"/Poll"
POLL_PATH = b"/getMessages"
PARAMS = (b"user_id",)


def answer(user: int) -> bytes:
    """The cached answer of a preloaded user; poll.lua recognises exactly this shape."""
    return b'{"unread":1,"newest":{"id":%d,"text":"bench %d"}}' % (user, user)


def key(user: int) -> bytes:
    return derive_key(PREFIX, POLL_PATH + b"?user_id=%d" % user, PARAMS)


def client(servers: list[str]) -> pylibmc.Client:
    return pylibmc.Client(servers, binary=False, behaviors={"ketama": True, "tcp_nodelay": True})


def preload(servers: list[str], users: int, batch: int = 2000) -> None:
    mc = client(servers)
    try:
        for start in range(1, users + 1, batch):
            chunk = {key(u): answer(u) for u in range(start, min(start + batch, users + 1))}
            failed = mc.set_multi(chunk, time=0)
            if failed:
                raise RuntimeError(f"memcached refused {len(failed)} keys, e.g. {failed[:3]}")
        sample = random.Random(7).sample(range(1, users + 1), min(users, 500))
        got = mc.get_multi([key(u) for u in sample])
        bad = [u for u in sample if got.get(key(u)) != answer(u)]
        if bad:
            raise RuntimeError(f"preload check failed for users {bad[:5]}")
    finally:
        mc.disconnect_all()
