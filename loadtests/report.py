"""Plots (matplotlib) and docs/benchmarks.md from one run's JSON.

    .venv/bin/python -m loadtests.report [--rederive] [--doc-only] [RUN]
    (RUN: loadtests/results/bench-YYYYmmdd-HHMMSS.json; by default the newest bench run)

bench.py calls it at the end of a full run; run it alone to redo the plots and the page from a
stored run. The prose lives in loadtests/benchmarks.md.j2 and loadtests/analysis.md.j2. The page
also reports the newest runs found beside the JSON of `make bench-longpoll` (longpoll-*.json),
`make bench-rooms` (rooms-*.json, the newest of each room size) and `make bench-writes`
(writes-*.json and plain-ab-*.json), if any. --rederive recomputes the JSON's derived figures
from its raw results first (after a change to derive.py). --doc-only rewrites the page alone,
with the run's plots as they are (what `make bench-rooms` and `make bench-writes` do).

What the page and its plots read of every run they cite is kept in loadtests/results/benchmarks.json
(one run a line), the only results git keeps for the page besides its plots: with it alone (a fresh
clone, no run files) the page and the plots are made again as they are. A run whose file is in
results/ (a run made here) is read from that file instead.
"""

from __future__ import annotations

import fnmatch
import json
import math
import os
import re
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jinja2

from loadtests.derive import PATH_GROUPS, derive  # CPU per request: the processes on a path

if TYPE_CHECKING:
    from matplotlib.axes import Axes  # imported at run time only in plots(), after use("Agg")

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


DOC = ROOT / "docs" / "benchmarks.md"

LABELS = {
    "fastpoll": "fastpoll (nginx → poll_server → memcached), shipped default",
    "fastpoll_all": "fastpoll, every poll server active",
    "direct": "poll_server directly",
    "memcached_pass": "nginx memcached_pass",
    "return200": "nginx return 200",
    "ceiling": "ceiling (nginx → nginx return 200, unix socket)",
    "app": "fallback app alone",
}
COLORS = {
    "fastpoll": "C0",
    "memcached_pass": "C1",
    "return200": "C2",
    "app": "C3",
    "direct": "C4",
    "fastpoll_all": "C5",
    "ceiling": "C6",
}


def _sweep(doc: dict) -> dict[str, dict[int, dict]]:
    """The sweep with int concurrency keys (JSON turned them into strings)."""
    return {s: {int(c): v for c, v in pts.items()} for s, pts in doc["derived"]["sweep"].items()}


