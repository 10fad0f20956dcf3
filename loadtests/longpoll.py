"""Long polls and conditional polls, fastpoll and Nchan side by side (docs/benchmarks.md).

    .venv/bin/python -m loadtests.longpoll [--sizes 1000 5000 15000] [--seconds 20]
                                           [--interval-conns 50 10000] [--interval-seconds 6]
                                           [--quick]

One run, both systems on this machine, measured one after the other:

- fastpoll: a fresh stack from the harness (memcached backend, announcements on the stack's
  Redis through `[announce] server`, `[server] max_held` 20,000, 2 poll servers, `make up`'s
  nginx tuning), the largest size's users preloaded in memcached.
- Nchan: nginx with Debian's libnginx-mod-nchan (loadtests/longpoll_nchan.py, its configuration
  and why).

**Held clients** (longpoll_client.py): for each size N, N clients in this process each hold a poll
(fastpoll: If-None-Match + wait=25 as client/fastpoll.js does; Nchan: its long-poll), and once
the servers report 99% of them held, a publisher sends to a random 1% of the users per second for
`--seconds` (fastpoll: POST /api/messages to the app; Nchan: POST /pub/<channel>). Per message:
time from the publish request's send to the waiting client's read of the answer holding it.
CPU per delivered message: the servers' utime+stime from /proc over the publish window (and up to
5 s for the last deliveries) / messages delivered (fastpoll: nginx, poll servers, app, Redis,
memcached; Nchan: nginx), each group also reported alone. Memory: the processes' Pss
(/proc/PID/smaps_rollup) with the clients held, minus the same at the start before any client
connected, per 1,000 held connections. Errors are counted, not asserted (must be 0).

**Interval polls** (wrk, keep-alive, random users among 5,000 with one message each, a Lua script
written into the run directory): fastpoll with If-None-Match of the current answer (304s) and
without (full 200s), Nchan's interval-poll with the last message's If-Modified-Since/If-None-Match
(304s) and without (the oldest message, 200): response bytes read per poll (wrk's exact byte
count) and the servers' CPU per poll, at each `--interval-conns`.

**Plain polls**: `ab -c 50 -n 5000` on a hit (the seed's command), 5 times, median.

JSON: loadtests/results/longpoll-<stamp>.json, with the load average at the start and the end.
"""

from __future__ import annotations

import argparse
import asyncio
import email.utils
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from fastpoll_testkit import loadgen
from fastpoll_testkit.procs import free_port
from fastpoll_testkit.stack import Stack  # the one stack harness
from loadtests import preload, sysinfo
from loadtests.longpoll_client import HoldRun, quantile_ms
from loadtests.longpoll_nchan import NchanPeer
from loadtests.peers import Peer
from loadtests.signing import Signer

HERE = Path(__file__).resolve().parent


RESULTS = HERE / "results"
WAIT_S = 25  # the client's wait=, as client/fastpoll.js; Nchan's nchan_subscriber_timeout
INTERVAL_USERS = 5000

# ---- processes: memory from /proc (CPU: sysinfo.CpuMeter) ------------------------------------


def tree(pid: int) -> list[int]:
    """pid and its workers (nginx's, uvicorn's: direct children)."""
    return [pid, *sysinfo.children(pid)]


def pss_kb(pids: list[int]) -> int:
    """Proportional set size: shared pages (nginx's shared memory) counted once over the group."""
    total = 0
    for p in pids:
        try:
            text = Path(f"/proc/{p}/smaps_rollup").read_text()
        except OSError:
            continue
        m = re.search(r"^Pss:\s+(\d+) kB", text, re.M)
        total += int(m.group(1)) if m else 0
    return total


def nchan_subscribers(base_url: str) -> int:
    """Nchan's own count of its subscribers (nchan_stub_status)."""
    text = http_text(f"{base_url}/nchan_status")
    m = re.search(r"^subscribers: (\d+)", text, re.M)
    if not m:
        raise RuntimeError(f"nchan_stub_status without subscribers: {text!r}")
    return int(m.group(1))


WAKE_CAUSES = ("announcement", "recheck", "timeout")
WAKE_METRICS = [
    *(f'fastpoll_held_wakeups_total{{cause="{c}"}}' for c in WAKE_CAUSES),
    "fastpoll_held_over_cap_total",
]


