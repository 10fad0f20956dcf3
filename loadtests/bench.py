"""fastpoll's benchmark: `make bench` (full, 10-15 min, capped at 18), `make bench-quick` (smoke).

    .venv/bin/python -m loadtests.bench            # full: results, plots, docs/benchmarks.md
    .venv/bin/python -m loadtests.bench --quick    # smoke: asserts 0 failed requests, right bodies
    .venv/bin/python -m loadtests.bench --attach run/   # measure the stack `make up` started

It starts the stack through the harness (tuned for many connections, see TUNING) unless told to
attach to a running one, preloads the answers of 100,000 users into memcached (ketama, the app's
key function), starts the peers (nginx `return 200`, nginx `memcached_pass`), then runs, with the
same client for every system:

1. the seed's `ab -c 50 -n 5000` on a poll URL, without and with -k;
2. wrk -c50 keep-alive: hits (one hot key / 100,000 keys), GET and POST, 95% and 50% hit mixes,
   all misses (the fallback), the poll server directly, the peers, and the app alone;
   the hit path (many keys and the hot key) at 1,000 and 5,000 connections: fastpoll (the
   shipped default, the template's "auto" active pollers, and every poller active),
   memcached_pass and the design's ceiling (nginx -> nginx `return 200` on a unix socket), in
   interleaved rounds;
   fastpoll's site config in front of the ceiling's upstream against the ceiling's own front;
3. the concurrency sweep 20 .. 15,000 over fastpoll and the peers (the app up to 1,000);
4. the poll servers' CPU time per 100,000 hits, and one poll server's memory with 10,000
   connections open;
5. the hit path's profile: one more wrk run each for fastpoll at 50, 1,000 and 5,000 connections
   on 100,000 keys and on the hot key, and for memcached_pass and the ceiling at 50 on 100,000
   keys, their server processes sampled by `perf record -g` and their system calls counted by
   `perf stat` (loadtests/perf.py).

One JSON file per run goes to loadtests/results/ (raw tool outputs beside it), with the machine's
details; then the plots and docs/benchmarks.md are made from it (loadtests/report.py).

This file is the command line and the run's order; the parts, none of which imports this file:
plans.py (the systems, the tuning, what a full and a quick run measure), runner.py (running one
plan, the CPU accounting, memory, sanity checks), peers.py (nginx `return 200`, `memcached_pass`,
the app alone), derive.py (ratios and targets from the raw results) and report.py (plots, docs).
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import shutil
import signal
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from fastpoll_testkit import loadgen
from fastpoll_testkit.procs import free_port
from loadtests import front_cost, peers, preload, stackctl, sysinfo
from loadtests.derive import Row, derive
from loadtests.perf import perf_profile, perf_start, perf_stop, syscalls_read, syscalls_start
from loadtests.plans import (
    APP_USERS,
    HIT_LEVELS,
    HOT_USER,
    POLL_SERVER,
    RESULTS,
    SWEEP,
    SYSTEMS,
    TUNING,
    USERS,
    Plan,
    full_plan,
    quick_plan,
)
from loadtests.runner import (
    Ctx,
    collect_logs,
    cpu_groups,
    fmt_row,
    measure_rss,
    run_plan,
    sanity,
    set_active_pollers,
    wait_quiet,
)
from loadtests.signing import Signer

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def _terminated(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)  # so the run's `finally` stops what it started


def main() -> int:
    signal.signal(signal.SIGTERM, _terminated)
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="CI smoke: < 1 minute, checks bodies")
    ap.add_argument(
        "--attach",
        type=Path,
        metavar="RUN_DIR",
        help="use the stack `make up` started (its run dir) instead of a fresh one",
    )
    ap.add_argument("--users", type=int, default=None, help=f"preloaded users (default {USERS})")
    ap.add_argument("--reps", type=int, default=3, help="repetitions of the ratio runs")
    ap.add_argument("--rss-conns", type=int, default=None, help="default 10000 (quick: 1000)")
    ap.add_argument(
        "--max-minutes",
        type=float,
        default=None,
        help="skip what is left after this long (default 18, quick 1.5)",
    )
    ap.add_argument("--no-docs", action="store_true", help="do not rewrite docs/benchmarks.md")
    ap.add_argument(
        "--poller-tcp",
        action="store_true",
        help="nginx reaches the poll servers over TCP, not unix sockets",
    )
    ap.add_argument(
        "--wait-quiet",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="first wait up to this long for the machine to be idle (other users)",
    )
    ap.add_argument(
        "--only", default="", help="comma list of groups to run: ab,c50,hit,sweep,hop,profile,rss"
    )
    ap.add_argument(
        "--systems", default="", help="comma list of systems to run: " + ",".join(SYSTEMS)
    )
    ap.add_argument(
        "--upstream-keepalive",
        type=int,
        default=None,
        help=f"idle upstream connections per nginx worker "
        f"(default {TUNING['fastpoll_upstream_keepalive']})",
    )
    ap.add_argument(
        "--nginx-cpu-affinity",
        default=str(TUNING["worker_cpu_affinity"]),
        metavar="VALUE",
        help="worker_cpu_affinity of every nginx in the run, 'off' for none (default %(default)s)",
    )
    ap.add_argument(
        "--memcached-threads",
        type=int,
        default=1,
        help="memcached -t (default %(default)s: the memcached_pass peer at its best on this "
        "2-core machine, docs/benchmarks.md 'Tuning'; memcached's own default is 4)",
    )
    ap.add_argument(
        "--no-signing",
        action="store_true",
        help="poll URLs unsigned, as the peers' are: what checking a signature costs fastpoll",
    )
    ap.add_argument(
        "--pollers",
        type=int,
        default=None,
        help="poll servers in the stack (default: one per core)",
    )
    ap.add_argument(
        "--sweep",
        default=",".join(map(str, SWEEP)),
        help="concurrency levels of the sweep (default: %(default)s)",
    )
    args = ap.parse_args()
    quick = args.quick
    users = args.users or (2000 if quick else USERS)
    max_s = 60 * (args.max_minutes or (1.5 if quick else 18.0))
    rss_n = args.rss_conns or (1000 if quick else 10000)
    only = {g for g in args.only.split(",") if g}
    if args.upstream_keepalive:
        TUNING["fastpoll_upstream_keepalive"] = args.upstream_keepalive
    affinity = args.nginx_cpu_affinity
    TUNING["worker_cpu_affinity"] = "" if affinity == "off" else affinity

    for tool in ("wrk", "ab", "nginx", "memcached"):
        if shutil.which(tool) is None:
            print(f"bench: {tool} is not installed (make deps)", file=sys.stderr)
            return 2
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # children inherit it

    t_start = time.monotonic()
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    partial = bool(only or args.systems or args.sweep != ",".join(map(str, SWEEP)))
    run_id = f"{'quick' if quick else 'partial' if partial else 'bench'}-{stamp}"
    RESULTS.mkdir(parents=True, exist_ok=True)
    # Quick and partial runs are not kept in git (.gitignore: /loadtests/results/*.tmp).
    suffix = ".tmp" if quick or partial else ""
    out_json = RESULTS / f"{run_id}.json{suffix}"
    raw_log = RESULTS / f"{run_id}-raw.log{suffix}"
    work = ROOT / "run" / "bench"
    if work.exists():
        shutil.rmtree(work)  # our own scratch dir from an earlier run (stopped, by pid)
    work.mkdir(parents=True)

    print(
        f"bench {run_id}: {'quick smoke' if quick else 'full run'}; results -> {out_json}",
        flush=True,
    )
    quiet = wait_quiet(args.wait_quiet) if args.wait_quiet else None
    t_start = time.monotonic()  # the time limit and the run's duration start after the wait
    machine = sysinfo.machine(POLL_SERVER)
    ini = {"log": {"level": "warn"}}
    if args.attach:
        target = stackctl.attach(args.attach.resolve())
        print(f"  attached to the running stack at {target.base_url} (its own nginx tuning)")
    else:
        # memcached_pass opens one upstream connection per request in flight: at the sweep's
        # 15,000 connections memcached's -c must exceed that, or the peer's errors are ours
        # (memcached refuses to start with a -c above what its open-files limit can reach).
        fd_hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        mc_conns = 18000 if fd_hard == resource.RLIM_INFINITY else min(18000, fd_hard - 100)
        # The smoke checks every body, so a hit that falls back to the app on a starved CI
        # machine (a cache answer later than 100 ms) would fail it: quick mode allows 1 s.
        target = stackctl.start(
            work / "stack",
            TUNING,
            ini,
            cache_timeout_ms=1000 if quick else None,
            poller_unix=not args.poller_tcp,
            n_pollers=args.pollers,
            memcached_args=["-t", str(args.memcached_threads)] if args.memcached_threads else None,
            memcached_conns=mc_conns,
            signing=not args.no_signing,
        )
        print(
            f"  stack up at {target.base_url}: {len(target.poller_ports)} poll servers "
            f"{target.poller_ports}, {target.active_pollers} active (nginx reaches them over "
            f"{target.poller_hop}), memcached "
            f"{target.memcached_ports}, app {target.app_port}"
            f" ({time.monotonic() - t_start:.1f}s)",
            flush=True,
        )
    peer_tuning = {k: v for k, v in TUNING.items() if not k.startswith("fastpoll_")}
    ctx = Ctx(
        args=args,
        target=target,
        peers={},
        raw_log=raw_log,
        signer=Signer(target.stack),
        targets=work / "targets",
        miss_pool=8_000 if quick else 40_000,
    )
    failures: list[str] = []
    not_run = 0  # planned runs skipped or failed to run: then the run does not replace the report
    rss: dict[str, object] = {}
    hop: list[Row] = []
    front: list[Row] = []
    profile: dict[str, Row] = {}
    doc: Row = {}
    try:
        mc_servers = [f"127.0.0.1:{p}" for p in target.memcached_ports]
        t0 = time.monotonic()
        preload.preload(mc_servers, users)
        print(f"  preloaded {users:,} users into memcached ({time.monotonic() - t0:.1f}s)")
        t0 = time.monotonic()
        ctx.write_targets(users)
        print(
            f"  {'signed' if ctx.signer.enabled else 'unsigned (signing is off)'} poll URLs "
            f"written for {users:,} users and the app's ({time.monotonic() - t0:.1f}s)"
        )
        ctx.peers = {
            "return200": peers.Peer(
                "return200",
                work / "peer-return200",
                peer_tuning,
                {"body": preload.answer(HOT_USER).decode()},
            ),
            "memcached_pass": peers.Peer(
                "memcached_pass",
                work / "peer-memcached_pass",
                peer_tuning,
                {
                    "memcached": mc_servers[0],
                    "upstream_keepalive": TUNING["fastpoll_upstream_keepalive"],
                },
            ),
        }
        # The design's ceiling: a front nginx with the stack's proxy settings, and behind it, on
        # a unix socket, one nginx worker (as one poll server) answering from memory.
        ceiling_sock = work / "ceiling.sock"
        ctx.peers["ceiling_back"] = peers.Peer(
            "ceiling_back",
            work / "peer-ceiling_back",
            peer_tuning,
            {
                "body": preload.answer(HOT_USER).decode(),
                "socket": str(ceiling_sock),
                "worker_processes": 1,
                "worker_cpu_affinity": "",
            },
        )
        ctx.peers["ceiling"] = peers.Peer(
            "ceiling",
            work / "peer-ceiling",
            peer_tuning,
            {
                "socket": str(ceiling_sock),
                "upstream_keepalive": TUNING["fastpoll_upstream_keepalive"],
            },
        )
        ctx.peers["app"] = peers.AppPeer(
            work / "peer-app", target.stack.ini_path, workers=target.stack.app_workers
        )
        for peer in ctx.peers.values():
            peer.start()
        print("  peers up: " + ", ".join(f"{n} {p.base_url}" for n, p in ctx.peers.items()))

        levels = tuple(int(c) for c in args.sweep.split(",") if c)
        plans = quick_plan() if quick else full_plan(args.reps, levels)
        if only:
            plans = [p for p in plans if p.group in only]
        if args.systems:
            plans = [p for p in plans if p.system in args.systems.split(",")]
        if args.attach or len(target.poller_ports) < 2:  # not our nginx to reload / same thing
            plans = [p for p in plans if p.system != "fastpoll_all"]
        ctx.app_users = 0
        if any(p.system == "app" for p in plans):
            ctx.app_users = 200 if quick else APP_USERS
            secs = preload.seed_app(target.app_port, ctx.app_users, token=target.stack.api_token)
            print(f"  gave {ctx.app_users:,} users a message in the app's database ({secs:.1f}s)")

        failures += sanity(ctx, users, quick)
        if failures:
            raise SystemExit("bench: the stack does not answer right:\n  " + "\n  ".join(failures))
        total_est = sum(p.est_seconds() for p in plans)
        print(f"  {len(plans)} runs planned, ~{total_est / 60:.1f} min of load", flush=True)
        done_est = 0.0
        for i, p in enumerate(plans, 1):
            elapsed = time.monotonic() - t_start
            if elapsed > max_s:
                print(f"  time limit reached: skipping the last {len(plans) - i + 1} runs")
                failures.append(f"{len(plans) - i + 1} runs skipped (time limit)")
                not_run += len(plans) - i + 1
                break
            try:
                if not args.attach:
                    set_active_pollers(ctx, p.system)
                row = run_plan(ctx, p, users)
            except loadgen.ToolError as e:
                failures.append(f"{p.name}: {e}")
                not_run += 1
                print(f"  [{i:3}/{len(plans)}] {p.name}: FAILED TO RUN: {e}", flush=True)
                continue
            ctx.results.append(row)
            done_est += p.est_seconds()
            left = max(0.0, total_est - done_est)
            print(
                f"  [{i:3}/{len(plans)} {_mmss(elapsed)} ~{_mmss(left)} left] "
                f"{p.name:44} {fmt_row(row)}",
                flush=True,
            )
            if row.get("check") and row["check"].get("miss_reused"):
                failures.append(
                    f"{p.name}: the pool of miss URLs ran out "
                    f"({row['check']['miss_reused']} reused)"
                )
            if quick or p.check:
                if row["failed"]:
                    failures.append(
                        f"{p.name}: {row['failed']} failed requests "
                        f"(errors {row['errors']}, non-2xx {row['non2xx']})"
                    )
                if row.get("check") and row["check"]["n_hit"] + row["check"]["n_miss"] == 0:
                    failures.append(f"{p.name}: no requests were checked")
            # Let the closed connections settle (TIME_WAIT, nginx's upstream pool) before the next.
            time.sleep(0.2 if quick else (2.0 if p.conns >= 5000 else 0.5))

        if not quick and (not only or "hop" in only) and not args.systems:
            from loadtests import hop_cost

            print("  one proxy hop, TCP vs unix socket (nginx -> nginx return 200):", flush=True)
            hop = hop_cost.measure(seconds=3.0, rounds=2)
            for h in hop:
                print(
                    f"    {h['hop']:5} {h['rps']:8,} req/s  CPU µs/req: proxy {h['front_us']}"
                    f", upstream {h['back_us']}, wrk {h['client_us']}",
                    flush=True,
                )
            front = measure_front(ctx, work, peer_tuning)
        if not quick and (not only or "profile" in only) and not args.systems and not args.attach:
            print("  the hit path's profiles (perf record -g, perf stat):", flush=True)
            profile = profile_hit_path(ctx, users, work)
        if not only or "rss" in only:
            rss = measure_rss(ctx, rss_n)
            print(
                f"  poll server RSS: {rss['rss_kb_before']} KB idle, "
                f"{rss['rss_kb_with_connections']} KB with {rss['answered']:,} connections open"
                f" ({rss['bytes_per_connection']} B each; {rss['still_open']} still open)"
            )
            if rss["answered"] != rss_n or rss["still_open"] != rss_n:
                failures.append(
                    f"rss: {rss['answered']} of {rss_n} connections answered, "
                    f"{rss['still_open']} still open"
                )
        peak = {
            f"poller-{i}": sysinfo.status_kb(pid, "VmHWM")
            for i, pid in enumerate(target.poller_pids)
        }
        failures += sanity(ctx, users, quick, after=True)
        derived = derive(ctx.results, rss)
        derived["poll_server_peak_rss_kb"] = peak
        logs = collect_logs(target.stack.run_dir)
        derived["hop"] = hop
        derived["front"] = {"rounds": front, "summary": front_cost.summary(front)}
        derived["profile"] = profile
        doc = {
            "run_id": run_id,
            "mode": "quick" if quick else "full",
            "started_utc": stamp,
            "seconds": round(time.monotonic() - t_start, 1),
            "machine": machine,
            "idle_before_start": quiet,
            "tuning": {
                "nginx": TUNING,
                "nginx_applied_via": target.nginx_vars_via,
                "poller_hop": target.poller_hop,
                "attached": bool(args.attach),
                "nofile": [hard, hard],
                "wrk": {"threads": 2, "timeout_s": 10},
                "ini": ini,
                "sysctl_changed": {},
            },
            "stack": {
                "argv": {n: p.argv for n, p in target.stack.procs.items()},
                "http_port": target.http_port,
                "poller_ports": target.poller_ports,
                "active_pollers": target.active_pollers,
                "memcached_ports": target.memcached_ports,
                "app_port": target.app_port,
            },
            "users": users,
            "derived": derived,
            "results": ctx.results,
            "logs": logs,
            "failures": failures,
        }
    finally:
        for peer in ctx.peers.values():
            peer.stop()
        if target.started_here:
            target.stack.stop()
        if doc:
            out_json.write_text(json.dumps(doc, indent=1, default=str) + "\n")
            print(f"  wrote {out_json.relative_to(ROOT)}")

    if not_run and not suffix:  # kept out of git and out of the report, as a partial run
        if raw_log.exists():
            raw_log.rename(raw_log.with_name(raw_log.name + ".tmp"))
        if out_json.exists():
            out_json = out_json.rename(out_json.with_name(out_json.name + ".tmp"))
        partial = True
    if not quick and doc:
        from loadtests import report

        doc = json.loads(out_json.read_text())  # exactly what is stored (string keys and all)
        pngs = report.plots(doc, RESULTS) if not partial else []
        if pngs:
            print("  plots: " + ", ".join(str(p.relative_to(ROOT)) for p in pngs))
        if not_run:
            print(f"  docs/benchmarks.md left as it is: {not_run} planned runs did not run")
        if not args.no_docs and not partial:
            md = report.write_markdown(doc, out_json, pngs)
            print(f"  wrote {md.relative_to(ROOT)}")
            for gone in report.prune(RESULTS, run_id):
                print(f"  removed {gone.relative_to(ROOT)} (superseded)")
        for t in doc["derived"]["targets"]:
            mark = {True: "met   ", False: "MISSED", None: "n/a   "}[t["met"]]
            by_cost = {True: "met", False: "missed", None: "n/a"}[t.get("met_by_cost")]
            print(
                f"  target {mark} {t['target']}: {t['value']} (by CPU cost: "
                f"{t.get('by_cost')}, {by_cost})"
            )
    print(
        f"bench {run_id}: {'OK' if not failures else 'FAILED'} in "
        f"{_mmss(time.monotonic() - t_start)}"
    )
    for f in failures:
        print(f"  FAIL {f}")
    return 1 if failures else 0


# The hit path's profiles: name -> (system, scenario, connections, the processes sampled, by
# cpu_groups' names). fastpoll on many keys and on one hot key at each level beside the peers'
# c50: where each one's CPU goes, and what grows with connections.
FASTPOLL_GROUPS = ("nginx", "poll_servers", "memcached")
PROFILED: dict[str, tuple[str, str, int, tuple[str, ...]]] = {
    **{
        # The c50 many-keys one is "fastpoll", as the peers' are named by system alone.
        ("fastpoll" if (c, sc) == (50, "hit-many") else f"fastpoll c{c} {sc}"): (
            "fastpoll",
            sc,
            c,
            FASTPOLL_GROUPS,
        )
        for c in (50, *HIT_LEVELS)
        for sc in ("hit-many", "hit-hot")
    },
    "memcached_pass": ("memcached_pass", "hit-many", 50, ("peer_memcached_pass", "memcached")),
    "ceiling": ("ceiling", "hit-many", 50, ("peer_ceiling", "peer_ceiling_back")),
}


def profile_hit_path(ctx: Ctx, users: int, work: Path) -> dict[str, Row]:
    """One more wrk run per profile (PROFILED), its server processes sampled by perf record and
    their system calls counted by perf stat, per process group: where each system's CPU goes
    and how many calls a request costs (kept apart from the measured rounds, which run
    unsampled)."""
    profiles: dict[str, Row] = {}
    for name, (system, scenario, conns, group_names) in PROFILED.items():
        set_active_pollers(ctx, system)
        groups = cpu_groups(ctx)
        pids = [pid for g in group_names for pid in groups.get(g, [])]
        slug = name.replace(" ", "-")
        data = work / f"perf-{slug}.data"
        proc = perf_start(pids, data)
        if proc is None:
            print("    perf is not installed: no profile", flush=True)
            return {}
        counters = {
            g: (work / f"syscalls-{slug}-{g}.txt", groups[g]) for g in group_names if groups.get(g)
        }
        stats = [syscalls_start(g_pids, out) for out, g_pids in counters.values()]
        time.sleep(0.5)  # perf attached before the load starts
        hot = scenario == "hit-hot"  # the one hot key: HOT_USER
        plan = Plan("profile", system, scenario, conns, seconds=5.0, users=1 if hot else USERS)
        try:
            row = run_plan(ctx, plan, users)
        finally:
            for st in stats:
                perf_stop(st)
            perf_stop(proc)
        prof = perf_profile(data, symbols_of=("poll_server", "nginx", "memcached"))
        n = max(1, int(row.get("requests") or 0))
        per_req = {
            g: round(1e6 * float(v) / n, 2) for g, v in (row.get("cpu_s") or {}).items() if v
        }
        calls = {g: syscalls_read(out) for g, (out, _) in counters.items()}
        profiles[name] = {
            "system": system,
            "scenario": scenario,
            "conns": conns,
            "rps": row["rps"],
            "requests": n,
            "cpu_s": row["cpu_s"],
            "us_per_request": per_req,
            "syscalls_per_request": {
                g: {k: round(v / n, 3) for k, v in c.items()} for g, c in calls.items() if c
            },
            "keys_per_round_trip": row.get("keys_per_round_trip"),
            **prof,
        }
        top = ", ".join(f"{c} {o} {v:.0f}%" for v, c, o in prof["by_process_and_object"][:3])
        ps = profiles[name]["syscalls_per_request"].get("poll_servers", {}).get("all")
        print(
            f"    {name:24} {row['rps']:8,.0f} req/s sampled"
            + (f"; poll servers {ps:.2f} syscalls/request" if ps is not None else "")
            + f"; {top}",
            flush=True,
        )
    return profiles


def measure_front(ctx: Ctx, work: Path, tuning: dict[str, object]) -> list[Row]:
    """fastpoll's site config in front of the ceiling's upstream, against the ceiling's own
    front (loadtests/front_cost.py); prints and returns its rounds."""
    back, ceiling = ctx.peers["ceiling_back"], ctx.peers["ceiling"]
    assert isinstance(back, peers.Peer) and isinstance(ceiling, peers.Peer)
    listen_port = free_port()
    site = peers.Peer(
        "fastpoll_front",
        work / "peer-fastpoll_front",
        tuning,
        {
            "fastpoll_listen": f"127.0.0.1:{listen_port}",
            "fastpoll_listen_options": str(tuning.get("listen_options", "")),
            "fastpoll_pollers": [f"unix:{back.params['socket']}"],
            "fastpoll_apps": [f"127.0.0.1:{ctx.target.app_port}"],
            "fastpoll_upstream_keepalive": TUNING["fastpoll_upstream_keepalive"],
        },
    )
    site.start()
    try:
        print("  fastpoll's site config in front vs the ceiling's (same upstream):", flush=True)
        rows = front_cost.measure(
            ceiling,
            back,
            site,
            listen_port,
            ctx.signer.query(str(HOT_USER)),
            work / "front",
        )
    finally:
        site.stop()
    for kind, v in front_cost.summary(rows).items():
        print(
            f"    {kind:5}: front nginx {v['fastpoll_site_us']} µs/req against the ceiling's "
            f"{v['ceiling_us']} ({v['extra_us']:+})",
            flush=True,
        )
    return rows


def _mmss(s: float) -> str:
    s = max(0, int(math.ceil(s)))
    return f"{s // 60}:{s % 60:02d}"


if __name__ == "__main__":
    sys.exit(main())
