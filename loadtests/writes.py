"""The write side (docs/benchmarks.md): publishes/s and CPU per message, single publishes
against batches, on SQLite and PostgreSQL.

    .venv/bin/python -m loadtests.writes [--seconds 10] [--batch 100] [--rounds 2]

Each case on a fresh stack from the harness (testkit/fastpoll_testkit: memcached, announcements
on the stack's Redis, one app process with `--workers 1`, its database SQLite or a throwaway
PostgreSQL). One client in this process sends one request at a time to the app's own listener
for `--seconds`: `POST /api/messages` (single) or `POST /api/messages/batch` with `--batch`
items (batch); every message goes to its own user (a key per message, the worst case: nothing
is shared between them). CPU is utime+stime from /proc of the app (its process tree) and the
database (PostgreSQL's postmaster and backends; SQLite runs inside the app), and, reported
apart, memcached and Redis. The cases run in interleaved rounds (each store's single and batch
back to back), so other work's load falls on them alike; the summary is the median per case.
The target: at most 0.3 ms of CPU (app and database) per batched message.

JSON: loadtests/results/writes-<stamp>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from fastpoll_testkit.procs import free_port
from fastpoll_testkit.stack import Stack
from loadtests import sysinfo
from loadtests.longpoll import tree

RESULTS = Path(__file__).resolve().parent / "results"
TARGET_MS = 0.3


def start(run_dir: Path, db: str) -> Stack:
    stack = Stack(run_dir=run_dir, db=db, app_workers=1, redis_port=free_port(), n_pollers=1)
    stack.start()
    return stack


def measure(stack: Stack, seconds: float, batch: int, first_uid: int) -> dict[str, Any]:
    p = stack.procs
    groups = {
        "app": tree(p["app"].pid),
        "database": tree(p["postgres"].pid) if "postgres" in p else [],
        "memcached": [v.pid for k, v in p.items() if k.startswith("memcached-")],
        "redis": [p["redis"].pid] if "redis" in p else [],
    }
    headers = {"Authorization": f"Bearer {stack.api_token}"}
    n, uid, statuses = 0, first_uid, {"pending": 0, "ok": 0}
    with httpx.Client(base_url=stack.app_url(), headers=headers, timeout=60) as c:
        c.post("/api/messages", json={"user_id": 1, "text": "warm"}).raise_for_status()
        c.post(
            "/api/messages/batch", json={"items": [{"user_id": 2, "text": "warm"}]}
        ).raise_for_status()
        # The database's backends exist now: measured from here.
        groups["database"] = tree(p["postgres"].pid) if "postgres" in p else []
        meter = sysinfo.CpuMeter(groups)
        meter.start()
        t0 = time.monotonic()
        for _ in range(10_000_000):  # bounded; ends after `seconds`
            if time.monotonic() - t0 > seconds:
                break
            if batch == 1:
                r = c.post("/api/messages", json={"user_id": uid, "text": f"m{uid}"})
            else:
                items = [{"user_id": uid + i, "text": f"m{uid + i}"} for i in range(batch)]
                r = c.post("/api/messages/batch", json={"items": items})
            if r.status_code != 201:
                raise RuntimeError(f"{r.status_code} {r.text[:200]}")
            pub = r.headers.get("x-cache-publish", "")
            statuses[pub] = statuses.get(pub, 0) + 1
            n += batch
            uid += batch
        wall = time.monotonic() - t0
        cpu = meter.stop()
    per = {g: round(v / n * 1000, 4) for g, v in cpu.items()}
    return {
        "batch": batch,
        "messages": n,
        "requests": n // batch,
        "wall_s": round(wall, 2),
        "messages_per_s": round(n / wall, 1),
        "cpu_s": cpu,
        "cpu_ms_per_message": per,
        "app_and_database_ms_per_message": round(per["app"] + per["database"], 4),
        "x_cache_publish": statuses,
    }


def summarize(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for db in ("sqlite", "postgresql"):
        for batch in sorted({r["batch"] for r in runs}):
            rs = [r for r in runs if r["db"] == db and r["batch"] == batch]
            if not rs:
                continue

            def med(f: str, rs: list[dict[str, Any]] = rs) -> float:
                return round(statistics.median(r[f] for r in rs), 4)

            out.append(
                {
                    "db": db,
                    "batch": batch,
                    "rounds": len(rs),
                    "messages_per_s": med("messages_per_s"),
                    "app_ms_per_message": round(
                        statistics.median(r["cpu_ms_per_message"]["app"] for r in rs), 4
                    ),
                    "database_ms_per_message": round(
                        statistics.median(r["cpu_ms_per_message"]["database"] for r in rs), 4
                    ),
                    "app_and_database_ms_per_message": med("app_and_database_ms_per_message"),
                    "all_rounds_app_and_database_ms": [
                        r["app_and_database_ms_per_message"] for r in rs
                    ],
                }
            )
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=10)
    ap.add_argument("--batch", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--dbs", nargs="+", default=["sqlite", "postgresql"])
    args = ap.parse_args()
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    run_dir = Path(os.environ.get("FP_RUN_DIR", f"/tmp/fastpoll-writes-{stamp}"))
    load0 = os.getloadavg()
    runs: list[dict[str, Any]] = []
    for rnd in range(1, args.rounds + 1):
        for db in args.dbs:
            for batch in (1, args.batch):
                stack = start(run_dir / f"{db}-{batch}-r{rnd}", db)
                try:
                    la = os.getloadavg()
                    r = measure(stack, args.seconds, batch, 1_000_000)
                finally:
                    stack.stop()
                r.update(db=db, round=rnd, loadavg_start=la, loadavg_end=os.getloadavg())
                runs.append(r)
                print(
                    f"{db:10} r{rnd} batch {batch:3}: {r['messages_per_s']:8.1f} msg/s, "
                    f"CPU/msg app {r['cpu_ms_per_message']['app']:.3f} ms + database "
                    f"{r['cpu_ms_per_message']['database']:.3f} ms = "
                    f"{r['app_and_database_ms_per_message']:.3f} ms "
                    f"(memcached {r['cpu_ms_per_message']['memcached']:.3f}, redis "
                    f"{r['cpu_ms_per_message']['redis']:.3f}) load {la[0]:.1f}",
                    flush=True,
                )
    summary = summarize(runs)
    batched = [s for s in summary if s["batch"] > 1]
    doc = {
        "stamp": stamp,
        "command": f"python -m loadtests.writes --seconds {args.seconds:g} "
        f"--batch {args.batch} --rounds {args.rounds} --dbs {' '.join(args.dbs)}",
        "machine": {"cpus": os.cpu_count(), "cpu_model": sysinfo.cpu_model()},
        "loadavg_start": load0,
        "loadavg_end": os.getloadavg(),
        "target_ms_per_batched_message": TARGET_MS,
        "target_met": all(s["app_and_database_ms_per_message"] <= TARGET_MS for s in batched),
        "runs": runs,
        "summary": summary,
    }
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"writes-{stamp}.json"
    out.write_text(json.dumps(doc, indent=1) + "\n")
    for s in summary:
        print(json.dumps(s))
    print(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