def plots(doc: dict, out_dir: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run_id = doc["run_id"]
    sweep = _sweep(doc)
    machine = doc["machine"]
    subtitle = (
        f"{run_id}: {machine['nproc']} cores ({machine['cpu_model']}), "
        f"wrk -t2 keep-alive, 100,000 keys, all hits"
    )
    paths = []

    levels = sorted({c for pts in sweep.values() for c in pts})

    def conc_axis(ax: Axes) -> None:
        ax.set_xscale("log")
        ax.set_xticks(
            levels,
            [f"{c:,}" for c in levels],
            rotation=45,
            fontsize=8,
        )
        ax.minorticks_off()
        ax.set_xlabel("concurrent connections")

    fig, ax = plt.subplots(figsize=(9, 5.5))
    for system, points in sweep.items():
        cs = sorted(points)
        ax.plot(
            cs,
            [points[c]["rps"] for c in cs],
            marker="o",
            label=LABELS.get(system, system),
            color=COLORS.get(system),
        )
        bad = [c for c in cs if points[c]["failed"]]
        if bad:
            ax.plot(
                bad,
                [points[c]["rps"] for c in bad],
                "x",
                color="red",
                markersize=10,
                mew=2,
                label=f"{LABELS.get(system, system).split(' (')[0]}: failed requests",
            )
    conc_axis(ax)
    ax.set_ylabel("requests / second")
    ax.set_ylim(bottom=0)
    ax.grid(True, which="both", alpha=0.3)
    ax.set_title("Requests per second against concurrency\n" + subtitle, fontsize=10)
    ax.legend(fontsize=8)
    p = out_dir / f"{run_id}-rps.png"
    fig.tight_layout()
    fig.savefig(p, dpi=110)
    plt.close(fig)
    paths.append(p)

    fig, axes = plt.subplots(1, 2, figsize=(12, 5), sharey=True)
    for ax, key, title in ((axes[0], "p50_ms", "p50"), (axes[1], "p99_ms", "p99")):
        for system, points in sweep.items():
            cs = sorted(points)
            ax.plot(
                cs,
                [points[c][key] for c in cs],
                marker="o",
                label=LABELS.get(system, system),
                color=COLORS.get(system),
            )
        conc_axis(ax)
        ax.set_yscale("log")
        ax.set_title(f"{title} latency")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("milliseconds")
    axes[1].legend(fontsize=8)
    fig.suptitle("Latency percentiles against concurrency\n" + subtitle, fontsize=10)
    p = out_dir / f"{run_id}-latency.png"
    fig.tight_layout()
    fig.savefig(p, dpi=110)
    plt.close(fig)
    paths.append(p)

    rows = c50_rows(doc)
    fig, ax = plt.subplots(figsize=(9, 0.45 * len(rows) + 1.5))
    names = [r["label"] for r in rows][::-1]
    vals = [r["rps"] or 0 for r in rows][::-1]
    ax.barh(names, vals, color=[COLORS.get(r["system"], "C7") for r in rows][::-1])
    for y, v in enumerate(vals):
        ax.text(v, y, f" {v:,.0f}", va="center", fontsize=8)
    ax.set_xlabel("requests / second (wrk -t2 -c50, keep-alive; median of the repeats)")
    ax.set_title(f"50 keep-alive connections, every system and scenario ({run_id})", fontsize=10)
    ax.tick_params(axis="y", labelsize=8)
    p = out_dir / f"{run_id}-c50.png"
    fig.tight_layout()
    fig.savefig(p, dpi=110)
    plt.close(fig)
    paths.append(p)
    return paths


SCENARIOS = {
    "hit-hot": "hits, one hot key",
    "hit-many": "hits, 100,000 keys",
    "mix95": "95% hits / 5% misses",
    "mix50": "50% hits / 50% misses",
    "miss": "all misses (fallback to the app)",
    "nocache-msg": "no cache, users with an unread message",
    "nocache-empty": "no cache, users with nothing new (empty answer)",
}


def c50_rows(doc: dict) -> list[dict]:
    """One row per (system, scenario, method) of the c50 group, medians over the repeats."""
    import statistics

    groups: dict[tuple, list[dict]] = {}
    for r in doc["results"]:
        if r["group"] == "c50":
            groups.setdefault((r["system"], r["scenario"], r["method"]), []).append(r)
    order = ["fastpoll", "fastpoll_all", "direct", "memcached_pass", "ceiling", "return200", "app"]
    out = []
    scen_order = list(SCENARIOS)
    for (system, scen, method), rs in sorted(
        groups.items(), key=lambda kv: (order.index(kv[0][0]), kv[0][2], scen_order.index(kv[0][1]))
    ):

        def med(k: str, rs: list[dict] = rs) -> float | None:
            vals = [r[k] for r in rs if r.get(k) is not None]
            return statistics.median(vals) if vals else None

        # Only the processes on this system's path: the others idle through its runs.
        cpu = [
            {k: (v if k in PATH_GROUPS[system] else 0.0) for k, v in r["cpu_s"].items()} for r in rs
        ]
        out.append(
            {
                "system": system,
                "scenario": scen,
                "method": method,
                "runs": len(rs),
                "label": f"{LABELS[system].split(' (')[0]}: {SCENARIOS.get(scen, scen)} {method}",
                "rps": med("rps"),
                "p50_ms": med("p50_ms"),
                "p99_ms": med("p99_ms"),
                "busy": med("machine_busy_share"),
                "failed": sum(r["failed"] for r in rs),
                "fallbacks": sum(r.get("fallbacks_seen", 0) for r in rs),
                "mc_gets": sum(r["memcached"]["cmd_get"] for r in rs),
                "requests": sum(r["requests"] for r in rs),
                "cpu": {
                    k: round(
                        sum(c[k] for c in cpu) / max(1, sum(r["requests"] for r in rs)) * 1e8, 1
                    )
                    for k in cpu[0]
                },  # ms per 100,000 requests
                "client_cpu": round(
                    sum(r["client_cpu_s"] for r in rs)
                    / max(1, sum(r["requests"] for r in rs))
                    * 1e8,
                    1,
                ),
                "other": med("other_cpu_share"),
            }
        )
    return out


def ab_rows(doc: dict) -> list[dict]:
    import statistics

    groups: dict[tuple, list[dict]] = {}
    for r in doc["results"]:
        if r["group"] == "ab":
            groups.setdefault((r["system"], r["keepalive"]), []).append(r)
    out = []
    order = ["fastpoll", "memcached_pass", "return200", "app"]
    for (system, ka), rs in sorted(
        groups.items(), key=lambda kv: (kv[0][1], order.index(kv[0][0]))
    ):
        n = max(1, sum(r["requests"] for r in rs))
        server = (
            sum(sum(v for k, v in r["cpu_s"].items() if k in PATH_GROUPS[system]) for r in rs)
            / n
            * 1e6
        )
        out.append(
            {
                "system": system,
                "label": LABELS[system],
                "keepalive": ka,
                "runs": len(rs),
                "server_us": round(server, 1),
                "client_us": round(sum(r["client_cpu_s"] for r in rs) / n * 1e6, 1),
                "n": rs[0]["requests"],
                "rps": statistics.median(r["rps"] for r in rs),
                "rps_all": [round(r["rps"]) for r in rs],
                "p50_ms": statistics.median(r["p50_ms"] for r in rs),
                "p99_ms": statistics.median(r["p99_ms"] for r in rs),
                "failed": sum(r["failed"] for r in rs),
            }
        )
    return out


# What the page read of every run it cites, one run a line (loadtests/results/benchmarks.json, kept
# in git): the page and its plots are made again from it alone. A run's own JSON and raw log stay
# beside it on the machine that made them (git ignores them); a run there is read from its file.
SUMMARY = "benchmarks.json"


def _summarized(results: Path) -> dict[str, Any]:
    p = results / SUMMARY
    return json.loads(p.read_text())["runs"] if p.exists() else {}


def stored(results: Path, pattern: str) -> list[Path]:
    """The runs named like pattern in results/: their files, and the runs the summary keeps."""
    names = {p.name for p in results.glob(pattern)}
    names |= {n for n in _summarized(results) if fnmatch.fnmatchcase(n, pattern)}
    return sorted(results / n for n in names)


def load(p: Path) -> dict:
    """A run: its file if it is here, else what the summary kept of it."""
    if p.exists():
        return json.loads(p.read_text())
    return _summarized(p.parent)[p.name]


class _Seen(dict):
    """A run's dict that notes every key read (the page's and the plots' reads make the summary)."""

    def __init__(self, v: dict, path: tuple, seen: set) -> None:
        super().__init__(v)
        self._seen_path, self._seen = path, seen

    def _at(self, k: Any) -> Any:
        self._seen.add((*self._seen_path, k))
        return _seen(dict.__getitem__(self, k), (*self._seen_path, k), self._seen)

    def __getitem__(self, k: Any) -> Any:
        return self._at(k)

    def get(self, k: Any, default: Any = None) -> Any:
        return self._at(k) if dict.__contains__(self, k) else default

    def __contains__(self, k: object) -> bool:
        if dict.__contains__(self, k):
            self._seen.add((*self._seen_path, k))
            return True
        return False

    def __iter__(self) -> Any:
        for k in dict.keys(self):
            self._seen.add((*self._seen_path, k))
            yield k

    def __len__(self) -> int:
        self._seen.update((*self._seen_path, k) for k in dict.keys(self))
        return dict.__len__(self)

    def keys(self) -> Any:
        return list(iter(self))

    def values(self) -> Any:
        return [self._at(k) for k in dict.keys(self)]

    def items(self) -> Any:
        return [(k, self._at(k)) for k in dict.keys(self)]


class _SeenList(list):
    def __init__(self, v: list, path: tuple, seen: set) -> None:
        super().__init__(v)
        self._seen_path, self._seen = path, seen
        seen.add(path)

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(list.__len__(self)))]
        i = i if i >= 0 else i + list.__len__(self)
        return _seen(list.__getitem__(self, i), (*self._seen_path, i), self._seen)

    def __iter__(self) -> Any:
        for i in range(list.__len__(self)):
            yield self[i]

    def __reversed__(self) -> Any:
        for i in reversed(range(list.__len__(self))):
            yield self[i]


