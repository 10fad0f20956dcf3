#!/usr/bin/env python3
"""fastpoll status: the health of a whole stack, from its admin endpoints, in one screen.

    make status                                  # the local stack (run/stack.json)
    make status HOSTS=web1,web2                  # fleet hosts, over ssh
    testkit/fastpoll_testkit/status.py --hosts web1 --via 'ssh -o BatchMode=yes {host}'
    testkit/fastpoll_testkit/status.py --hosts localhost   # on a fleet host itself

For every poll server: up or down, requests per second, hit ratio, backend errors and
timeouts, open connections, cache servers up, the ATR; for nginx: stub_status (connections,
requests per second); for the app: up, requests per second, cache fills, publishes pending.
Rates come from two scrapes one second apart (--interval).

The admin endpoints listen on 127.0.0.1 only, so for a remote host the scrapes run on the host:
this script sends its collector to `python3 -` through --via (default ssh), which reads the
host's endpoint list, /etc/fastpoll/endpoints.json (written by Ansible), scrapes twice, and
prints the raw pages back. Only the standard library is used, on both ends. That file:

    {"pollers": {"poller-8101": 9101, ...},   admin port of each poll server (127.0.0.1)
     "nginx_status_port": 8090,               nginx stub_status (127.0.0.1), 0 or absent: none
     "app": "10.0.0.21:8000"}                 the app on this host, if any: port or host:port

Exit status: 0 if every part answers and every cache server is up, 1 otherwise, 2 on usage
errors (no stack running, a host that cannot be reached counts as down).
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
ENDPOINTS_FILE = "/etc/fastpoll/endpoints.json"

# Runs on the host being checked (locally, or by `python3 -` through ssh): no imports beyond
# the standard library, no state. ENDPOINTS is substituted before it is sent.
COLLECTOR = r"""
import json, time, urllib.error, urllib.request
ENDPOINTS = __ENDPOINTS__
INTERVAL = __INTERVAL__
if ENDPOINTS is None:
    try:
        with open(__FILE__) as f:
            ENDPOINTS = json.load(f)
    except OSError as e:
        print(json.dumps({"error": f"cannot read {__FILE__}: {e}"}))
        raise SystemExit(0)

def why(e):
    # What failed, in words: "connection refused", not "<urlopen error [Errno 111] ...>".
    r = getattr(e, "reason", e)
    if isinstance(r, TimeoutError) or "timed out" in str(r):
        return "no answer within 2 s"
    text = r.strerror if isinstance(r, OSError) and r.strerror else str(r) or type(r).__name__
    return text[:1].lower() + text[1:]

def get(where, path):
    # where: a port on 127.0.0.1, or "host:port" (the app binds the host's private address)
    addr = where if isinstance(where, str) else f"127.0.0.1:{where}"
    try:
        with urllib.request.urlopen(f"http://{addr}{path}", timeout=2) as r:
            return {"status": r.status, "body": r.read().decode("utf-8", "replace"), "addr": addr}
    except urllib.error.HTTPError as e:
        return {"status": e.code, "body": "", "addr": addr, "error": f"HTTP {e.code}"}
    except (OSError, ValueError) as e:
        return {"status": 0, "body": "", "addr": addr, "error": why(e)}

def scrape():
    out = {"t": time.monotonic(), "pollers": {}}
    for name, port in sorted(ENDPOINTS.get("pollers", {}).items()):
        out["pollers"][name] = get(port, "/metrics")
    if ENDPOINTS.get("nginx_status_port"):
        out["nginx"] = get(ENDPOINTS["nginx_status_port"], "/nginx_status")
    if ENDPOINTS.get("app"):
        out["app"] = get(ENDPOINTS["app"], "/metrics")
        out["app_health"] = get(ENDPOINTS["app"], "/healthz")
    return out

first = scrape()
time.sleep(INTERVAL)
print(json.dumps({"endpoints": ENDPOINTS, "scrapes": [first, scrape()]}))
"""

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)$")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')
# Outcomes that are a cache lookup (405, 403 and hang-ups are not).
LOOKUPS = ("hit", "miss", "invalid_key", "backend_error", "timeout")


def parse_metrics(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Prometheus text format -> {name: [(labels, value)]}."""
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if m is None:
            continue
        labels = dict(_LABEL.findall(m.group(2) or ""))
        try:
            value = float(m.group(3))
        except ValueError:
            continue
        out.setdefault(m.group(1), []).append((labels, value))
    return out


