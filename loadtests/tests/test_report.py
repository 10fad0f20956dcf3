"""The derived figures, the plots and the page, from synthetic results (no load is run)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from loadtests import derive, front_cost, plans, report

# The committed long-poll run the page cites (make bench-longpoll replaces it).
LONGPOLL_RUN = report.latest_longpoll(Path(report.__file__).resolve().parent / "results")

HERE = Path(__file__).resolve().parent


CPU = {
    "poll_servers": 0.0,
    "nginx": 0.0,
    "memcached": 0.0,
    "app": 0.0,
    "peer_return200": 0.0,
    "peer_memcached_pass": 0.0,
}
MC = {
    "cmd_get": 0,
    "get_hits": 0,
    "get_misses": 0,
    "cmd_set": 0,
    "total_connections": 0,
    "curr_connections": 0,
}


def row(
    group: str,
    system: str,
    scenario: str,
    conns: int,
    rps: float,
    tool: str = "wrk",
    keepalive: bool = True,
    method: str = "GET",
    failed: int = 0,
    rep: int = 0,
    poll_cpu: float = 0.0,
) -> dict:
    return {
        "name": f"{group} {system} {scenario} {conns}",
        "group": group,
        "system": system,
        "scenario": scenario,
        "method": method,
        "rep": rep,
        "users": 100000,
        "hit_ratio": 1.0,
        "tool": tool,
        "url": "http://x",
        "conns": conns,
        "keepalive": keepalive,
        "requests": int(rps * 5),
        "duration_s": 5.0,
        "rps": rps,
        "p50_ms": 1.0,
        "p75_ms": 1.5,
        "p90_ms": 2.0,
        "p99_ms": 5.0,
        "p999_ms": 9.0,
        "mean_ms": 1.2,
        "max_ms": 20.0,
        "errors": {"connect": 0, "read": 0, "write": 0, "timeout": failed},
        "non2xx": 0,
        "failed": failed,
        "check": None,
        "client_cpu_s": 1.0,
        "command": [],
        "cpu_s": {**CPU, "poll_servers": poll_cpu, "nginx": 1.0},
        "memcached": MC,
        "machine_busy_share": 0.9,
        "other_cpu_share": 0.01,
    }


@pytest.fixture
def results() -> list[dict]:
    rows = []
    for ka in (False, True):
        rows += [
            row("ab", "fastpoll", "hit-hot", 50, 9500, "ab", ka),
            row("ab", "return200", "hit-hot", 50, 10000, "ab", ka),
            row("ab", "memcached_pass", "hit-hot", 50, 9000, "ab", ka),
        ]
    rows.append(row("ab", "app", "nocache-msg", 50, 900, "ab", False))
    for rep in range(2):
        rows += [
            row("c50", "fastpoll", "hit-hot", 50, 20000 + rep, rep=rep, poll_cpu=2.0),
            row("c50", "memcached_pass", "hit-hot", 50, 18000, rep=rep),
            row("c50", "return200", "hit-hot", 50, 50000, rep=rep),
            row("c50", "fastpoll", "hit-many", 50, 17000, rep=rep, poll_cpu=2.0),
            row("c50", "memcached_pass", "hit-many", 50, 19000, rep=rep),
            row("c50", "app", "nocache-msg", 50, 1000, rep=rep),
        ]
    rows += [
        row("c50", "fastpoll", "miss", 50, 1500),
        row("c50", "fastpoll", "hit-many", 50, 15000, method="POST"),
        row("c50", "app", "nocache-empty", 50, 3000),
    ]
    for c, f in ((50, 17000), (10000, 16000), (15000, 15000)):
        rows += [
            row("sweep", "fastpoll", "hit-many", c, f),
            row(
                "sweep",
                "memcached_pass",
                "hit-many",
                c,
                19000 if c == 50 else 9000,
                failed=0 if c == 50 else 100,
            ),
            row("sweep", "return200", "hit-many", c, 50000),
        ]
    return rows


def test_derive(results: list[dict]) -> None:
    d = derive.derive(results, {})
    r = d["ratios"]
    assert r["ab_vs_return200"] == pytest.approx(0.95)
    assert r["c50_vs_memcached_pass_hot"] == pytest.approx(20000.5 / 18000, abs=1e-3)
    assert r["c50_vs_memcached_pass_many"] == pytest.approx(17000 / 19000, abs=1e-3)
    assert r["c50_vs_app"] == pytest.approx(17.0)
    assert r["c50_vs_app_empty"] == pytest.approx(17000 / 3000, abs=1e-3)
    assert r["sweep_15000_vs_50"] == pytest.approx(15000 / 17000, abs=1e-3)
    met = {t["target"].split(":")[0]: t["met"] for t in d["targets"]}
    assert met["wrk -c50 keep-alive, hot key"] is True
    assert met["wrk -c50 keep-alive, 100,000 keys"] is False
    assert met["ab -c 50 -n 5000"] is True
    assert met["sweep"] is True  # 0 errors for fastpoll at 10,000 and 15,000
    # 2 s of poll server CPU for 100,000 requests (20,000 req/s * 5 s) -> 2,000 ms per 100,000
    assert d["cpu_ms_per_100k_hits"]["fastpoll_hit-hot"] == pytest.approx(2000.0, rel=1e-3)


def test_plots_and_page(results: list[dict], tmp_path: Path) -> None:
    # The ceiling's rows: its upstream (the back nginx) costs 0.5 s of the 5 s run.
    for rep in range(2):
        ceiling = row("c50", "ceiling", "hit-many", 50, 25000, rep=rep)
        ceiling["cpu_s"] = {**ceiling["cpu_s"], "peer_ceiling": 1.0, "peer_ceiling_back": 0.5}
        results.append(ceiling)
        # The hit group at 1,000 connections: both pay more per request in nginx and wrk.
        hit_ceiling = row("hit", "ceiling", "hit-many", 1000, 20000, rep=rep)
        hit_ceiling["cpu_s"] = {
            **hit_ceiling["cpu_s"],
            "peer_ceiling": 1.5,
            "peer_ceiling_back": 0.6,
        }
        hit_fastpoll = row("hit", "fastpoll", "hit-many", 1000, 12000, rep=rep, poll_cpu=2.0)
        hit_fastpoll["keys_per_round_trip"] = 5.0 + rep  # the poll servers' batches
        results += [hit_ceiling, hit_fastpoll]
    doc: dict[str, Any] = {
        "run_id": "bench-test",
        "mode": "full",
        "started_utc": "x",
        "seconds": 1.0,
        "machine": {
            "nproc": 2,
            "cpu_model": "CPU",
            "kernel": "k",
            "os": "os",
            "mem_total_mb": 1,
            "nofile_limit": {"soft": 1, "hard": 1},
            "loadavg_at_start": [0, 0, 0],
            "sysctl": {"a.b": "1"},
            "versions": {
                "nginx": "n",
                "memcached": "m",
                "wrk": "w",
                "ab": "a",
                "libevent": "e",
                "libmemcached": "l",
            },
            "git": {"commit": "abc", "dirty": False},
        },
        "tuning": {"nginx": plans.TUNING, "nginx_applied_via": "test", "sysctl_changed": {}},
        "stack": {"poller_ports": [1, 2], "active_pollers": 1},
        "users": 100000,
        "derived": derive.derive(
            results,
            {
                "answered": 10000,
                "rss_kb_before": 7000,
                "rss_kb_with_connections": 30000,
                "bytes_per_connection": 2355,
                "still_open": 10000,
            },
        ),
        "results": results,
    }
    doc["derived"]["poll_server_peak_rss_kb"] = {"poller-0": 15000}
    doc["derived"]["hop"] = [
        {
            "hop": "tcp",
            "round": 0,
            "rps": 1,
            "failed": 0,
            "front_us": 20.0,
            "back_us": 10.0,
            "client_us": 12.0,
        },
        {
            "hop": "unix",
            "round": 0,
            "rps": 1,
            "failed": 0,
            "front_us": 18.0,
            "back_us": 7.0,
            "client_us": 12.0,
        },
    ]
    front_rows = [
        {"round": 0, "kind": kind, "system": system, "front_us": us}
        for kind, system, us in (
            ("plain", "ceiling", 15.0),
            ("plain", "fastpoll_site", 16.2),
            ("held", "ceiling", 15.0),
            ("held", "fastpoll_site", 18.0),
        )
    ]
    doc["derived"]["front"] = {"rounds": front_rows, "summary": front_cost.summary(front_rows)}
    doc["derived"]["profile"] = {
        system: {
            "rps": 16000.0,
            "cpu_s": {},
            "data": "x",
            "by_process_and_object": [
                [41.5, "nginx", "[kernel.kallsyms]"],
                [20.0, "poll_server", "[kernel.kallsyms]"],
            ],
            "poll_server_symbols": [
                [30.0, "[kernel.kallsyms]", "[k] tcp_sendmsg"],
                [4.0, "poll_server", "[.] key_derive"],
            ],
        }
        for system in ("fastpoll", "memcached_pass", "ceiling")
    }
    doc = json.loads(json.dumps(doc))  # as stored: integer keys become strings
    json_path = tmp_path / "bench-test.json"
    json_path.write_text(json.dumps(doc))
    pngs = report.plots(doc, tmp_path)
    assert [p.name for p in pngs] == [
        "bench-test-rps.png",
        "bench-test-latency.png",
        "bench-test-c50.png",
    ]
    assert all(p.stat().st_size > 10_000 for p in pngs)
    # The newest long-poll run beside the bench's is reported with it.
    assert LONGPOLL_RUN is not None
    (tmp_path / LONGPOLL_RUN.name).write_text(json.dumps(report.load(LONGPOLL_RUN)))
    for name, side in (
        ("rooms-20260101-000000.json", rooms_doc(1000, 150.0)),  # older: not the one cited
        ("rooms-20260102-000000.json", rooms_doc(1000, 90.0, streams=True)),
        ("rooms-20260102-010000.json", rooms_doc(10000, 30.0)),
        ("writes-20260102-000000.json", writes_doc()),
        ("plain-ab-20260102-000000.json", plain_ab_doc()),
        ("rooms-perf-20260102-000000.json", rooms_perf_doc()),
    ):
        (tmp_path / name).write_text(json.dumps(side))
    md = report.write_markdown(doc, json_path, pngs, out=tmp_path / "benchmarks.md").read_text()
    assert "## Channels: a room's delivery, the write side, plain polls" in md
    assert "| 1,000 | fastpoll | 60,000 / 60,000 | 80.0 / 300 ms | **90.0 µs** | 40.0 |" in md
    assert "| 1,000 | Nchan | 60,000 / 60,000 | 90.0 / 400 ms | **45.0 µs** | 45.0 | – |" in md
    assert "| 10,000 | fastpoll | 600,000 / 600,000 |" in md
    assert "150.0 µs" not in md
    assert "1,000 members: CPU 90.0 µs against 45.0 µs, **not met** (2.00× Nchan's);" in md
    assert "10,000 members: CPU 30.0 µs against 45.0 µs, **met** (0.67× Nchan's);" in md
    # The streams' rows and targets: only the 1,000-member run has them.
    assert "### A room's message to every member as event streams" in md
    assert "| 1,000 | proxied stream (floor) | 60,000 / 60,000 | 0 | 10.0 / 50.0 ms |" in md
    assert "| 10,000 | fastpoll stream |" not in md
    assert "- 1,000 members: CPU 30.0 µs against the floor's 25.0 µs, 1.20×, **not met**;" in md
    assert "p99 90.0 ms against Nchan long poll's 400 ms, **met**;" in md
    assert "the poll servers' memory 2.00 KB per held stream, **met**" in md
    assert "| PostgreSQL | batch of 100 | 800 | 0.200 ms | 0.050 ms | **0.250 ms** |" in md
    assert "| SQLite | single | 200 | 1.400 ms | (in the app) | **1.400 ms** |" in md
    assert "**met** in this run" in md
    assert "| fastpoll, the previous build | 10,000 |" in md
    assert "This build over the previous one: req/s **0.990×** with ab" in md
    assert "CPU per request\n**0.980×** and **1.020×**" in md
    assert "| memcached | 15.0% | 11.0% |" in md  # mc-worker and mc-lrumaint together
    assert "| poll servers | 30.0% | 21.0% |" in md
    assert "`fp_hold_add` 2.5%" in md
    assert "## Conditional and long polls, against Nchan" in md
    assert f"[{LONGPOLL_RUN.stem}](benchmarks.json)" in md
    assert "× less CPU per\ndelivered message at each size" in md
    assert "![requests per second against concurrency](bench-test-rps.png)" in md
    assert "| 15,000 | 15,000 |" in md  # the sweep table
    assert "0.95×" in md
    assert "### wrk -c50 keep-alive against nginx `memcached_pass`" in md
    assert "saves about **5.0 µs per" in md  # (20 + 10) - (18 + 7)
    assert "### The hit path against the design's ceiling: where the CPU goes" in md
    assert "mc; 5.5 keys/round trip) |" in md  # c1000: the median of 5.0 and 6.0
    assert "| nginx `[kernel.kallsyms]` | 41.5 | nginx `[kernel.kallsyms]` | 41.5 |" in md
    assert "`[.] key_derive` (poll_server) 4.0%" in md
    assert "take 30% and the poll server's\nown code" in md
    assert (
        "costs nginx 16.2 µs per\nrequest against the ceiling's proxy location's 15.0\n(+1.2 µs)"
        in md
    )
    assert "and 18.0 against\n15.0 for a poll with `wait=`" in md
    assert "| `fastpoll_active_pollers` | auto: 1 of 2 |" in md
    assert "hit path, shipped default, c50 hit-many" in md
    assert "**From 50 to 1,000 connections**" in md
    # ceiling: client 1 s / 100,000 requests = 10 µs, front 1.5 s, behind 0.6 s; c50: 1.0 and 0.5
    assert "| the ceiling | 8.0 → 10.0 | 8.0 → 15.0 | 4.0 → 6.0 | 20.0 → 31.0 | 0.80× |" in md
    assert "### The sweep: flat to 15,000 connections?" in md
    assert "### Against the app alone" in md

    # What the page and the plots read of each run is kept in benchmarks.json: with the runs'
    # files gone, the page and the plots come out the same from it alone.
    assert (tmp_path / report.SUMMARY).stat().st_size < json_path.stat().st_size
    for p in tmp_path.glob("*-*.json"):
        p.unlink()
    again = report.write_markdown(
        report.load(json_path), json_path, pngs, out=tmp_path / "again.md"
    )
    assert again.read_text() == md
    replot = tmp_path / "replot"
    replot.mkdir()
    for p in report.plots(report.load(json_path), replot):
        assert p.read_bytes() == (tmp_path / p.name).read_bytes()


def rooms_doc(members: int, fp_cpu: float, streams: bool = False) -> dict[str, Any]:
    """A loadtests/rooms.py run, 2 rounds, fastpoll at fp_cpu µs per delivery, Nchan at 45; with
    streams also the event-stream systems: fastpoll's at 30 µs, the floor's at 25, Nchan's at 20."""
    groups = {"nginx": 40.0, "poll_servers": 25.0, "app": 5.0, "redis": 1.0, "memcached": 19.0}
    systems: list[tuple[str, float, dict[str, float], tuple[float, float]]] = [
        ("fastpoll", fp_cpu, groups, (80.0, 300.0)),
        ("nchan", 45.0, {"nginx": 45.0}, (90.0, 400.0)),
    ]
    if streams:
        systems += [
            ("fastpoll-stream", 30.0, {**groups, "nginx": 15.0, "poll_servers": 8.0}, (20.0, 90.0)),
            ("nchan-eventsource", 20.0, {"nginx": 20.0}, (15.0, 60.0)),
            ("proxied-stream", 25.0, {"nginx": 24.0, "upstream": 1.0}, (10.0, 50.0)),
        ]
    runs, summary = [], {}
    for system, cpu, g, lat in systems:
        pss = {k: 2000 for k in g}
        for rnd in (1, 2):
            runs.append(
                {
                    "system": system,
                    "round": rnd,
                    "members": members,
                    "messages": 30,
                    "delivered": members * 30,
                    "misses": 0,
                    "p50_ms": lat[0],
                    "p99_ms": lat[1],
                    "cpu_us_per_delivered": cpu,
                    "poll_answers": {"200": members * 30},
                    "superseded": 0,
                    "cpu_us_per_answer": cpu,
                    "pss_kb_per_1000_held_total": 2000 * len(g),
                    "loadavg_start": [3.0, 3.0, 3.0],
                    "loadavg_end": [4.0, 4.0, 4.0],
                }
            )
        summary[system] = {
            "rounds": 2,
            "delivered": members * 60,
            "expected": members * 60,
            "misses": 0,
            "p50_ms": lat[0],
            "p99_ms": lat[1],
            "cpu_us_per_delivered": cpu,
            "cpu_us_per_delivered_by_group": g,
            "pss_kb_per_1000_held_total": 12000,
            "pss_kb_per_1000_held": pss,
            "superseded": 0,
            "errors": {},
        }
    return {
        "stamp": "x",
        "command": f"python -m loadtests.rooms --members {members}",
        "members": members,
        "seconds": 30,
        "rate": 1,
        "rounds": 2,
        "client_processes": 1,
        "machine": {"cpus": 2, "cpu_model": "AMD EPYC"},
        "loadavg_start": [3.0, 3.0, 3.0],
        "loadavg_end": [4.0, 4.0, 4.0],
        "runs": runs,
        "summary": summary,
    }


