"""A late cache write never replaces a newer answer (issue 10, item 3).

A fault-injecting proxy between the app and the cache keeps back one publish's cache write until
that publish has given up (timed out: 201 with X-Cache-Publish: pending), lets a newer publish
through, then delivers the old write. With an unconditional `set` the old answer would win; the
app's conditional writes (memcached cas on the unique of its own gets, Redis version compare)
make it lose. Runs for both caches and both stores."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

from fastpoll_app import config
from fastpoll_app.cache import make_cache
from fastpoll_app.service import FastPoll
from fastpoll_app.store import open_store

from .conftest import Server, make_settings
from .faultproxy import HoldingProxy

UID = 77
PUBLISH_TIMEOUT_MS = 300


def _is_write(chunk: bytes) -> bool:
    # memcached storage commands; redis-py's EVALSHA / EVAL of the put script
    return chunk.startswith((b"cas ", b"add ", b"set ")) or b"EVAL" in chunk


def _ask(srv: Server, command: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", srv.port), timeout=5) as s:
        s.sendall(command)
        time.sleep(0.05)
        return s.recv(65536)


def newest_id(answer: bytes | None) -> int:
    assert answer, "no answer cached"
    return int(json.loads(answer)["newest"]["id"])


def test_late_write_leaves_the_newer_answer(
    backend: tuple[str, Server], app_db: str, tmp_path: Path
) -> None:
    name, srv = backend
    proxy = HoldingProxy(srv.port, _is_write)
    if name == "memcached":
        text = f"[cache]\nbackend = memcached\n[memcached]\nservers = {proxy.addr}\n"
    else:
        text = f"[cache]\nbackend = redis\n[redis]\nserver = {proxy.addr}\n"
    settings: config.Settings = make_settings(tmp_path, text, app_db)
    fp = FastPoll(
        settings,
        open_store(settings.app),
        make_cache(settings),
        make_cache(settings, PUBLISH_TIMEOUT_MS),
    )
    key = fp.user_key(UID)
    try:
        one, written = fp.publish(UID, "one")
        assert written

        proxy.hold = True  # the next write stalls on its way to the cache
        two, written = fp.publish(UID, "two")
        assert written is False, "the stalled write should have timed out"
        assert proxy.held >= 1
        proxy.hold = False

        three, written = fp.publish(UID, "three")
        assert written
        assert newest_id(fp._fill.get(key)) == three.id

        before = _ask(srv, b"stats\r\n" if name == "memcached" else b"INFO commandstats\r\n")
        proxy.release()  # the stalled write of "two" lands now, after "three"
        time.sleep(0.5)
        after = _ask(srv, b"stats\r\n" if name == "memcached" else b"INFO commandstats\r\n")
        assert before != after, "the late write never reached the cache"
        if name == "memcached":
            stats = dict(
                line.split()[1:3] for line in after.decode().splitlines() if line.count(" ") == 2
            )
            assert int(stats["cas_badval"]) >= 1  # it arrived and was refused
        cached = fp._fill.get(key)
        assert newest_id(cached) == three.id, f"the late write of {two.id} won: {cached!r}"
        assert cached == fp.store.poll_answer(UID)
        assert fp.store.outbox_backlog() == 0  # "three" settled its version and the older one
    finally:
        proxy.release()
        fp.close()
        proxy.close()