def _seen(v: Any, path: tuple, seen: set) -> Any:
    if isinstance(v, dict):
        return _Seen(v, path, seen)
    if isinstance(v, list):
        return _SeenList(v, path, seen)
    return v


def _kept(v: Any, path: tuple, seen: set) -> Any:
    """v without what was not read: a dict keeps the keys read, a list read keeps every element."""
    if isinstance(v, dict):
        return {k: _kept(x, (*path, k), seen) for k, x in v.items() if (*path, k) in seen}
    if isinstance(v, list):
        return [_kept(x, (*path, i), seen) for i, x in enumerate(v)] if path in seen else []
    return v


def latest_longpoll(results: Path) -> Path | None:
    """The newest full `make bench-longpoll` run in results/ (stamped names sort by time)."""
    runs = stored(results, "longpoll-[0-9]*-[0-9]*.json")
    return runs[-1] if runs else None


ROOM_SIZES = (1000, 10000)  # the rooms the page reports (make bench-rooms)
JITTER_KIND = "jitter[0-9]*-"  # rooms runs with fastpoll at another jitter_pct too
BUSY_KIND = "rate[0-9]*-"  # rooms runs at more than one message a second


def latest(results: Path, prefix: str) -> Path | None:
    """The newest stamped run `<prefix>-<stamp>.json` in results/."""
    runs = stored(results, f"{prefix}-[0-9]*-[0-9]*.json")
    return runs[-1] if runs else None