def rooms_perf_doc() -> dict[str, Any]:
    doc = rooms_doc(1000, 200.0)
    doc["command"] += " --systems fastpoll --perf DIR"
    doc["runs"][0]["perf"] = {
        "by_process_and_object": [
            [26.0, "nginx", "[kernel.kallsyms]"],
            [21.0, "poll_server", "[kernel.kallsyms]"],
            [10.0, "nginx", "nginx"],
            [9.0, "poll_server", "poll_server"],
            [10.0, "mc-worker", "[kernel.kallsyms]"],
            [1.0, "mc-lrumaint", "[kernel.kallsyms]"],
            [4.0, "mc-worker", "memcached"],
        ],
        "poll_server_symbols": [
            [3.5, "[kernel.kallsyms]", "[k] vfs_writev"],
            [2.5, "poll_server", "[.] fp_hold_add"],
        ],
    }
    return doc


def writes_doc() -> dict[str, Any]:
    summary = [
        {
            "db": db,
            "batch": b,
            "rounds": 2,
            "messages_per_s": mps,
            "app_ms_per_message": app,
            "database_ms_per_message": dbms,
            "app_and_database_ms_per_message": app + dbms,
            "all_rounds_app_and_database_ms": [app + dbms, app + dbms],
        }
        for db, b, mps, app, dbms in (
            ("sqlite", 1, 200.0, 1.4, 0.0),
            ("sqlite", 100, 2000.0, 0.08, 0.0),
            ("postgresql", 1, 40.0, 3.0, 1.0),
            ("postgresql", 100, 800.0, 0.2, 0.05),
        )
    ]
    return {
        "command": "python -m loadtests.writes",
        "machine": {"cpus": 2, "cpu_model": "AMD EPYC"},
        "loadavg_start": [3.0, 3.0, 3.0],
        "loadavg_end": [4.0, 4.0, 4.0],
        "target_ms_per_batched_message": 0.3,
        "target_met": True,
        "summary": summary,
    }


