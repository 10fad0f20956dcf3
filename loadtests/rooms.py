"""A room's delivery, fastpoll and Nchan side by side (issue 24, "Benchmarks").

    .venv/bin/python -m loadtests.rooms [--members 1000] [--seconds 30] [--rate 1]

One run, both systems on this machine, one after the other:

- fastpoll: a fresh stack from the harness (memcached, announcements on the stack's Redis,
  `[server] max_held` 20,000, `make up`'s 2 poll servers and nginx). Each member polls its own key
  and the room's with one URL from the app's POST /api/poll-url (`ch=<room>`), as
  client/fastpoll.js does: `wait=25` and the last ETag in If-None-Match. A message is a POST
  /api/channels/<room>/messages to the app (its write, the room key's, the announcement).
- Nchan: nginx with Debian's libnginx-mod-nchan (loadtests/longpoll_nchan.py's configuration) and
  a location whose subscribers wait on two channels at once (`nchan_channel_id $arg_room
  $arg_user`, Nchan's multiplexed channels): the room's and the member's own. A message is a POST
  /pub/<room>.

Once 99% of the members are held, `--rate` messages a second go to the room for `--seconds`
(loadtests/longpoll_client.py's clients and delivery accounting, every member expecting every
message). Reported, not asserted: publish-to-delivery p50/p99 over every member and message (from
the publish request's send to the member's read of an answer holding the message's marker), CPU
per delivered message (utime+stime from /proc over the publish window and the last deliveries, of
every server process: fastpoll's nginx, poll servers, app, Redis and memcached; Nchan's nginx),
memory per 1,000 held members (Pss with them held minus before they connected) and errors.

JSON: loadtests/results/rooms-<stamp>.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from fastpoll_testkit.stack import Stack, free_port
from loadtests import preload, sysinfo
from loadtests.longpoll import metric_sum, nchan_subscribers, pss_kb, tree
from loadtests.longpoll_client import HoldRun, marker_of, quantile_ms
from loadtests.longpoll_nchan import NchanPeer

RESULTS = Path(__file__).resolve().parent / "results"
ROOM = "benchroom"  # a channel name for both: [A-Za-z0-9_-]
WAIT_S = 25

# Nchan's subscribers of a room and their own channel: one long-poll on both.
NCHAN_ROOM_LOCATION = """
        location = /lpm {
            nchan_subscriber longpoll;
            nchan_channel_id $arg_room $arg_user;
            nchan_subscriber_timeout 25s;
        }
