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


APP_USER_BASE = 1_000_000  # the app-alone runs poll users APP_USER_BASE+1 .. +count


def seed_app(
    app_port: int, count: int, base: int = APP_USER_BASE, workers: int = 8, token: str = ""
) -> float:
    """Give users base+1..base+count one unread message each, through the app's own API.

    The app-alone runs poll these users (with the id written 0NNN, which the app answers without
    touching the cache), so it computes a real answer from SQLite, not an empty one.
    `token` is the write API's bearer token ([app] api_token_file; Stack.api_token).
    Returns the seconds it took.
    """
    import http.client
    import json
    import time
    from concurrent.futures import ThreadPoolExecutor

    def post_range(users: range) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", app_port, timeout=10)
        try:
            for u in users:
                body = json.dumps({"user_id": u, "text": f"bench message for {u}"})
                headers = {"Content-Type": "application/json"}
                if token:
                    headers["Authorization"] = f"Bearer {token}"
                conn.request("POST", "/api/messages", body, headers)
                r = conn.getresponse()
                r.read()
                if r.status != 201:
                    raise RuntimeError(f"seeding the app: POST for user {u} got {r.status}")
        finally:
            conn.close()

    t0 = time.monotonic()
    step = -(-count // workers)
    chunks = [
        range(base + 1 + i, min(base + count, base + i + step) + 1) for i in range(0, count, step)
    ]
    with ThreadPoolExecutor(workers) as pool:
        for f in [pool.submit(post_range, c) for c in chunks]:
            f.result()
    return time.monotonic() - t0
