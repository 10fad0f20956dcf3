"""The benchmark's derived figures (ratios, CPU per request, the targets) from its raw results: a
pure function of them, so loadtests/report.py --rederive can redo them from a stored run."""

from __future__ import annotations

import statistics
from typing import Any

# The processes each system's requests go through, for CPU per request.
PATH_GROUPS = {
    "fastpoll": ("nginx", "poll_servers", "memcached", "app"),
    "fastpoll_all": ("nginx", "poll_servers", "memcached", "app"),
    "direct": ("poll_servers", "memcached"),
    "memcached_pass": ("peer_memcached_pass", "memcached"),
    "return200": ("peer_return200",),
    "ceiling": ("peer_ceiling", "peer_ceiling_back"),
    "app": ("peer_app",),
}
# Of those, the nginx in front of the upstream; the rest is behind it (the hit path's split).
FRONT_GROUP = {
    "fastpoll": "nginx",
    "fastpoll_all": "nginx",
    "memcached_pass": "peer_memcached_pass",
    "ceiling": "peer_ceiling",
}


# ---- derived figures ---------------------------------------------------------------------------

# One run's result row, and the derived document, as stored in the run's JSON: their fields are
# numbers, strings and nested objects by key, so their values are typed as JSON values (Any).
Row = dict[str, Any]


def _median(rows: list[Row], key: str = "rps") -> float | None:
    vals = [float(r[key]) for r in rows if r.get(key) is not None]
    return statistics.median(vals) if vals else None


def pick(results: list[Row], **kw: object) -> list[Row]:
    return [r for r in results if all(r.get(k) == v for k, v in kw.items())]


def cost_us(r: Row, client: bool = True) -> float:
    """CPU microseconds one request cost the processes on its path (and the client's own)."""
    cpu: dict[str, float] = r["cpu_s"]
    total = sum(cpu.get(g, 0.0) for g in PATH_GROUPS[str(r["system"])])
    if client:
        total += float(r["client_cpu_s"])
    return total / max(1, int(r["requests"])) * 1e6