def total(m: dict[str, list[tuple[dict[str, str], float]]], name: str, **want: str) -> float:
    """Sum of the samples of `name` whose labels include `want`."""
    return sum(
        v for labels, v in m.get(name, []) if all(labels.get(k) == x for k, x in want.items())
    )


def parse_stub_status(text: str) -> dict[str, int]:
    """nginx stub_status -> active, accepts, handled, requests, reading, writing, waiting."""
    nums = [int(x) for x in re.findall(r"\d+", text)]
    keys = ("active", "accepts", "handled", "requests", "reading", "writing", "waiting")
    return dict(zip(keys, nums, strict=False)) if len(nums) == len(keys) else {}


@dataclass
class Report:
    ok: bool = True
    lines: list[str] = field(default_factory=list)

    def add(self, line: str) -> None:
        self.lines.append(line)

    def bad(self, line: str) -> None:
        self.ok = False
        self.lines.append(line)


def rate(a: float, b: float, dt: float) -> float:
    return (b - a) / dt if dt > 0 else 0.0


def pct(num: float, den: float) -> str:
    return f"{100 * num / den:5.1f}%" if den > 0 else "    -"


# Under the poll servers' table: what its less obvious columns mean.
ATR_LEGEND = (
    "  (ATR: the event loop's active-to-total ratio over the interval, descriptors ready per "
    "descriptor watched; towards 1: the loop is busy on most of them, docs/operations.md)"
)