def poller_counters(ports: list[int]) -> dict[str, float]:
    """The poll servers' wake-ups by cause and polls over max_held, summed."""
    return {m: metric_sum(ports, m) for m in WAKE_METRICS}


def http_text(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as r:
        return r.read().decode()


def metric_sum(ports: list[int], name: str) -> float:
    total = 0.0
    for port in ports:
        for line in http_text(f"http://127.0.0.1:{port}/metrics").splitlines():
            if line.startswith(name + " "):
                total += float(line.split()[-1])
    return total


# ---- the systems -----------------------------------------------------------------------------


class Systems:
    def __init__(self, run_dir: Path, max_users: int) -> None:
        self.run_dir = run_dir
        redis_port = free_port()
        self.stack = Stack(
            run_dir=run_dir / "fastpoll",
            backend="memcached",
            redis_port=redis_port,
            extra_ini={
                "announce": {
                    "server": f"127.0.0.1:{redis_port}",
                    "password_file": str(run_dir / "fastpoll" / "redis.pass"),
                },
                "server": {"max_held": "20000"},
                "poll": {"max_wait": "30"},
            },
        )
        self.nchan = NchanPeer.at(run_dir / "nchan")
        self.max_users = max_users
        self.queries: dict[int, str] = {}

    def start(self) -> None:
        self.stack.start()
        self.nchan.start()
        s = self.stack
        self.fp_groups = {
            "nginx": tree(s.procs["nginx"].pid),
            "poll_servers": [p.pid for n, p in s.procs.items() if n.startswith("poller-")],
            "app": tree(s.procs["app"].pid),
            "redis": [s.procs["redis"].pid],
            "memcached": [p.pid for n, p in s.procs.items() if n.startswith("memcached-")],
        }
        self.nchan_groups = {"nginx": tree(self.nchan.pid)}
        deadline = time.monotonic() + 15
        while metric_sum(s.admin_ports, "fastpoll_announce_subscribed") < len(s.admin_ports):
            if time.monotonic() > deadline:
                raise RuntimeError("the poll servers did not subscribe to announcements")
            time.sleep(0.1)
        self.preload()
        signer = Signer(s)
        self.queries = {u: signer.query(str(u)) for u in range(1, self.max_users + 1)}
        # Memory before any client: the baseline of every size.
        self.fresh_pss = {
            "fastpoll": {g: pss_kb(p) for g, p in self.fp_groups.items()},
            "nchan": {g: pss_kb(p) for g, p in self.nchan_groups.items()},
        }

    def preload(self) -> None:
        """Every user's answer back to the preloaded one (publishes changed some)."""
        preload.preload([f"127.0.0.1:{p}" for p in self.stack.memcached_ports], self.max_users)

    def stop(self) -> None:
        self.nchan.stop()
        self.stack.stop()


# ---- held clients ----------------------------------------------------------------------------


def nchan_message(user: int, text: str) -> bytes:
    """A Nchan message: the same shape and size as fastpoll's answer."""
    return json.dumps({"unread": 1, "newest": {"id": user, "text": text}}).encode()


def side(sysm: Systems, system: str, tag: str) -> dict[str, Any]:
    """What differs between the systems in a held run: where clients poll and publishes go,
    the client protocol, which publish statuses are right, who counts the held polls."""
    if system == "fastpoll":
        s = sysm.stack
        return {
            "groups": sysm.fp_groups,
            "port": s.http_port,
            "target": lambda u: f"/Poll/getMessages?{sysm.queries[u]}&wait={WAIT_S}",
            "mode": "etag",
            "pub_base": s.app_url(),
            "pub_headers": {"Authorization": f"Bearer {s.api_token}"},
            "pub_request": lambda u, text: (
                "/api/messages",
                {"json": {"user_id": u, "text": text}},
            ),
            "publish_ok": (201,),
            "held": lambda: int(metric_sum(s.admin_ports, "fastpoll_held_requests")),
        }
    peer = sysm.nchan
    return {
        "groups": sysm.nchan_groups,
        "port": peer.port,
        "target": lambda u: f"/lp/{tag}{u}",
        "mode": "nchan",
        "pub_base": peer.base_url,
        "pub_headers": {"Content-Type": "application/json"},
        "pub_request": lambda u, text: (f"/pub/{tag}{u}", {"content": nchan_message(u, text)}),
        "publish_ok": (201, 202),  # 202: queued with no subscriber (Nchan)
        "held": lambda: nchan_subscribers(peer.base_url),
    }


async def hold_run(
    sysm: Systems, system: str, n: int, seconds: float, tag: str
) -> dict[str, object]:
    import httpx

    sd = side(sysm, system, tag)
    groups: dict[str, list[int]] = sd["groups"]
    held: Callable[[], int] = sd["held"]
    pub_client = httpx.AsyncClient(
        base_url=sd["pub_base"],
        timeout=10,
        headers=sd["pub_headers"],
        limits=httpx.Limits(max_connections=16),
    )

    async def publish(user: int, text: str) -> int:
        path, kw = sd["pub_request"](user, text)
        r = await pub_client.post(path, **kw)
        return r.status_code

    run = HoldRun(
        port=sd["port"],
        users=list(range(1, n + 1)),
        target=sd["target"],
        mode=sd["mode"],
        publish=publish,
        publish_ok=sd["publish_ok"],
        wait_s=WAIT_S,
    )
    fp_ports = sysm.stack.admin_ports if system == "fastpoll" else []
    counters0 = poller_counters(fp_ports)
    pss_before = {g: pss_kb(p) for g, p in groups.items()}
    t_connect = time.monotonic()
    tasks = await run.hold()
    # Held: all of them, or (a client pauses between its polls for the pace an answer names)
    # 99% once every client is connected.
    deadline = time.monotonic() + 90
    n_held = 0
    while time.monotonic() < deadline:
        n_held = await asyncio.to_thread(held)
        if n_held >= n or (run.connected == n and n_held >= 0.99 * n):
            break
        await asyncio.sleep(0.25)
    connect_s = time.monotonic() - t_connect
    await asyncio.sleep(1.0)  # let the last connections settle before measuring memory
    pss_held = {g: pss_kb(p) for g, p in groups.items()}
    n_held_measured = await asyncio.to_thread(held)
    meter = sysinfo.CpuMeter(groups)
    meter.start()
    self0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.monotonic()
    pub = await run.publish_for(seconds, rate=n * 0.01)
    await run.drain(5.0)
    window = time.monotonic() - t0
    cpu = meter.stop()
    self1 = resource.getrusage(resource.RUSAGE_SELF)
    n_held_end = await asyncio.to_thread(held)
    counters1 = poller_counters(fp_ports)
    run.stopping = True
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await pub_client.aclose()

    lat = run.deliveries.latencies_s
    delivered = len(lat)
    cpu_total = sum(cpu.values())
    fresh = sysm.fresh_pss[system]
    undelivered = run.deliveries.undelivered()
    errors = dict(run.errors)
    if undelivered:
        errors["undelivered_after_5s"] = undelivered
    return {
        "system": system,
        "held_clients": n,
        "held_by_server_before": n_held,
        "held_by_server_measured": n_held_measured,
        "held_by_server_end": n_held_end,
        "connect_s": round(connect_s, 1),
        "publish_rate_per_s": n * 0.01,
        "publish_seconds": seconds,
        **pub,
        "delivered": delivered,
        "superseded": run.deliveries.superseded,
        "p50_ms": quantile_ms(lat, 0.50),
        "p90_ms": quantile_ms(lat, 0.90),
        "p99_ms": quantile_ms(lat, 0.99),
        "max_ms": round(max(lat) * 1000, 2) if lat else None,
        "after_publish_answered_p50_ms": quantile_ms(run.deliveries.after_answer_s, 0.5),
        "after_publish_answered_p99_ms": quantile_ms(run.deliveries.after_answer_s, 0.99),
        "delivered_before_publish_answered": run.deliveries.before_answer,
        "mean_ms": round(statistics.fmean(lat) * 1000, 2) if lat else None,
        "cpu_window_s": round(window, 2),
        "cpu_s": cpu,
        "cpu_us_per_delivered": round(cpu_total / delivered * 1e6, 1) if delivered else None,
        "cpu_us_per_delivered_by_group": {
            g: round(v / delivered * 1e6, 1) if delivered else None for g, v in cpu.items()
        },
        "client_cpu_s": round(self1.ru_utime + self1.ru_stime - self0.ru_utime - self0.ru_stime, 3),
        "pss_kb_fresh": fresh,
        "pss_kb_before": pss_before,
        "pss_kb_held": pss_held,
        "pss_kb_per_1000_held_vs_fresh": {
            g: round((pss_held[g] - fresh[g]) / n * 1000) for g in groups
        },
        "pss_kb_per_1000_held_vs_before": {
            g: round((pss_held[g] - pss_before[g]) / n * 1000) for g in groups
        },
        "poll_answers": dict(run.statuses),
        "poll_server_counters": {m: counters1[m] - counters0[m] for m in counters0},
        "polls": run.polls,
        "errors": errors,
        "error_count": sum(errors.values()),
    }


# ---- interval polls (wrk) ----------------------------------------------------------------------

LUA = r"""-- written by loadtests/longpoll.py: GETs of random lines of FP_LP_TARGETS, each line
-- "<request-target>\t<If-None-Match or empty>\t<If-Modified-Since or empty>"; done() prints one
-- line "FPLP {json}" with wrk's exact counts and the answers by status.
local threads = {}
function setup(thread)
   table.insert(threads, thread)
end
function init(args)
   n200, n304, nother = 0, 0, 0
   reqs = {}
   for line in io.lines(os.getenv("FP_LP_TARGETS")) do
      local path, inm, ims = line:match("^([^\t]*)\t([^\t]*)\t([^\t]*)$")
      local h = {}
      if inm ~= "" then h["If-None-Match"] = inm end
      if ims ~= "" then h["If-Modified-Since"] = ims end
      reqs[#reqs + 1] = wrk.format("GET", path, h)
   end
   math.randomseed(os.time() + #threads)
end
function request()
   return reqs[math.random(#reqs)]
end
function response(status, headers, body)
   if status == 200 then n200 = n200 + 1
   elseif status == 304 then n304 = n304 + 1
   else nother = nother + 1 end
end
function done(summary, latency, requests)
   local a, b, c = 0, 0, 0
   for _, t in ipairs(threads) do
      a = a + t:get("n200"); b = b + t:get("n304"); c = c + t:get("nother")
   end
   local e = summary.errors
   io.write(string.format('FPLP {"requests":%d,"bytes":%d,"duration_us":%d,' ..
      '"connect":%d,"read":%d,"write":%d,"status":%d,"timeout":%d,' ..
      '"n200":%d,"n304":%d,"nother":%d,"p50_us":%d,"p99_us":%d}\n',
      summary.requests, summary.bytes, summary.duration, e.connect, e.read, e.write,
      e.status, e.timeout, a, b, c, latency:percentile(50), latency:percentile(99)))
end
"""


def parse_fplp(text: str) -> dict[str, int]:
    m = re.search(r"^FPLP (\{.*\})\s*$", text, re.M)
    if not m:
        raise loadgen.ToolError("wrk printed no FPLP line:\n" + text[-2000:])
    return {k: int(v) for k, v in json.loads(m.group(1)).items()}


def wrk_interval(
    base_url: str,
    lines: list[str],
    conns: int,
    seconds: float,
    groups: dict[str, list[int]],
    work: Path,
    label: str,
) -> dict[str, object]:
    lua = work / "interval.lua"
    lua.write_text(LUA)
    targets = work / f"targets-{label}.txt"
    targets.write_text("\n".join(lines) + "\n")
    cmd = ["wrk", "-t2", f"-c{conns}", f"-d{seconds:g}s", "--timeout=10s", "-s", str(lua)]
    cmd.append(base_url)
    meter = sysinfo.CpuMeter(groups)
    meter.start()
    p = subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        timeout=seconds + 90,
        env={**os.environ, "FP_LP_TARGETS": str(targets)},
        check=False,
    )
    cpu = meter.stop()
    if p.returncode != 0:
        raise loadgen.ToolError(f"{' '.join(cmd)} exited {p.returncode}:\n{p.stderr[-2000:]}")
    d = parse_fplp(p.stdout)
    n = d["requests"] or 1
    errors = {k: d[k] for k in ("connect", "read", "write", "status", "timeout")}
    errors["unexpected_status"] = d["nother"]
    return {
        "run": label,
        "conns": conns,
        "seconds": seconds,
        "requests": d["requests"],
        "rps": round(d["requests"] / (d["duration_us"] / 1e6)),
        "answers": {"200": d["n200"], "304": d["n304"], "other": d["nother"]},
        "bytes_per_poll": round(d["bytes"] / n, 1),
        "cpu_s": cpu,
        "cpu_us_per_poll": round(sum(cpu.values()) / n * 1e6, 2),
        "p50_ms": d["p50_us"] / 1000,
        "p99_ms": d["p99_us"] / 1000,
        "errors": errors,
        "error_count": sum(errors.values()),
        "command": cmd,
    }