def derive(results: list[Row], rss: Row) -> Row:
    def med(**kw: object) -> float | None:
        return _median(pick(results, **kw))

    def cost(**kw: object) -> float | None:
        """CPU µs per request over the matching runs (their CPU over their requests)."""
        rows = pick(results, **kw)
        n = sum(int(r["requests"]) for r in rows)
        return sum(cost_us(r) * int(r["requests"]) for r in rows) / n if n else None

    def ratio(a: float | None, b: float | None) -> float | None:
        return round(a / b, 3) if a and b else None

    def ab_bound(system: str) -> float | None:
        """ab's two-core model: ab on one core, the servers on the other; the slower side
        sets the pace (µs per request)."""
        rows = pick(results, group="ab", system=system, keepalive=False)
        n = sum(int(r["requests"]) for r in rows)
        if not n:
            return None
        server = sum(cost_us(r, client=False) * int(r["requests"]) for r in rows) / n
        client = sum(float(r["client_cpu_s"]) for r in rows) / n * 1e6
        return max(server, client)

    ab = {
        f"{s}{'_k' if ka else ''}": med(group="ab", system=s, keepalive=ka)
        for s in ("fastpoll", "return200", "memcached_pass", "app")
        for ka in (False, True)
    }
    c50 = {
        f"{s}_{sc}": med(group="c50", system=s, scenario=sc, method="GET")
        for s in ("fastpoll", "fastpoll_all", "memcached_pass", "return200", "ceiling", "direct")
        for sc in ("hit-hot", "hit-many")
    }
    for sc in ("nocache-msg", "nocache-empty"):
        c50[f"app_{sc}"] = med(group="c50", system="app", scenario=sc)
    for sc in ("mix95", "mix50", "miss"):
        c50[f"fastpoll_{sc}"] = med(group="c50", system="fastpoll", scenario=sc)
    for sc in ("hit-hot", "hit-many"):
        c50[f"fastpoll_{sc}_POST"] = med(group="c50", system="fastpoll", scenario=sc, method="POST")
    c50["return200_hit-hot_POST"] = med(group="c50", system="return200", method="POST")

    sweep: dict[str, dict[int, Row]] = {}
    for r in pick(results, group="sweep"):
        point = {
            k: r.get(k)
            for k in (
                "rps",
                "p50_ms",
                "p99_ms",
                "failed",
                "errors",
                "non2xx",
                "other_cpu_share",
                "fallbacks_seen",
                "tcp",
            )
        }
        n = max(1, int(r["requests"]))
        point["cpu_us_per_req"] = {
            g: round(v / n * 1e6, 1)  # the path's own processes
            for g, v in r["cpu_s"].items()
            if g in PATH_GROUPS[str(r["system"])]
        }
        point["client_us_per_req"] = round(float(r["client_cpu_s"]) / n * 1e6, 1)
        sweep.setdefault(str(r["system"]), {})[int(r["conns"])] = point

    def flat(system: str, c: int) -> float | None:
        s = sweep.get(system, {})
        if c in s and 50 in s:
            return ratio(s[c]["rps"], s[50]["rps"])
        return None

    # CPU of the poll servers per 100,000 hits, in the c50 GET hit runs through nginx.
    cpu = {}
    for sys_ in ("fastpoll", "direct"):
        for sc in ("hit-hot", "hit-many"):
            rows = pick(results, group="c50", system=sys_, scenario=sc, method="GET")
            reqs = sum(int(r["requests"]) for r in rows)
            secs = sum(float(r["cpu_s"]["poll_servers"]) for r in rows)
            if reqs:
                cpu[f"{sys_}_{sc}"] = round(secs / reqs * 100_000 * 1000, 1)  # ms
    ratios = {
        "c50_vs_memcached_pass_hot": ratio(c50["fastpoll_hit-hot"], c50["memcached_pass_hit-hot"]),
        "c50_vs_memcached_pass_many": ratio(
            c50["fastpoll_hit-many"], c50["memcached_pass_hit-many"]
        ),
        "c50_vs_return200_hot": ratio(c50["fastpoll_hit-hot"], c50["return200_hit-hot"]),
        "ab_vs_return200": ratio(ab["fastpoll"], ab["return200"]),
        "ab_k_vs_return200": ratio(ab["fastpoll_k"], ab["return200_k"]),
        "ab_vs_memcached_pass": ratio(ab["fastpoll"], ab["memcached_pass"]),
        "c50_vs_app": ratio(c50["fastpoll_hit-many"], c50["app_nocache-msg"]),
        "c50_vs_app_empty": ratio(c50["fastpoll_hit-many"], c50["app_nocache-empty"]),
        "ab_vs_app": ratio(ab["fastpoll"], ab["app"]),
        "sweep_10000_vs_50": flat("fastpoll", 10000),
        "sweep_15000_vs_50": flat("fastpoll", 15000),
        "peer_memcached_pass_15000_vs_50": flat("memcached_pass", 15000),
        "peer_return200_15000_vs_50": flat("return200", 15000),
    }
    hit = _hit_table(results)
    fp = sweep.get("fastpoll", {})
    sweep_errors = sum(int(v["failed"]) for c, v in fp.items() if c >= 10000)

    # The same ratios from CPU cost per request: the other system's cost over ours. On a machine
    # whose CPU other work shares, req/s depends on how much CPU was left to each run; the cost of
    # a request does not, and on an idle machine (everything CPU-bound) it predicts the req/s ratio.
    def cratio(ours: float | None, theirs: float | None) -> float | None:
        return round(theirs / ours, 3) if ours and theirs else None

    def sweep_cost(system: str, c: int) -> float | None:
        return cost(group="sweep", system=system, conns=c)

    costs = {
        "c50_vs_memcached_pass_hot": cratio(
            cost(group="c50", system="fastpoll", scenario="hit-hot", method="GET"),
            cost(group="c50", system="memcached_pass", scenario="hit-hot", method="GET"),
        ),
        "c50_vs_memcached_pass_many": cratio(
            cost(group="c50", system="fastpoll", scenario="hit-many", method="GET"),
            cost(group="c50", system="memcached_pass", scenario="hit-many", method="GET"),
        ),
        "c50_vs_app": cratio(
            cost(group="c50", system="fastpoll", scenario="hit-many", method="GET"),
            cost(group="c50", system="app", scenario="nocache-msg"),
        ),
        "c50_vs_app_empty": cratio(
            cost(group="c50", system="fastpoll", scenario="hit-many", method="GET"),
            cost(group="c50", system="app", scenario="nocache-empty"),
        ),
        "ab_vs_return200": cratio(ab_bound("fastpoll"), ab_bound("return200")),
        "sweep_10000_vs_50": cratio(sweep_cost("fastpoll", 10000), sweep_cost("fastpoll", 50)),
        "sweep_15000_vs_50": cratio(sweep_cost("fastpoll", 15000), sweep_cost("fastpoll", 50)),
    }
    targets = [
        _target(
            "wrk -c50 keep-alive, hot key: fastpoll >= 1.0x nginx memcached_pass",
            ratios["c50_vs_memcached_pass_hot"],
            1.0,
            costs["c50_vs_memcached_pass_hot"],
        ),
        _target(
            "wrk -c50 keep-alive, 100,000 keys: fastpoll >= 1.0x nginx memcached_pass",
            ratios["c50_vs_memcached_pass_many"],
            1.0,
            costs["c50_vs_memcached_pass_many"],
        ),
        _target(
            "sweep flat: 10,000 connections >= 0.9x its own 50",
            ratios["sweep_10000_vs_50"],
            0.9,
            costs["sweep_10000_vs_50"],
        ),
        _target(
            "sweep flat: 15,000 connections >= 0.9x its own 50",
            ratios["sweep_15000_vs_50"],
            0.9,
            costs["sweep_15000_vs_50"],
        ),
        {
            "target": "sweep: 0 errors or timeouts at 10,000 and 15,000",
            "value": sweep_errors,
            "need": 0,
            "met": (sweep_errors == 0) if {10000, 15000} & set(fp) else None,
            "by_cost": None,
            "met_by_cost": None,
        },
        _target(
            "ab -c 50 -n 5000: fastpoll >= 0.95x nginx return 200",
            ratios["ab_vs_return200"],
            0.95,
            costs["ab_vs_return200"],
        ),
        _target(
            "wrk -c50: fastpoll >= 10x the app alone (users with a message)",
            ratios["c50_vs_app"],
            10.0,
            costs["c50_vs_app"],
        ),
        _target(
            "wrk -c50: fastpoll >= 10x the app alone (users with nothing new)",
            ratios["c50_vs_app_empty"],
            10.0,
            costs["c50_vs_app_empty"],
        ),
    ]
    for key, system in (("shipped default", "fastpoll"), ("every poller active", "fastpoll_all")):
        h = hit.get(system, {})

        def of(col: str, field: str, h: Row = h) -> float | None:
            v = h.get(col, {}).get(field)
            return None if v is None else float(v)

        cols = [c for c in hit.get("memcached_pass", {}) if c in h]
        checks = [
            (f"{col}: fastpoll >= 0.9x the ceiling", of(col, "vs_ceiling"), 0.9)
            for col in ("c50 hit-many", "c50 hit-hot")
        ]
        # At least memcached_pass in every cell; a hot key 1.1x (coalescing must show).
        for col in cols:
            need = 1.1 if col.endswith("hit-hot") else 1.0
            checks.append(
                (
                    f"{col}: fastpoll >= {need:.1f}x memcached_pass",
                    of(col, "vs_memcached_pass"),
                    need,
                )
            )
        checks += [
            (
                f"{sc.removeprefix('hit-')} key{'s' if sc == 'hit-many' else ''}: "
                "c1000 >= 0.85x c50",
                ratio(of(f"c1000 {sc}", "rps"), of(f"c50 {sc}", "rps")),
                0.85,
            )
            for sc in ("hit-many", "hit-hot")
        ]
        targets += [_target(f"hit path, {key}, {w}", v, n) for w, v, n in checks]
    return {
        "ab": ab,
        "c50": c50,
        "hit": hit,
        "sweep": sweep,
        "ratios": ratios,
        "cost_ratios": costs,
        "cpu_ms_per_100k_hits": cpu,
        "rss": rss,
        "targets": targets,
    }