def plain_ab_doc() -> dict[str, Any]:
    fig = {
        "ab_cpu_us_per_request": 60.0,
        "wrk_cpu_us_per_request": 40.0,
        "ab_rps": 10000.0,
        "ab_p50_ms": 4.0,
        "ab_p99_ms": 9.0,
        "wrk_rps": 20000.0,
        "wrk_p99_ms": 5.0,
    }
    return {
        "command": "python -m loadtests.plain_ab",
        "old": {"label": "cc9fbe0"},
        "new": {"label": "63564ab"},
        "machine": {"cpus": 2, "cpu_model": "AMD EPYC"},
        "loadavg_start": [3.0, 3.0, 3.0],
        "loadavg_end": [4.0, 4.0, 4.0],
        "rounds": [
            {"round": 1, "loadavg": [3.0, 3.0, 3.0], "old": fig, "new": fig, "memcached_pass": fig}
        ],
        "summary": {
            "old": fig,
            "new": fig,
            "memcached_pass": fig,
            "ratios": {
                "ab_new_over_old": 0.99,
                "wrk_new_over_old": 1.01,
                "ab_new_over_memcached_pass": 1.0,
                "wrk_new_over_memcached_pass": 1.0,
                "ab_old_over_memcached_pass": 1.0,
                "ab_cpu_new_over_old": 0.98,
                "wrk_cpu_new_over_old": 1.02,
                "wrk_old_over_memcached_pass": 1.0,
            },
        },
    }