def _rooms_run(p: Path) -> bool:
    """A run of make bench-rooms (interleaved rounds, a summary); earlier single runs, which
    docs/channels.md may cite, are left alone."""
    try:
        return "summary" in load(p)
    except (OSError, ValueError, KeyError):
        return False


def latest_rooms(results: Path, kind: str = "") -> list[Path]:
    """The newest rooms run (interleaved rounds, with a summary) of each size in ROOM_SIZES, of
    one kind: "" (one message a second, the shipped configuration: the main table), JITTER_KIND
    or BUSY_KIND."""
    found: dict[int, Path] = {}
    for p in sorted(stored(results, f"rooms-{kind}[0-9]*-[0-9]*.json"), key=lambda p: p.name[-20:]):
        doc = load(p)
        if "summary" in doc and doc.get("members") in ROOM_SIZES:
            found[doc["members"]] = p
    return [found[n] for n in ROOM_SIZES if n in found]


def cited_side_runs(results: Path) -> list[Path]:
    """The rooms, write-side and plain-poll runs the page cites."""
    found = [
        latest(results, "writes"),
        latest(results, "plain-ab"),
        latest(results, "rooms-perf"),
        latest(results, "rooms-perf-stream"),
        *latest_rooms(results),
        *latest_rooms(results, JITTER_KIND),
        *latest_rooms(results, BUSY_KIND),
    ]
    return [p for p in found if p is not None]


