"""A room's delivery, fastpoll and Nchan side by side (docs/benchmarks.md).

    .venv/bin/python -m loadtests.rooms [--members 1000] [--seconds 30] [--rate 1]
                                        [--rounds 2] [--clients N] [--jitter-pct N]
                                        [--perf DIR] [--systems fastpoll nchan ...]

Every system on this machine, in interleaved rounds (fastpoll, Nchan, ..., fastpoll, Nchan, ...:
other work's load on a shared machine falls on all alike), each round on a fresh stack:

- fastpoll: a fresh stack from the harness (memcached, announcements on the stack's Redis,
  `[server] max_held` 20,000, `make up`'s 2 poll servers and nginx). Each member polls its own key
  and the room's with one URL from the app's POST /api/poll-url (`ch=<room>`), as
  client/fastpoll.js does: `wait=25` and the last ETag in If-None-Match. A message is a POST
  /api/channels/<room>/messages to the app (its write, the room key's, the announcement).
- Nchan: nginx with Debian's libnginx-mod-nchan (loadtests/longpoll_nchan.py's configuration) and
  a location whose subscribers wait on two channels at once (`nchan_channel_id $arg_room
  $arg_user`, Nchan's multiplexed channels): the room's and the member's own. A message is a POST
  /pub/<room>.

Event streams, in the same rounds (`--systems` picks among the five; the default is all of them):

- fastpoll-stream: the same fastpoll stack; each member holds one event stream of the same
  signed room URL (no `wait=`; `Accept: text/event-stream`: nginx's @poll_stream, unbuffered, to
  a poll server). Held: the poll servers' `fastpoll_streams`.
- nchan-eventsource: the Nchan peer, its EventSource subscribers on the same multiplexed
  channels (`/esm`: `nchan_subscriber eventsource`, the same `nchan_channel_id $arg_room
  $arg_user`; no subscriber timeout, where the long poll's 25 s would end every stream within the
  publish window).
- proxied-stream, the floor: nginx with the stack's worker settings (2 on 2 cores, its
  worker_connections, rlimit and multi_accept) proxying each stream, unbuffered, to
  loadtests/peers/stream_back.c (built here with gcc): a trivial epoll server on a unix socket
  that, when a message is POSTed to it (by this process, on its socket), writes `data: <the
  body>` to every held stream; no JSON, no cache. CPU: nginx and stream_back.

A stream member (loadtests/stream_client.py) reads each event's data and is delivered each
marker at the first event holding it; a marker it never reads is a miss (`misses`, every
system: (member, message) pairs never delivered within 10 s of the last publish). A stream that
ends is counted and reconnected with Last-Event-ID.

The members are held by `--clients` client processes (default one per 2,500 members: one Python
process cannot read 10,000 answers a second, and would measure itself; each process also stays far
below the 20,000 open files a process may have here), each running loadtests/longpoll_client.py's
clients on its share of the members. Once 99% of the members are held, `--rate` messages a second
go to the room for `--seconds` from this process, every member expecting every message. A member's
message is delivered when its client reads a 200 holding the message's marker or a later one
(fastpoll's room answer shows the newest messages: a late client gets several in one answer,
counted as `superseded`). Reported, not asserted: publish-to-delivery p50/p99 over every member and
message (from the publish request's send to the member's read of an answer holding the message's
marker), CPU per delivered message (utime+stime from /proc over the publish window and the last
deliveries, of every server process: fastpoll's nginx, poll servers, app, Redis and memcached;
Nchan's nginx), memory per 1,000 held members (Pss with them held minus before they connected) and
errors. The clients' CPU is not counted. Every round records the load average at its start and end;
the summary is the median of the rounds per system.

`--jitter-pct N`: one more system in each round, `fastpoll-jitter<N>`: fastpoll with `[poll]
jitter_pct` N instead of the shipped 20. A held poll that ends is paced 0 plus that jitter of the
1 s interval, so a room's members, woken together, ask again spread over 0-200 ms; with 0 they ask
again at once. Such a run (the page's note on the spread) is stored as
rooms-jitter<N>-<stamp>.json, which the page's main table never takes.

`--rate R` other than 1 (a busy room, the page's own section): stored as rooms-rate<R>-<stamp>.json.

`--perf DIR`: fastpoll's server processes are also sampled with `perf record -g` over the publish
window (DIR/<system>-r<round>.data), and the JSON gets each round's profile: the samples' shares
by process and object (the kernel's share is the system calls and the network stack) and the
poll servers' top symbols. Sampling costs CPU: such a run's CPU per message is not comparable,
so it is stored as rooms-perf-<stamp>.json (rooms-perf-stream-<stamp>.json when fastpoll-stream
is the only fastpoll system), which the page's tables never take.

JSON: loadtests/results/rooms-<stamp>.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import re
import resource
import signal
import statistics
import subprocess
import time
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import httpx

from fastpoll_testkit.procs import Server, free_port
from fastpoll_testkit.stack import POLL_SERVER, Stack
from loadtests import preload, sysinfo
from loadtests.longpoll import metric_sum, nchan_subscribers, pss_kb, tree
from loadtests.longpoll_client import Deliveries, HoldRun, quantile_ms
from loadtests.longpoll_nchan import NchanPeer
from loadtests.peers import Peer
from loadtests.perf import perf_profile, perf_start, perf_stop
from loadtests.stream_client import StreamDeliveries, StreamRun

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
ROOM = "benchroom"  # a channel name for both: [A-Za-z0-9_-]
WAIT_S = 25
MEMBERS_PER_CLIENT = 2500
SEQ = re.compile(rb'"lp(\d+)"')

# Nchan's subscribers of a room and their own channel: one long-poll on both; and the same
# multiplexed channels for EventSource subscribers, with no subscriber timeout (a long poll's
# 25 s would end every stream within the publish window).
NCHAN_ROOM_LOCATION = """
        location = /lpm {
            nchan_subscriber longpoll;
            nchan_channel_id $arg_room $arg_user;
            nchan_subscriber_timeout 25s;
        }
        location = /esm {
            nchan_subscriber eventsource;
            nchan_channel_id $arg_room $arg_user;
            nchan_subscriber_timeout 0;
        }