def down_pages(s0: dict[str, Any], s1: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The poll servers whose admin endpoint did not answer 200 in either scrape: the failed
    page (the later one if both failed)."""
    out = {}
    for name, page1 in s1["pollers"].items():
        page0 = s0["pollers"].get(name, {})
        if page1.get("status") != 200 or page0.get("status") != 200:
            out[name] = page1 if page1.get("status") != 200 else page0
    return out


def report_pollers(
    s0: dict[str, Any],
    s1: dict[str, Any],
    rep: Report,
    gone: dict[str, str] | None = None,
) -> None:
    """gone: for the local stack, a poll server's process that is no longer running -> how
    its line says so (its pid and poll port)."""
    dt = s1["t"] - s0["t"]
    down = down_pages(s0, s1)
    rep.add(
        f"  {'poller':10} {'state':7} {'req/s':>8} {'hit(1s)':>7} {'hit(all)':>8} "
        f"{'err/s':>6} {'tmo/s':>6} {'errors':>7} {'timeouts':>8} {'conns':>5} "
        f"{'caches':>6} {'ATR':>7}"
    )
    for name, page1 in s1["pollers"].items():
        page0 = s0["pollers"].get(name, {})
        if name in down:
            page = down[name]
            what = page.get("error") or f"HTTP {page.get('status')}"
            addr = page.get("addr", "?")
            if gone is not None:
                proc = gone.get(name, "process running but not answering (hung or draining)")
                what = f"{what}; {proc}"
            rep.bad(f"  {name:10} {'DOWN':7} admin http://{addr}/metrics: {what}")
            continue
        a, b = parse_metrics(page0["body"]), parse_metrics(page1["body"])
        req = "fastpoll_requests_total"
        hits = [total(x, req, outcome="hit") for x in (a, b)]
        looks = [sum(total(x, req, outcome=o) for o in LOOKUPS) for x in (a, b)]
        errs = [total(x, req, outcome="backend_error") for x in (a, b)]
        tmos = [total(x, req, outcome="timeout") for x in (a, b)]
        ups = b.get("fastpoll_backend_up", [])
        n_up = sum(1 for _, v in ups if v == 1)
        active = [total(x, "fastpoll_loop_active_fds_total") for x in (a, b)]
        regd = [total(x, "fastpoll_loop_registered_fds_total") for x in (a, b)]
        atr = (active[1] - active[0]) / (regd[1] - regd[0]) if regd[1] > regd[0] else 0.0
        draining = total(b, "fastpoll_draining") == 1
        state = "drain" if draining else "up"
        line = (
            f"  {name:10} {state:7} {rate(total(a, req), total(b, req), dt):8.1f} "
            f"{pct(hits[1] - hits[0], looks[1] - looks[0]):>7} {pct(hits[1], looks[1]):>8} "
            f"{rate(errs[0], errs[1], dt):6.1f} {rate(tmos[0], tmos[1], dt):6.1f} "
            f"{int(errs[1]):7d} {int(tmos[1]):8d} "
            f"{int(total(b, 'fastpoll_open_connections')):5d} "
            f"{n_up:>3}/{len(ups):<2} {atr:7.4f}"
        )
        if n_up < len(ups) or draining:
            rep.bad(line)
            for labels, v in ups:
                if v != 1:
                    rep.add(f"  {'':10} cache {labels.get('server', '?')} DOWN (seen by {name})")
        else:
            rep.add(line)
    rep.add(ATR_LEGEND)


def report_nginx(s0: dict[str, Any], s1: dict[str, Any], rep: Report) -> None:
    if "nginx" not in s1:
        rep.add("  nginx      (no stub_status port known)")
        return
    n0, n1 = parse_stub_status(s0["nginx"]["body"]), parse_stub_status(s1["nginx"]["body"])
    if s1["nginx"].get("status") != 200 or not n1 or not n0:
        why = s1["nginx"].get("error") or f"HTTP {s1['nginx'].get('status')}"
        rep.bad(f"  nginx      DOWN ({why})")
        return
    rps = rate(n0["requests"], n1["requests"], s1["t"] - s0["t"])
    rep.add(
        f"  nginx      up      {rps:8.1f} req/s  connections {n1['active']} "
        f"(reading {n1['reading']}, writing {n1['writing']}, idle {n1['waiting']}), "
        f"{n1['requests']} requests, {n1['accepts'] - n1['handled']} connections dropped "
        "(accepted, never handled: worker_connections full)"
    )


def report_app(s0: dict[str, Any], s1: dict[str, Any], rep: Report) -> None:
    if "app" not in s1:
        rep.add("  app        (no app port known)")
        return
    if s1["app_health"].get("status") != 200 or s1["app"].get("status") != 200:
        why = s1["app"].get("error") or f"HTTP {s1['app'].get('status')}"
        rep.bad(f"  app        DOWN ({why})")
        return
    a, b = parse_metrics(s0["app"]["body"]), parse_metrics(s1["app"]["body"])
    dt = s1["t"] - s0["t"]
    req = "fastpoll_app_requests_total"
    fills = "fastpoll_app_cache_fills_total"
    fill_errors = total(b, fills, result="error")
    pending = total(b, "fastpoll_app_repair_pending")
    errors_5xx = sum(v for lb, v in b.get(req, []) if lb.get("status", "").startswith("5"))
    polls = rate(total(a, req, route="poll"), total(b, req, route="poll"), dt)
    line = (
        f"  app        up      {rate(total(a, req), total(b, req), dt):8.1f} req/s  "
        f"polls {polls:.1f}/s, fills {rate(total(a, fills), total(b, fills), dt):.1f}/s "
        f"(errors {int(fill_errors)}), 5xx {int(errors_5xx)}, publishes pending {int(pending)}"
    )
    if pending > 0:
        rep.bad(line)
    else:
        rep.add(line)


def report_host(
    host: str, data: dict[str, Any], rep: Report, gone: dict[str, str] | None = None
) -> None:
    if "error" in data:
        rep.bad(f"{host}: DOWN ({data['error']})")
        return
    s0, s1 = data["scrapes"]
    rep.add(f"{host}:")
    if s1["pollers"]:
        report_pollers(s0, s1, rep, gone)
    else:
        rep.add("  (no poll servers listed, or their admin ports are off)")
    report_nginx(s0, s1, rep)
    report_app(s0, s1, rep)


def collector_source(endpoints: dict[str, Any] | None, interval: float) -> str:
    return (
        COLLECTOR.replace("__ENDPOINTS__", repr(endpoints))
        .replace("__INTERVAL__", repr(interval))
        .replace("__FILE__", repr(ENDPOINTS_FILE))
    )


def collect(source: str, argv: list[str] | None) -> dict[str, Any]:
    """Run the collector here (argv None) or through argv (e.g. ssh host python3 -)."""
    cmd = argv or [sys.executable, "-"]
    try:
        r = subprocess.run(
            cmd, input=source, capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return {"error": str(e)}
    if r.returncode != 0:
        return {"error": (r.stderr.strip().splitlines() or [f"exit {r.returncode}"])[-1]}
    try:
        return json.loads(r.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"error": f"unreadable answer: {r.stdout[:200]!r}"}


def _stat(pid: int) -> list[str]:
    """/proc/PID/stat's fields from the third on (after the parenthesised command, which may
    hold spaces): [state, ppid, ...]; [] if there is no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return []
    return stat.rsplit(")", 1)[1].split()