def nchan_channels(base_url: str, users: int, tag: str) -> list[tuple[str, str]]:
    """One message in each channel; returns each one's (If-None-Match, If-Modified-Since),
    from the publisher's answer ("last message id: <time>:<tag>")."""
    import httpx

    async def go() -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = [("", "")] * users
        sem = asyncio.Semaphore(32)
        async with httpx.AsyncClient(base_url=base_url, timeout=10) as c:

            async def one(u: int) -> None:
                async with sem:
                    r = await c.post(
                        f"/pub/{tag}{u}",
                        content=nchan_message(u, f"bench {u}"),
                        headers={"Content-Type": "application/json"},
                    )
                m = re.search(r"last message id: (\d+):(\d+)", r.text)
                if r.status_code not in (201, 202) or not m:
                    raise RuntimeError(f"nchan publish to {tag}{u}: {r.status_code} {r.text!r}")
                when = email.utils.formatdate(int(m.group(1)), usegmt=True)
                out[u - 1] = (m.group(2), when)

            await asyncio.gather(*(one(u) for u in range(1, users + 1)))
        return out

    return asyncio.run(go())


def interval_runs(
    sysm: Systems, conns_list: list[int], seconds: float, work: Path
) -> list[dict[str, object]]:
    import xxhash

    users = min(INTERVAL_USERS, sysm.max_users)
    sysm.preload()
    etag = {u: f'"{xxhash.xxh3_64_hexdigest(preload.answer(u))}"' for u in range(1, users + 1)}
    fp_304 = [f"/Poll/getMessages?{sysm.queries[u]}\t{etag[u]}\t" for u in range(1, users + 1)]
    fp_full = [f"/Poll/getMessages?{sysm.queries[u]}\t\t" for u in range(1, users + 1)]
    tags = nchan_channels(sysm.nchan.base_url, users, "ip")
    nc_304 = [f"/ip/ip{u}\t{t}\t{when}" for u, (t, when) in enumerate(tags, 1)]
    nc_full = [f"/ip/ip{u}\t\t" for u in range(1, users + 1)]
    out = []
    for conns in conns_list:
        for system, label, lines in (
            ("fastpoll", "304", fp_304),
            ("fastpoll", "full", fp_full),
            ("nchan", "304", nc_304),
            ("nchan", "full", nc_full),
        ):
            fp = system == "fastpoll"
            r = wrk_interval(
                sysm.stack.base_url if fp else sysm.nchan.base_url,
                lines,
                conns,
                seconds,
                sysm.fp_groups if fp else sysm.nchan_groups,
                work,
                f"{system}-{label}-c{conns}",
            )
            out.append({"system": system, "answers_wanted": label, **r})
            print(
                json.dumps(
                    {
                        k: out[-1][k]
                        for k in ("run", "rps", "bytes_per_poll", "cpu_us_per_poll", "error_count")
                    }
                )
            )
    return out