def _target(what: str, value: float | None, need: float, by_cost: float | None = None) -> Row:
    return {
        "target": what,
        "value": value,
        "need": need,
        "met": None if value is None else value >= need,
        "by_cost": by_cost,
        "met_by_cost": None if by_cost is None else by_cost >= need,
    }


def _hit_table(results: list[Row]) -> Row:
    """The hit path against the design's ceiling and memcached_pass: for each system and each
    column (c50, c1000 and c5000, each on one hot key and on many keys), the median req/s of its
    interleaved rounds, and the median over the rounds of its ratio to the ceiling's and to
    memcached_pass's req/s in the same round (a round's systems run back to back, so the load
    other work puts on the machine drifts less within a round than across the run)."""
    cols: dict[str, list[Row]] = {}
    for sc in ("hit-hot", "hit-many"):
        cols[f"c50 {sc}"] = pick(results, group="c50", scenario=sc, method="GET")
    for c in sorted({int(r["conns"]) for r in pick(results, group="hit")}):
        for sc in ("hit-hot", "hit-many"):
            if rows := pick(results, group="hit", conns=c, scenario=sc):
                cols[f"c{c} {sc}"] = rows

    def per_round(rows: list[Row], system: str, peer: str) -> float | None:
        by_rep = {(str(r["system"]), int(r["rep"])): float(r["rps"]) for r in rows}
        vals = [
            v / by_rep[(peer, rep)]
            for (s, rep), v in by_rep.items()
            if s == system and by_rep.get((peer, rep))
        ]
        return round(statistics.median(vals), 3) if vals else None

    def split_us(rows: list[Row], system: str) -> Row:
        """Median CPU µs per request: the client, nginx in front, and what is behind it."""
        own = [r for r in rows if r["system"] == system and r.get("requests")]
        if not own:
            return {}

        def med(f: Any) -> float:
            return round(statistics.median(f(r) / r["requests"] * 1e6 for r in own), 1)

        front = FRONT_GROUP[system]
        behind = [g for g in PATH_GROUPS[system] if g not in (front, "app")]
        return {
            "client": med(lambda r: float(r.get("client_cpu_s") or 0.0)),
            "front": med(lambda r: float(r["cpu_s"].get(front, 0.0))),
            "behind": med(lambda r: sum(float(r["cpu_s"].get(g, 0.0)) for g in behind)),
        }

    table: Row = {}
    for col, rows in cols.items():
        for system in ("ceiling", "memcached_pass", "fastpoll_all", "fastpoll"):
            table.setdefault(system, {})[col] = {
                "rps": _median(pick(rows, system=system)),
                "vs_ceiling": per_round(rows, system, "ceiling"),
                "vs_memcached_pass": per_round(rows, system, "memcached_pass"),
                "us": split_us(rows, system),
                # The poll servers' keys per memcached round trip (runs that counted them).
                "keys_per_round_trip": _median(
                    pick(rows, system=system), key="keys_per_round_trip"
                ),
            }
    return table