def start_time(pid: int) -> int:
    """Field 22 of /proc/PID/stat: with the pid, what identifies a process the stack harness
    started."""
    fields = _stat(pid)
    return int(fields[19]) if fields else 0


def running(pid: int, started: int) -> bool:
    """The process the harness started still runs: same pid, same start time, and not a zombie
    (a killed child its parent has not reaped yet still has its /proc entry)."""
    fields = _stat(pid)
    return bool(started) and bool(fields) and fields[0] not in "ZX" and int(fields[19]) == started


def gone_processes(run_dir: Path) -> tuple[dict[str, Any], dict[str, str]]:
    """The local stack's processes (run/stack.json), and those no longer running -> a phrase
    for a poll server's line: 'process 1234 gone (poll port 8101)'."""
    procs: dict[str, Any] = json.loads((run_dir / "stack.json").read_text()).get("procs", {})
    gone = {
        n: f"process {p['pid']} gone (poll port {p.get('port')})"
        for n, p in procs.items()
        if not running(p["pid"], p.get("started", 0))
    }
    return procs, gone


def report_processes(procs: dict[str, Any], gone: dict[str, str], rep: Report) -> None:
    """Every process the local stack started, by pid: the check `make status` always made."""
    if gone:
        rep.bad(
            f"  processes  {len(procs) - len(gone)}/{len(procs)} running; gone: {', '.join(gone)}"
        )
    else:
        rep.add(f"  processes  {len(procs)}/{len(procs)} running ({', '.join(procs)})")


def local_endpoints(run_dir: Path) -> dict[str, Any] | None:
    """The local stack's endpoints from run/stack.json, in the endpoints.json shape."""
    try:
        state = json.loads((run_dir / "stack.json").read_text())
    except (OSError, ValueError):
        return None
    return {
        "pollers": state.get("admin_ports", {}),
        "nginx_status_port": state.get("nginx_status_port", 0),
        "app": state.get("app_port", 0),
        "backend": state.get("backend"),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--hosts", help="comma-separated fleet hosts (default: the local stack)")
    ap.add_argument(
        "--via",
        default="ssh -o BatchMode=yes -o ConnectTimeout=5 {host} python3 -",
        help="command that runs python3 reading stdin on {host} (default: %(default)s)",
    )
    ap.add_argument("--run-dir", type=Path, default=ROOT / "run")
    ap.add_argument("--interval", type=float, default=1.0, help="seconds between scrapes")
    args = ap.parse_args(argv)
    rep = Report()

    if not args.hosts:
        endpoints = local_endpoints(args.run_dir)
        if endpoints is None:
            print(f"fastpoll: not running (no {args.run_dir}/stack.json); `make up` first")
            return 2
        rep.add(f"fastpoll status: local stack ({endpoints.get('backend')} backend)")
        data = None
        if endpoints["pollers"]:
            data = collect(collector_source(endpoints, args.interval), None)
        # After the scrapes, so the process list and the poll servers' lines see one moment.
        procs, gone = gone_processes(args.run_dir)
        report_processes(procs, gone, rep)
        if data is not None:
            report_host("localhost", data, rep, gone)
        else:
            rep.add("  (started without admin listeners: no metrics to read)")
    else:
        hosts = [h for h in args.hosts.split(",") if h]
        src = collector_source(None, args.interval)

        def on_host(host: str) -> dict[str, Any]:
            if host in ("localhost", "127.0.0.1"):
                return collect(src, None)
            return collect(src, [x.replace("{host}", host) for x in shlex.split(args.via)])

        with ThreadPoolExecutor(max_workers=min(16, len(hosts))) as ex:  # scrapes overlap
            results = dict(zip(hosts, ex.map(on_host, hosts), strict=True))
        rep.add(f"fastpoll status: {len(hosts)} host(s)")
        for host in hosts:
            report_host(host, results[host], rep)
    print("\n".join(rep.lines))
    print("all up" if rep.ok else "NOT ALL UP")
    return 0 if rep.ok else 1


if __name__ == "__main__":
    sys.exit(main())