PERF_GROUPS = {  # perf's comm -> the page's process group
    "nginx": "nginx",
    "poll_server": "poll servers",
    "mc-worker": "memcached",
    "mc-lrumaint": "memcached",
    "mc-lrucrawler": "memcached",
    "memcached": "memcached",
    "redis-server": "Redis",
    "python": "app",
    "python3": "app",
}


def perf_split(by_comm_dso: list[list[Any]]) -> list[dict[str, Any]]:
    """Samples' shares per process group, and how much of each was in the kernel."""
    out: dict[str, dict[str, Any]] = {}
    for pct, comm, dso in by_comm_dso:
        g = out.setdefault(
            PERF_GROUPS.get(comm, comm),
            {"group": PERF_GROUPS.get(comm, comm), "pct": 0.0, "kernel": 0.0},
        )
        g["pct"] += pct
        if dso == "[kernel.kallsyms]":
            g["kernel"] += pct
    return sorted(out.values(), key=lambda g: -g["pct"])


def prune(results: Path, run_id: str) -> list[Path]:
    """Remove the runs the page no longer cites: the page reports one run of each kind (one
    rooms run per size), and results/ keeps only what it cites (partial runs are *.tmp, ignored
    by git)."""
    keep = {latest_longpoll(results), *cited_side_runs(results)}
    gone = [
        p
        for p in sorted(results.glob("bench-*"))
        + sorted(results.glob("longpoll-*.json"))
        + [p for p in sorted(results.glob("rooms-*.json")) if _rooms_run(p)]
        + sorted(results.glob("writes-*.json"))
        + sorted(results.glob("plain-ab-*.json"))
        if not p.name.startswith(f"{run_id}-")
        and not p.name.startswith(f"{run_id}.")
        and p not in keep
        and not p.name.endswith(".tmp")
    ]
    for p in gone:
        p.unlink()
    return gone