def test_prune_keeps_only_what_the_page_cites(tmp_path: Path) -> None:
    names = [
        "bench-20260101-000000.json",
        "bench-20260101-000000-raw.log",
        "bench-20260101-000000-rps.png",
        "bench-20260102-000000.json",
        "bench-20260102-000000-raw.log",
        "bench-20260102-000000-rps.png",
        "longpoll-20260101-000000.json",
        "longpoll-20260102-000000.json",
        "drill-20260101-000000-herd.json",
        "partial-20260103-000000.json.tmp",
        "writes-20260101-000000.json",
        "writes-20260102-000000.json",
        "plain-ab-20260101-000000.json",
        "plain-ab-20260102-000000.json",
    ]
    for n in names:
        (tmp_path / n).write_text("{}")
    rooms = {  # the newest of each size is cited; an old-format run (no summary) is let be
        "rooms-20260101-000000.json": rooms_doc(1000, 90.0),
        "rooms-20260102-000000.json": rooms_doc(10000, 30.0),
        "rooms-20260103-000000.json": rooms_doc(1000, 80.0),
        "rooms-20260104-000000.json": {"members": 1000},
    }
    for n, d in rooms.items():
        (tmp_path / n).write_text(json.dumps(d))
    names += list(rooms)
    gone = report.prune(tmp_path, "bench-20260102-000000")
    assert sorted(p.name for p in gone) == [
        "bench-20260101-000000-raw.log",
        "bench-20260101-000000-rps.png",
        "bench-20260101-000000.json",
        "longpoll-20260101-000000.json",
        "plain-ab-20260101-000000.json",
        "rooms-20260101-000000.json",
        "writes-20260101-000000.json",
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(set(names) - {p.name for p in gone})