def ab_plain(sysm: Systems, reps: int, raw_log: Path) -> dict[str, object]:
    """The seed's `ab -c 50 -n 5000` on a hit, interleaved with the same against nginx answering
    `return 200` itself (loadtests/peers.py), so the ratio holds on a shared machine: the seed's
    figures are 12,212 req/s and 0.87x return 200 (docs/benchmarks.md)."""
    url = f"{sysm.stack.base_url}/Poll/getMessages?{sysm.queries[1]}"
    tuning = {
        "worker_processes": 2,
        "worker_connections": 19500,
        "worker_rlimit_nofile": 20000,
        "listen_options": "",
    }
    peer = Peer(
        "return200", sysm.run_dir / "return200", tuning, {"body": preload.answer(1).decode()}
    )
    peer.start()
    try:
        fp, ceiling = [], []
        for _ in range(reps):
            fp.append(loadgen.run_ab(url, 50, 5000, raw_log=raw_log))
            ceiling.append(loadgen.run_ab(f"{peer.base_url}/Poll/getMessages?user_id=1", 50, 5000))
    finally:
        peer.stop()
    rps = [r.rps for r in fp]
    ratios = [a.rps / b.rps for a, b in zip(fp, ceiling, strict=True) if b.rps]
    return {
        "command": fp[0].command,
        "reps": reps,
        "rps_median": statistics.median(rps),
        "rps_all": rps,
        "p50_ms_median": statistics.median([r.p50_ms or 0 for r in fp]),
        "p99_ms_median": statistics.median([r.p99_ms or 0 for r in fp]),
        "failed": sum(r.failed for r in fp) + sum(r.failed for r in ceiling),
        "return200_rps_all": [r.rps for r in ceiling],
        "ratio_to_return200_median": round(statistics.median(ratios), 3) if ratios else None,
        "seed_figure_rps": 12212,  # docs/benchmarks.md, "The seed's benchmark", fastpoll no -k
        "seed_ratio_to_return200": 0.87,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--sizes", type=int, nargs="+", default=[1000, 5000, 15000])
    p.add_argument("--seconds", type=float, default=20)
    p.add_argument("--interval-conns", type=int, nargs="+", default=[50, 10000])
    p.add_argument("--interval-seconds", type=float, default=6)
    p.add_argument("--ab-reps", type=int, default=5)
    p.add_argument("--quick", action="store_true", help="200 clients, 5 s, c=50: a smoke run")
    args = p.parse_args()
    if args.quick:
        args.sizes, args.seconds = [200], 5.0
        args.interval_conns, args.interval_seconds, args.ab_reps = [50], 2.0, 1
    started = time.time()
    load_start = os.getloadavg()
    run_dir = Path(tempfile.mkdtemp(prefix="fastpoll-longpoll-"))
    sysm = Systems(run_dir, max(max(args.sizes), INTERVAL_USERS if not args.quick else 200))
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    RESULTS.mkdir(exist_ok=True)
    raw_log = run_dir / "ab-raw.log"
    out: dict[str, object] = {
        "benchmark": "longpoll",
        "stamp": stamp,
        "load_average_at_start": [round(x, 2) for x in load_start],
        "cpus": os.cpu_count(),
        "wait_s": WAIT_S,
    }
    try:
        sysm.start()
        out["fastpoll_processes"] = {g: len(v) for g, v in sysm.fp_groups.items()}
        out["nchan_processes"] = {g: len(v) for g, v in sysm.nchan_groups.items()}
        held = []
        for n in args.sizes:
            for system in ("fastpoll", "nchan"):
                r = asyncio.run(hold_run(sysm, system, n, args.seconds, tag=f"lp{n}x"))
                held.append(r)
                print(
                    json.dumps(
                        {
                            k: r[k]
                            for k in (
                                "system",
                                "held_clients",
                                "delivered",
                                "p50_ms",
                                "p99_ms",
                                "cpu_us_per_delivered",
                                "pss_kb_per_1000_held_vs_fresh",
                                "error_count",
                            )
                        }
                    )
                )
        out["held"] = held
        out["interval"] = interval_runs(sysm, args.interval_conns, args.interval_seconds, run_dir)
        out["ab_plain"] = ab_plain(sysm, args.ab_reps, raw_log)
        print(json.dumps(out["ab_plain"]))
    finally:
        sysm.stop()
    out["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    out["runtime_s"] = round(time.time() - started, 1)
    out["run_dir"] = str(run_dir)
    # A quick run is a smoke run: its JSON stays in the run directory.
    path = (run_dir if args.quick else RESULTS) / f"longpoll-{stamp}.json"
    path.write_text(json.dumps(out, indent=1) + "\n")
    print(f"longpoll: {path} ({out['runtime_s']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