"""
SYSTEMS = ("fastpoll", "nchan", "fastpoll-stream", "nchan-eventsource", "proxied-stream")
STREAM_SYSTEMS = ("fastpoll-stream", "nchan-eventsource", "proxied-stream")
STREAM_BACK_SRC = HERE / "peers" / "stream_back.c"
# The stack's nginx settings (nginx/nginx-local.conf.j2's defaults, as Stack renders them).
FLOOR_TUNING: dict[str, object] = {
    "worker_processes": "auto",
    "worker_rlimit_nofile": 20000,
    "worker_connections": 19500,
    "multi_accept": True,
    "listen_options": " backlog=4096 reuseport",
}


class NchanRooms(NchanPeer):
    """NchanPeer with the multiplexed location."""

    def render(self) -> Path:
        conf = super().render()
        text = conf.read_text()
        anchor = "        location = /healthz"
        conf.write_text(text.replace(anchor, NCHAN_ROOM_LOCATION + anchor, 1))
        return conf


def git_head() -> str | None:
    """This tree's commit, "+dirty" if it has uncommitted changes."""

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", *args],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
            cwd=RESULTS.parent,
        ).stdout.strip()

    try:
        head = git("rev-parse", "--short", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return None
    return head + ("+dirty" if dirty else "")


def start_fastpoll(run_dir: Path, jitter_pct: int | None = None) -> Stack:
    redis_port = free_port()
    ini: dict[str, dict[str, str]] = {
        "announce": {
            "server": f"127.0.0.1:{redis_port}",
            "password_file": str(run_dir / "redis.pass"),
        },
        "server": {"max_held": "20000"},
    }
    if jitter_pct is not None:
        ini["poll"] = {"jitter_pct": str(jitter_pct)}
    stack = Stack(run_dir=run_dir, backend="memcached", redis_port=redis_port, extra_ini=ini)
    stack.start()
    stack.wait_subscribed()
    return stack


# ---- the client processes ---------------------------------------------------------------------


class SeqDeliveries(Deliveries):
    """Every member expects every room message lp1, lp2, ...: an answer whose newest marker is
    lpM delivers every message after the member's last one up to M, at its read."""

    def __init__(self, progress: Any) -> None:
        super().__init__()
        self.last: dict[int, int] = {}
        self.times: defaultdict[int, list[float]] = defaultdict(list)
        self.progress = progress

    def answer(self, user: int, body: bytes, t: float) -> int:
        seqs = [int(m) for m in SEQ.findall(body)]
        last = self.last.get(user, 0)
        newest = max(seqs, default=0)
        if newest <= last:
            return 0
        for seq in range(last + 1, newest + 1):
            self.times[seq].append(t)
        self.superseded += newest - last - 1
        self.last[user] = newest
        self.progress.value += newest - last
        return newest - last

    def undelivered(self) -> int:
        return 0


async def _client_main(
    port: int, targets: dict[int, str], mode: str, progress: Any, stop: Any
) -> dict[str, Any]:
    """Hold the members (long polls, or streams with mode "stream") until `stop`."""

    async def no_publish(user: int, text: str) -> int:
        return 0

    deliveries: SeqDeliveries | StreamDeliveries
    run: HoldRun | StreamRun
    if mode == "stream":
        deliveries = StreamDeliveries(progress)
        run = StreamRun(
            port=port, users=sorted(targets), target=targets.__getitem__, deliveries=deliveries
        )
    else:
        deliveries = SeqDeliveries(progress)
        run = HoldRun(
            port=port,
            users=sorted(targets),
            target=targets.__getitem__,
            mode=mode,
            publish=no_publish,
            wait_s=WAIT_S,
            deliveries=deliveries,
        )
    tasks = await run.hold()
    while not stop.is_set():
        await asyncio.sleep(0.1)
    run.stopping = True
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return {
        "times": dict(deliveries.times),
        "superseded": deliveries.superseded,
        "statuses": dict(run.statuses),
        "errors": dict(run.errors),
    }


def client_process(
    port: int, targets: dict[int, str], mode: str, progress: Any, stop: Any, out: Connection
) -> None:
    """One client process: its members' polls until `stop`, then its deliveries to `out`."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops it
    out.send(asyncio.run(_client_main(port, targets, mode, progress, stop)))
    out.close()


class Clients:
    """The members spread over client processes (spawned: no asyncio state inherited)."""

    def __init__(self, port: int, targets: dict[int, str], mode: str, nproc: int) -> None:
        self.n = len(targets)
        ctx = mp.get_context("spawn")
        self.stop_ev = ctx.Event()
        users = sorted(targets)
        self.procs: list[tuple[Any, Any, Connection]] = []
        for i in range(nproc):
            share = {u: targets[u] for u in users[i::nproc]}
            progress = ctx.Value("q", 0, lock=False)  # one writer: its process
            recv, send = ctx.Pipe(duplex=False)
            proc = ctx.Process(
                target=client_process,
                args=(port, share, mode, progress, self.stop_ev, send),
                daemon=True,
            )
            self.procs.append((proc, progress, recv))

    def start(self) -> None:
        for proc, _, _ in self.procs:
            proc.start()

    def delivered(self) -> int:
        return sum(int(v.value) for _, v, _ in self.procs)

    def stop(self) -> dict[str, Any]:
        self.stop_ev.set()
        times: defaultdict[int, list[float]] = defaultdict(list)
        statuses: Counter[str] = Counter()
        errors: Counter[str] = Counter()
        superseded = 0
        for proc, _, recv in self.procs:
            if recv.poll(60):
                r = recv.recv()
                for seq, ts in r["times"].items():
                    times[seq].extend(ts)
                statuses.update(r["statuses"])
                errors.update(r["errors"])
                superseded += r["superseded"]
            else:
                errors["client_process_no_result"] += 1
            proc.join(10)
            if proc.is_alive():
                proc.kill()
        return {"times": times, "statuses": statuses, "errors": errors, "superseded": superseded}


# ---- one system's round -----------------------------------------------------------------------


async def measure(
    clients: Clients,
    groups: dict[str, list[int]],
    held: Callable[[], int],
    send: Callable[[str], Awaitable[int]],
    seconds: float,
    rate: float,
    perf_data: Path | None = None,
) -> dict[str, Any]:
    """Hold every member, publish to the room, measure (see the top of the file)."""
    n = clients.n
    load0 = os.getloadavg()
    pss_before = {g: pss_kb(p) for g, p in groups.items()}
    clients.start()
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        if await asyncio.to_thread(held) >= 0.99 * n:
            break
        await asyncio.sleep(0.25)
    await asyncio.sleep(1.0)
    pss_held = {g: pss_kb(p) for g, p in groups.items()}
    n_held = await asyncio.to_thread(held)
    perf = perf_start([p for ps in groups.values() for p in ps], perf_data) if perf_data else None
    meter = sysinfo.CpuMeter(groups)
    meter.start()
    t0 = time.monotonic()
    statuses: list[int] = []
    sent: dict[int, float] = {}
    errors: Counter[str] = Counter()
    pubs: list[asyncio.Task[None]] = []

    async def one(seq: int) -> None:
        sent[seq] = time.monotonic()
        try:
            statuses.append(await send(f"lp{seq}"))
        except httpx.HTTPError as e:
            errors[f"publish_{type(e).__name__}"] += 1

    for seq in range(1, int(seconds * rate) + 1):
        await asyncio.sleep(max(0.0, t0 + (seq - 1) / rate - time.monotonic()))
        pubs.append(asyncio.create_task(one(seq)))
    await asyncio.gather(*pubs)
    expected = n * len(pubs)
    end = time.monotonic() + 10.0
    while clients.delivered() < expected and time.monotonic() < end:
        await asyncio.sleep(0.05)
    window = time.monotonic() - t0
    cpu = meter.stop()
    perf_stop(perf)
    res = await asyncio.to_thread(clients.stop)
    profile = (
        await asyncio.to_thread(perf_profile, perf_data, ("poll_server", "nginx"))
        if perf and perf_data
        else None
    )
    lat = [t - sent[seq] for seq, ts in res["times"].items() if seq in sent for t in ts]
    delivered, cpu_total = len(lat), sum(cpu.values())
    # A stream's answers are its events; a long poll's, its 200s.
    answers = res["statuses"].get("event", res["statuses"].get("200", 0))
    errors.update(res["errors"])
    if delivered < expected:
        errors["undelivered_after_10s"] = expected - delivered
    return {
        "members": n,
        "client_processes": len(clients.procs),
        "held_by_server": n_held,
        "messages": len(pubs),
        "publish_status": {str(s): statuses.count(s) for s in set(statuses)},
        "delivered": delivered,
        # (member, message) pairs whose marker the member never read
        "misses": expected - delivered,
        "superseded": res["superseded"],
        "p50_ms": quantile_ms(lat, 0.5),
        "p99_ms": quantile_ms(lat, 0.99),
        "max_ms": round(max(lat) * 1000, 1) if lat else None,
        "cpu_window_s": round(window, 2),
        "cpu_s": cpu,
        "cpu_us_per_delivered": round(cpu_total / delivered * 1e6, 1) if delivered else None,
        "cpu_us_per_delivered_by_group": {
            g: round(v / delivered * 1e6, 1) if delivered else None for g, v in cpu.items()
        },
        "cpu_us_per_answer": round(cpu_total / answers * 1e6, 1) if answers else None,
        "pss_kb_per_1000_held": {
            g: round((pss_held[g] - pss_before[g]) / n * 1000) for g in groups
        },
        "pss_kb_per_1000_held_total": round(
            sum(pss_held[g] - pss_before[g] for g in groups) / n * 1000
        ),
        "poll_answers": dict(res["statuses"]),
        "errors": dict(errors),
        "loadavg_start": load0,
        "loadavg_end": os.getloadavg(),
        **({"perf": profile} if profile else {}),
    }


async def fastpoll_run(
    run_dir: Path,
    members: int,
    seconds: float,
    rate: float,
    nproc: int,
    perf_data: Path | None = None,
    jitter_pct: int | None = None,
    stream: bool = False,
) -> dict[str, Any]:
    """fastpoll's round: long polls, or with `stream` one event stream per member (the same
    signed URL, no wait=, Accept: text/event-stream: nginx's @poll_stream)."""
    stack = start_fastpoll(run_dir, jitter_pct)
    try:
        preload.preload([f"127.0.0.1:{p}" for p in stack.memcached_ports], members)
        headers = {"Authorization": f"Bearer {stack.api_token}"}
        async with httpx.AsyncClient(base_url=stack.app_url(), headers=headers, timeout=30) as api:
            r = await api.post(f"/api/channels/{ROOM}/messages", json={"text": "open"})
            r.raise_for_status()
            urls: dict[int, str] = {}
            gate = asyncio.Semaphore(16)

            async def url_of(u: int) -> None:
                async with gate:
                    r = await api.post("/api/poll-url", json={"user_id": u, "channels": [ROOM]})
                r.raise_for_status()
                urls[u] = r.json()["url"] + ("" if stream else f"&wait={WAIT_S}")

            await asyncio.gather(*(url_of(u) for u in range(1, members + 1)))

            async def send(text: str) -> int:
                r = await api.post(f"/api/channels/{ROOM}/messages", json={"text": text})
                return r.status_code

            p = stack.procs
            groups = {
                "nginx": tree(p["nginx"].pid),
                "poll_servers": [v.pid for k, v in p.items() if k.startswith("poller-")],
                "app": tree(p["app"].pid),
                "redis": [p["redis"].pid],
                "memcached": [v.pid for k, v in p.items() if k.startswith("memcached-")],
            }
            ports = stack.admin_ports
            gauge = "fastpoll_streams" if stream else "fastpoll_held_requests"
            out = await measure(
                Clients(stack.http_port, urls, "stream" if stream else "etag", nproc),
                groups,
                lambda: int(metric_sum(ports, gauge)),
                send,
                seconds,
                rate,
                perf_data,
            )
    finally:
        stack.stop()
    out["poll_server_warnings"] = poller_warnings(stack)
    return out


def poller_warnings(stack: Stack) -> list[str]:
    """The poll servers' warnings and errors over the run (a cache connection closed as hung,
    say), without their timestamps and pids: what a failed round's errors come from."""
    lines: Counter[str] = Counter()
    for _, raw in stack.poller_log_lines():
        line = raw.decode(errors="replace")
        if " warn: " in line or " error: " in line:
            lines[line.split("] ", 1)[-1]] += 1
    return [f"{n} × {line}" for line, n in lines.most_common(10)]


async def nchan_run(
    run_dir: Path, members: int, seconds: float, rate: float, nproc: int, stream: bool = False
) -> dict[str, Any]:
    """Nchan's round: long polls on /lpm, or with `stream` EventSource subscribers on /esm."""
    peer = NchanRooms.at(run_dir)
    peer.start()
    try:
        async with httpx.AsyncClient(base_url=peer.base_url, timeout=30) as pub:

            async def send(text: str) -> int:
                body = json.dumps({"messages": [{"id": 0, "text": text}]}).encode()
                r = await pub.post(f"/pub/{ROOM}", content=body)
                return r.status_code

            loc = "/esm" if stream else "/lpm"
            targets = {u: f"{loc}?room={ROOM}&user=u{u}" for u in range(1, members + 1)}
            return await measure(
                Clients(peer.port, targets, "stream" if stream else "nchan", nproc),
                {"nginx": tree(peer.pid)},
                lambda: nchan_subscribers(peer.base_url),
                send,
                seconds,
                rate,
            )
    finally:
        peer.stop()


def build_stream_back(out_dir: Path) -> Path:
    """loadtests/peers/stream_back.c, built here with gcc (the bench's own build)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    binary = out_dir / "stream_back"
    subprocess.run(
        ["gcc", "-O2", "-Wall", "-Wextra", "-Werror", "-o", str(binary), str(STREAM_BACK_SRC)],
        check=True,
        timeout=120,
    )
    return binary


def stream_back_stats(sock: Path) -> tuple[int, int]:
    """stream_back's held streams and the streams it dropped (GET /stats on its socket)."""
    with httpx.Client(transport=httpx.HTTPTransport(uds=str(sock)), timeout=5) as c:
        held, dropped = c.get("http://stream_back/stats").text.split()
    return int(held), int(dropped)


async def floor_run(
    run_dir: Path, members: int, seconds: float, rate: float, nproc: int
) -> dict[str, Any]:
    """The floor: nginx (the stack's worker settings) proxying each member's stream, unbuffered,
    to stream_back (loadtests/peers/stream_back.c), which writes each publish to every stream."""
    run_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(run_dir, 0o755)  # nginx's workers (nobody, when we are root) reach the socket
    binary = build_stream_back(run_dir)
    sock = run_dir / "stream_back.sock"
    back = Server(
        "stream_back",
        [str(binary), str(sock)],
        log=run_dir / "stream_back.log",
        ready=sock.exists,
        timeout=10,
        new_session=True,
    )
    back.start()
    peer = Peer("stream_floor", run_dir / "nginx", FLOOR_TUNING, {"socket": str(sock)})
    try:
        peer.start()
        async with httpx.AsyncClient(
            transport=httpx.AsyncHTTPTransport(uds=str(sock)),
            base_url="http://stream_back",
            timeout=30,
        ) as pub:

            async def send(text: str) -> int:
                body = json.dumps({"messages": [{"id": 0, "text": text}]}).encode()
                r = await pub.post("/pub", content=body)
                return r.status_code

            targets = {u: f"/sub?room={ROOM}&user=u{u}" for u in range(1, members + 1)}
            out = await measure(
                Clients(peer.port, targets, "stream", nproc),
                {"nginx": tree(peer.pid), "upstream": [back.pid]},
                lambda: stream_back_stats(sock)[0],
                send,
                seconds,
                rate,
            )
            out["upstream_dropped"] = stream_back_stats(sock)[1]
            return out
    finally:
        peer.stop()
        back.stop()


# ---- the summary --------------------------------------------------------------------------


def _median(xs: list[float | None]) -> float | None:
    vals = [x for x in xs if x is not None]
    return round(statistics.median(vals), 1) if vals else None


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per system: the median over its rounds of each figure, errors summed."""
    out: dict[str, Any] = {}
    for system in sorted({r["system"] for r in runs}):
        rs = [r for r in runs if r["system"] == system]
        groups = rs[0]["cpu_s"].keys()
        errors: Counter[str] = Counter()
        for r in rs:
            errors.update(r["errors"])
        out[system] = {
            "rounds": len(rs),
            "delivered": sum(r["delivered"] for r in rs),
            "expected": sum(r["members"] * r["messages"] for r in rs),
            "p50_ms": _median([r["p50_ms"] for r in rs]),
            "p99_ms": _median([r["p99_ms"] for r in rs]),
            "cpu_us_per_delivered": _median([r["cpu_us_per_delivered"] for r in rs]),
            "cpu_us_per_delivered_by_group": {
                g: _median([r["cpu_us_per_delivered_by_group"][g] for r in rs]) for g in groups
            },
            "pss_kb_per_1000_held_total": _median([r["pss_kb_per_1000_held_total"] for r in rs]),
            "pss_kb_per_1000_held": {
                g: _median([r["pss_kb_per_1000_held"][g] for r in rs]) for g in groups
            },
            "misses": sum(r.get("misses", 0) for r in rs),
            "superseded": sum(r["superseded"] for r in rs),
            "errors": dict(errors),
        }
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--members", type=int, default=1000)
    ap.add_argument("--seconds", type=float, default=30)
    ap.add_argument("--rate", type=float, default=1.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument(
        "--clients", type=int, default=0, help="client processes (default: one per 2,500 members)"
    )
    ap.add_argument("--systems", nargs="+", default=list(SYSTEMS), choices=list(SYSTEMS))
    ap.add_argument(
        "--jitter-pct",
        type=int,
        default=None,
        help="also run fastpoll with [poll] jitter_pct N (the shipped default is 20), as the "
        "system fastpoll-jitter<N>; stored as rooms-jitter<N>-<stamp>.json",
    )
    ap.add_argument(
        "--perf",
        type=Path,
        default=None,
        help="directory for perf record data of fastpoll's servers",
    )
    args = ap.parse_args()
    # 10,000 streams are as many open files in one upstream (a poll server, stream_back) and
    # 2,500 in each client process: the soft limit up to the hard one (20,000 here), inherited.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    nproc = args.clients or max(1, -(-args.members // MEMBERS_PER_CLIENT))
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    run_dir = Path(os.environ.get("FP_RUN_DIR", f"/tmp/fastpoll-rooms-{stamp}"))
    if args.perf:
        args.perf.mkdir(parents=True, exist_ok=True)
    load0 = os.getloadavg()
    runs: list[dict[str, Any]] = []
    systems = list(args.systems)
    if args.jitter_pct is not None:
        systems.append(f"fastpoll-jitter{args.jitter_pct}")
    for rnd in range(1, args.rounds + 1):
        for system in systems:
            d = run_dir / f"{system}-r{rnd}"
            size = (args.members, args.seconds, args.rate, nproc)
            if system == "proxied-stream":
                r = asyncio.run(floor_run(d, *size))
            elif system.startswith("nchan"):
                r = asyncio.run(nchan_run(d, *size, stream=system == "nchan-eventsource"))
            else:
                perf = args.perf / f"{system}-r{rnd}.data" if args.perf else None
                jitter = args.jitter_pct if system.startswith("fastpoll-jitter") else None
                stream = system == "fastpoll-stream"
                r = asyncio.run(fastpoll_run(d, *size, perf, jitter, stream))
            r["system"] = system
            r["round"] = rnd
            runs.append(r)
            print(
                json.dumps(
                    {
                        k: r[k]
                        for k in (
                            "system",
                            "round",
                            "delivered",
                            "p50_ms",
                            "p99_ms",
                            "cpu_us_per_delivered",
                            "misses",
                            "errors",
                        )
                    }
                ),
                flush=True,
            )
    doc = {
        "stamp": stamp,
        "command": "python -m loadtests.rooms "
        + " ".join(
            f"--members {args.members} --seconds {args.seconds:g} --rate {args.rate:g} "
            f"--rounds {args.rounds} --clients {nproc}".split()
        )
        + (f" --systems {' '.join(args.systems)}" if args.systems != list(SYSTEMS) else "")
        + (f" --jitter-pct {args.jitter_pct}" if args.jitter_pct is not None else "")
        + (" --perf DIR" if args.perf else ""),
        "members": args.members,
        "jitter_pct": args.jitter_pct,
        "seconds": args.seconds,
        "rate": args.rate,
        "rounds": args.rounds,
        "client_processes": nproc,
        "machine": {"cpus": os.cpu_count(), "cpu_model": sysinfo.cpu_model()},
        "cpus": os.cpu_count(),
        # FP_POLL_SERVER: another build (its commit is the caller's to say); else this tree's.
        "poll_server": {
            "binary": str(POLL_SERVER),
            "built_from": os.environ.get("FP_POLL_SERVER_COMMIT")
            or (None if os.environ.get("FP_POLL_SERVER") else git_head()),
        },
        "loadavg_start": load0,
        "loadavg_end": os.getloadavg(),
        "runs": runs,
        "summary": summarize(runs),
    }
    RESULTS.mkdir(exist_ok=True)
    kind = "perf-" if args.perf else ""
    # A profile of fastpoll's streams alone: its own kind (the page's long-poll profile is
    # rooms-perf-<stamp>).
    kind += (
        "stream-"
        if args.perf and "fastpoll" not in systems and "fastpoll-stream" in systems
        else ""
    )
    kind += f"jitter{args.jitter_pct}-" if args.jitter_pct is not None else ""
    kind += f"rate{args.rate:g}-" if args.rate != 1 else ""
    out = RESULTS / f"rooms-{kind}{stamp}.json"
    out.write_text(json.dumps(doc, indent=1) + "\n")
    print(
        f"{'system':17} {'round':>5} {'held':>6} {'msgs':>5} {'delivered':>9} {'p50 ms':>8} "
        f"{'p99 ms':>8} {'CPU us/msg':>10} {'KB/1000':>8} errors"
    )
    for r in runs:
        print(
            f"{r['system']:17} {r['round']:>5} {r['held_by_server']:>6} {r['messages']:>5} "
            f"{r['delivered']:>9} {r['p50_ms']!s:>8} {r['p99_ms']!s:>8} "
            f"{r['cpu_us_per_delivered']!s:>10} {r['pss_kb_per_1000_held_total']:>8} "
            f"{r['errors']}"
        )
    print(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
