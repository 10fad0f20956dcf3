"""A poll server's memory per held room stream, with a room that has content.

`python -m loadtests.stream_memory [--members N] [--messages M] [--text-chars C]`: one stack
(memcached, one poll server: FP_POLL_SERVER picks its build); a room of M messages of C
characters; N users, each with a signed URL of their own key and the room, polled once through
nginx (their keys cached); then N event streams of those URLs held straight on the poll server.
Reported: the poll server's Pss (smaps_rollup) before and with them held, per stream, and how many
streams got the room's answer as their first event. `make bench-rooms` measures the same per
1,000 members on a room that is empty when they connect; this one shows what a room's own size
adds per member.
"""

from __future__ import annotations

import argparse
import re
import socket
import tempfile
import time
from pathlib import Path

import httpx

from fastpoll_testkit.helpers import new_uid, start_stack
from fastpoll_testkit.sse import read_first_event


def pss_kb(pid: int) -> int:
    text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    m = re.search(r"^Pss:\s+(\d+) kB", text, re.M)
    return int(m.group(1)) if m else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--members", type=int, default=1000)
    ap.add_argument("--messages", type=int, default=20)
    ap.add_argument("--text-chars", type=int, default=150)
    args = ap.parse_args()
    run_dir = Path(tempfile.mkdtemp(prefix="fastpoll-stream-memory-"))
    stack = start_stack(
        run_dir, "memcached", n_pollers=1, extra_ini={"stream": {"max": str(args.members * 2)}}
    )
    socks: list[socket.socket] = []
    try:
        room = f"r{new_uid()}"
        urls: list[str] = []
        with stack.api() as api, httpx.Client(base_url=stack.base_url, timeout=10) as web:
            for i in range(args.messages):
                text = f"{i:04d} " + "x" * max(0, args.text_chars - 5)
                r = api.post(f"/api/channels/{room}/messages", json={"text": text})
                r.raise_for_status()
            for _ in range(args.members):
                r = api.post("/api/poll-url", json={"user_id": new_uid(), "channels": [room]})
                r.raise_for_status()
                url = str(r.json()["url"])
                web.get(url).raise_for_status()
                urls.append(url)
            room_bytes = len(web.get(urls[0]).content)
        pid = stack.procs["poller-0"].pid
        time.sleep(1)
        before = pss_kb(pid)
        for url in urls:
            s = socket.create_connection(("127.0.0.1", stack.poller_ports[0]))
            socks.append(s)
            target = url.removeprefix("/Poll")
            s.sendall(
                f"GET {target} HTTP/1.1\r\nHost: x\r\nAccept: text/event-stream\r\n\r\n".encode()
            )
        answered = sum(b"\nid: " in b"\n" + read_first_event(s, 10.0) for s in socks)
        time.sleep(1)
        held = pss_kb(pid)
        print(
            f"{args.members} streams of one room ({args.messages} messages of "
            f"{args.text_chars} characters, a {room_bytes}-byte answer), {answered} with its "
            f"answer: the poll server's Pss {before} kB before, {held} kB with them held, "
            f"{(held - before) * 1024 / args.members:.0f} bytes per held stream"
        )
        return 0 if answered == args.members else 1
    finally:
        for s in socks:
            s.close()
        stack.stop()


if __name__ == "__main__":
    raise SystemExit(main())