def write_markdown(doc: dict, json_path: Path, pngs: list[Path], out: Path = DOC) -> Path:
    """The page from the bench run doc (stored as json_path) and the newest side runs beside it;
    then what the page and the plots read of each run, as the summary beside them."""
    results = json_path.parent
    runs: dict[str, dict] = {}
    seen: dict[str, set] = {}

    def read(p: Path, d: dict | None = None) -> Any:
        runs[p.name] = load(p) if d is None else d
        return _seen(runs[p.name], (), seen.setdefault(p.name, set()))

    doc = read(json_path, doc)
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(HERE),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    # The previous build's checkout, as plain_ab.py's command names it, without its commit.
    env.filters["base_build"] = lambda c: re.sub(
        r"fastpoll-base-[0-9a-f]+(\+dirty)?", "fastpoll-base", c
    )
    env.filters["n"] = lambda v, d=0: "–" if v is None else f"{v:,.{d}f}"
    # Truncated, not rounded: 0.897 must not read as the 0.90 it misses.
    env.filters["x"] = lambda v: "–" if v is None else f"{math.floor(v * 100) / 100:.2f}×"
    env.filters["ms"] = lambda v: (
        "–" if v is None else (f"{v:.2f}" if v < 10 else f"{v:.1f}" if v < 100 else f"{v:,.0f}")
    )
    sweep = _sweep(doc)
    levels = sorted({c for pts in sweep.values() for c in pts})
    rel = os.path.relpath
    c50 = c50_rows(doc)
    ab = ab_rows(doc)
    for c in c50:  # per-request CPU in µs, by role, for the analysis
        c["us"] = {
            "client": c["client_cpu"] / 100,
            "nginx": (
                c["cpu"]["nginx"]
                + c["cpu"].get("peer_memcached_pass", 0)
                + c["cpu"].get("peer_return200", 0)
                + c["cpu"].get("peer_ceiling", 0)
                + c["cpu"].get("peer_ceiling_back", 0)
            )
            / 100,
            "poll": c["cpu"]["poll_servers"] / 100,
            "mc": c["cpu"]["memcached"] / 100,
            "app": (c["cpu"]["app"] + c["cpu"].get("peer_app", 0)) / 100,
        }
        c["us"]["total"] = sum(c["us"].values())
    row = {(c["system"], c["scenario"], c["method"]): c for c in c50}
    abrow = {(a["system"], a["keepalive"]): a for a in ab}
    lp_path = latest_longpoll(results)
    rooms, rooms_jitter, rooms_busy = (
        [(read(p), rel(p, out.parent)) for p in latest_rooms(results, k)]
        for k in ("", JITTER_KIND, BUSY_KIND)
    )
    side = {}
    for prefix in ("writes", "plain-ab", "rooms-perf", "rooms-perf-stream"):
        sp = latest(results, prefix)
        side[prefix] = (read(sp), rel(sp, out.parent)) if sp else None
    text = env.get_template("benchmarks.md.j2").render(
        d=doc,
        m=doc["machine"],
        dv=doc["derived"],
        r=doc["derived"]["ratios"],
        c50=c50,
        ab=ab,
        row=row,
        abrow=abrow,
        sweep=sweep,
        levels=levels,
        labels=LABELS,
        cpu_names={
            "poll_servers": "poll",
            "nginx": "nginx",
            "memcached": "mc",
            "app": "fallback app",
            "peer_app": "app",
            "peer_memcached_pass": "nginx",
            "peer_return200": "nginx",
        },
        json_rel=rel(json_path, out.parent),
        summary_rel=rel(results / SUMMARY, out.parent),
        png={p.stem.rsplit("-", 1)[1]: rel(p, out.parent) for p in pngs},
        lp=read(lp_path) if lp_path else None,
        rooms=rooms,
        rooms_jitter=rooms_jitter,
        rooms_busy=rooms_busy,
        writes=side["writes"],
        plain_ab=side["plain-ab"],
        rooms_perf=side["rooms-perf"],
        rooms_perf_stream=side["rooms-perf-stream"],
        perf_split=perf_split,
    )
    with tempfile.TemporaryDirectory() as tmp:  # what the plots read is kept too
        plots(doc, Path(tmp))
    out.write_text(text)
    lines = [f" {json.dumps(n)}: {json.dumps(_kept(runs[n], (), seen[n]))}" for n in sorted(runs)]
    (results / SUMMARY).write_text('{"runs": {\n' + ",\n".join(lines) + "\n}}\n")
    return out


def rederive(doc: dict) -> dict:
    """The derived figures again from the stored raw results (they are a pure function of them);
    what was measured apart (memory, the hop) is kept."""
    old = doc["derived"]
    new = derive(doc["results"], old.get("rss", {}))
    for k in ("poll_server_peak_rss_kb", "hop"):
        if k in old:
            new[k] = old[k]
    doc["derived"] = json.loads(json.dumps(new))
    return doc


def main() -> int:
    args = [a for a in sys.argv[1:] if a not in ("--rederive", "--doc-only")]
    if len(args) > 1:
        print(__doc__, file=sys.stderr)
        return 2
    if args:
        path = Path(args[0]).resolve()
    else:  # the newest bench run, its file or what the summary kept of it
        benches = stored(HERE / "results", "bench-[0-9]*-[0-9]*.json")
        if not benches:
            print("no bench run in loadtests/results/", file=sys.stderr)
            return 2
        path = benches[-1]
    doc = load(path)
    if "--rederive" in sys.argv:
        if not path.exists():
            print(
                f"--rederive needs the run's own JSON ({path.name}), not the summary",
                file=sys.stderr,
            )
            return 2
        doc = rederive(doc)
        path.write_text(json.dumps(doc, indent=1, default=str) + "\n")
    if "--doc-only" in sys.argv:
        pngs = sorted(path.parent.glob(f"{path.stem}-*.png"))
    else:
        pngs = plots(doc, path.parent)
    print(write_markdown(doc, path, pngs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