"""


class NchanRooms(NchanPeer):
    """NchanPeer with the multiplexed location."""

    def render(self) -> Path:
        conf = super().render()
        text = conf.read_text()
        anchor = "        location = /healthz"
        conf.write_text(text.replace(anchor, NCHAN_ROOM_LOCATION + anchor, 1))
        return conf


def start_fastpoll(run_dir: Path) -> Stack:
    redis_port = free_port()
    stack = Stack(
        run_dir=run_dir,
        backend="memcached",
        redis_port=redis_port,
        extra_ini={
            "announce": {
                "server": f"127.0.0.1:{redis_port}",
                "password_file": str(run_dir / "redis.pass"),
            },
            "server": {"max_held": "20000"},
        },
    )
    stack.start()
    stack.wait_subscribed()
    return stack


async def measure(
    run: HoldRun,
    groups: dict[str, list[int]],
    held: Callable[[], int],
    send: Callable[[str], Awaitable[int]],
    seconds: float,
    rate: float,
) -> dict[str, Any]:
    """Hold every member, publish to the room, measure (see the top of the file)."""
    n = len(run.users)
    pss_before = {g: pss_kb(p) for g, p in groups.items()}
    tasks = await run.hold()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if await asyncio.to_thread(held) >= 0.99 * n:
            break
        await asyncio.sleep(0.25)
    await asyncio.sleep(1.0)
    pss_held = {g: pss_kb(p) for g, p in groups.items()}
    n_held = await asyncio.to_thread(held)
    meter = sysinfo.CpuMeter(groups)
    meter.start()
    t0 = time.monotonic()
    statuses: list[int] = []
    pubs: list[asyncio.Task[None]] = []

    async def one(seq: int) -> None:
        sent = time.monotonic()
        for u in run.users:
            run.deliveries.published(u, marker_of(seq), sent)
        try:
            statuses.append(await send(f"lp{seq}"))
        except httpx.HTTPError as e:
            run.errors[f"publish_{type(e).__name__}"] += 1

    for seq in range(1, int(seconds * rate) + 1):
        await asyncio.sleep(max(0.0, t0 + (seq - 1) / rate - time.monotonic()))
        pubs.append(asyncio.create_task(one(seq)))
    await asyncio.gather(*pubs)
    await run.drain(10.0)
    window = time.monotonic() - t0
    cpu = meter.stop()
    run.stopping = True
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    lat = run.deliveries.latencies_s
    delivered, cpu_total = len(lat), sum(cpu.values())
    errors = dict(run.errors)
    if run.deliveries.undelivered():
        errors["undelivered_after_10s"] = run.deliveries.undelivered()
    return {
        "members": n,
        "held_by_server": n_held,
        "messages": len(pubs),
        "publish_status": {str(s): statuses.count(s) for s in set(statuses)},
        "delivered": delivered,
        "p50_ms": quantile_ms(lat, 0.5),
        "p99_ms": quantile_ms(lat, 0.99),
        "max_ms": round(max(lat) * 1000, 1) if lat else None,
        "cpu_window_s": round(window, 2),
        "cpu_s": cpu,
        "cpu_us_per_delivered": round(cpu_total / delivered * 1e6, 1) if delivered else None,
        "pss_kb_per_1000_held": {
            g: round((pss_held[g] - pss_before[g]) / n * 1000) for g in groups
        },
        "pss_kb_per_1000_held_total": round(
            sum(pss_held[g] - pss_before[g] for g in groups) / n * 1000
        ),
        "poll_answers": dict(run.statuses),
        "errors": errors,
    }


async def fastpoll_run(run_dir: Path, members: int, seconds: float, rate: float) -> dict[str, Any]:
    stack = start_fastpoll(run_dir)
    try:
        preload.preload([f"127.0.0.1:{p}" for p in stack.memcached_ports], members)
        headers = {"Authorization": f"Bearer {stack.api_token}"}
        async with httpx.AsyncClient(base_url=stack.app_url(), headers=headers, timeout=30) as api:
            r = await api.post(f"/api/channels/{ROOM}/messages", json={"text": "open"})
            r.raise_for_status()
            urls: dict[int, str] = {}
            for u in range(1, members + 1):
                r = await api.post("/api/poll-url", json={"user_id": u, "channels": [ROOM]})
                r.raise_for_status()
                urls[u] = r.json()["url"]

            async def send(text: str) -> int:
                r = await api.post(f"/api/channels/{ROOM}/messages", json={"text": text})
                return r.status_code

            run = HoldRun(
                port=stack.http_port,
                users=list(range(1, members + 1)),
                target=lambda u: f"{urls[u]}&wait={WAIT_S}",
                mode="etag",
                publish=lambda u, t: send(t),
                wait_s=WAIT_S,
            )
            p = stack.procs
            groups = {
                "nginx": tree(p["nginx"].pid),
                "poll_servers": [v.pid for k, v in p.items() if k.startswith("poller-")],
                "app": tree(p["app"].pid),
                "redis": [p["redis"].pid],
                "memcached": [v.pid for k, v in p.items() if k.startswith("memcached-")],
            }
            ports = stack.admin_ports
            out = await measure(
                run, groups, lambda: int(metric_sum(ports, "fastpoll_held_requests")),
                send, seconds, rate,
            )
            out["system"] = "fastpoll"
            return out
    finally:
        stack.stop()


async def nchan_run(run_dir: Path, members: int, seconds: float, rate: float) -> dict[str, Any]:
    peer = NchanRooms.at(run_dir)
    peer.start()
    try:
        async with httpx.AsyncClient(base_url=peer.base_url, timeout=30) as pub:

            async def send(text: str) -> int:
                body = json.dumps({"messages": [{"id": 0, "text": text}]}).encode()
                r = await pub.post(f"/pub/{ROOM}", content=body)
                return r.status_code

            run = HoldRun(
                port=peer.port,
                users=list(range(1, members + 1)),
                target=lambda u: f"/lpm?room={ROOM}&user=u{u}",
                mode="nchan",
                publish=lambda u, t: send(t),
                publish_ok=(201, 202),
                wait_s=WAIT_S,
            )
            out = await measure(
                run, {"nginx": tree(peer.pid)}, lambda: nchan_subscribers(peer.base_url),
                send, seconds, rate,
            )
            out["system"] = "nchan"
            return out
    finally:
        peer.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--members", type=int, default=1000)
    ap.add_argument("--seconds", type=float, default=30)
    ap.add_argument("--rate", type=float, default=1.0)
    args = ap.parse_args()
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    run_dir = Path(os.environ.get("FP_RUN_DIR", f"/tmp/fastpoll-rooms-{stamp}"))
    load0 = os.getloadavg()
    runs = [
        asyncio.run(fastpoll_run(run_dir / "fastpoll", args.members, args.seconds, args.rate)),
        asyncio.run(nchan_run(run_dir / "nchan", args.members, args.seconds, args.rate)),
    ]
    doc = {
        "stamp": stamp,
        "members": args.members,
        "seconds": args.seconds,
        "rate": args.rate,
        "cpus": os.cpu_count(),
        "loadavg_start": load0,
        "loadavg_end": os.getloadavg(),
        "runs": runs,
    }
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"rooms-{stamp}.json"
    out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"{'system':9} {'held':>6} {'msgs':>5} {'delivered':>9} {'p50 ms':>8} {'p99 ms':>8} "
          f"{'CPU us/msg':>10} {'KB/1000':>8} errors")
    for r in runs:
        print(f"{r['system']:9} {r['held_by_server']:>6} {r['messages']:>5} {r['delivered']:>9} "
              f"{r['p50_ms']!s:>8} {r['p99_ms']!s:>8} {r['cpu_us_per_delivered']!s:>10} "
              f"{r['pss_kb_per_1000_held_total']:>8} {r['errors']}")
    print(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
