"""Running the benchmark's plans against a stack and its peers: one plan's client run and its CPU
accounting, the memory with many connections, the answers' sanity checks, the machine's quiet
wait, and the one-line summary of a result."""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass, field
from pathlib import Path

from fastpoll_testkit import loadgen
from loadtests import conns, peers, preload, stackctl, sysinfo
from loadtests.derive import Row  # a result row: JSON values by key
from loadtests.plans import APP_EMPTY_BASE, APP_USERS, HOT_USER, Plan
from loadtests.signing import Signer

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


@dataclass
class Ctx:
    args: argparse.Namespace
    target: stackctl.Target
    peers: dict[str, peers.Peer | peers.AppPeer]
    raw_log: Path
    signer: Signer
    targets: Path  # directory of the signed query files
    app_users: int = APP_USERS
    miss_pool: int = 40_000
    miss_prefix: int = 0
    results: list[Row] = field(default_factory=list)

    def next_miss_prefix(self) -> str:
        # A miss polls a user id nobody polled before: 11 digits of tenths of a second (unique
        # across runs) and 8 digits of counter: 19 digits, below 2**63.
        self.miss_prefix = max(self.miss_prefix + 1, int(time.time() * 10) % 10**11)
        return str(self.miss_prefix)

    def miss_file(self) -> Path:
        """Signed queries of users never polled before, fresh for every run."""
        prefix = self.next_miss_prefix()
        return self.signer.write(
            self.targets / "misses.txt", (f"{prefix}{i:08d}" for i in range(1, self.miss_pool + 1))
        )

    def write_targets(self, users: int) -> None:
        self.targets.mkdir(parents=True, exist_ok=True)
        self.signer.write(self.targets / "hits.txt", (str(u) for u in range(1, users + 1)))
        # The app alone (peers.AppPeer: no signed URLs, as without fastpoll) polls its users
        # written 0NNN: it answers them from SQLite like any poll, but never reads or fills the
        # cache for a non-canonical spelling of the id.
        (self.targets / "app-msg.txt").write_text(
            "".join(f"user_id=0{preload.APP_USER_BASE + i}\n" for i in range(1, APP_USERS + 1))
        )
        (self.targets / "app-empty.txt").write_text(
            "".join(f"user_id=0{APP_EMPTY_BASE + i}\n" for i in range(1, 20_001))
        )


# ---- running one plan ---------------------------------------------------------------------------


def system_url(ctx: Ctx, system: str) -> tuple[str, str]:
    """(base URL, poll path) of a system."""
    t = ctx.target
    if system in ("fastpoll", "fastpoll_all"):
        return t.base_url, "/Poll/getMessages"
    if system == "direct":
        return f"http://127.0.0.1:{t.poller_ports[0]}", "/getMessages"
    return ctx.peers[system].base_url, "/Poll/getMessages"


def set_active_pollers(ctx: Ctx, system: str) -> None:
    """Before a fastpoll run: nginx sends to the poll servers the template's default chooses
    ("fastpoll": `make up`'s and the Ansible role's "auto"), or to all of them ("fastpoll_all").
    A change reloads the stack's nginx and waits until the old workers are gone, so no run
    measures two generations."""
    stack = ctx.target.stack
    want = 0 if system == "fastpoll_all" else None  # None: the default
    if (
        system not in ("fastpoll", "fastpoll_all")
        or stack.nginx_vars.get("fastpoll_active_pollers") == want
    ):
        return
    old = set(sysinfo.children(ctx.target.nginx_pid))
    if want is None:
        stack.nginx_vars.pop("fastpoll_active_pollers", None)
    else:
        stack.nginx_vars["fastpoll_active_pollers"] = want
    stack.reload_nginx()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        now = set(sysinfo.children(ctx.target.nginx_pid))
        if now and not now & old:
            break
        time.sleep(0.05)
    time.sleep(0.5)


def cpu_groups(ctx: Ctx) -> dict[str, list[int]]:
    t = ctx.target
    groups = {
        "poll_servers": t.poller_pids,
        "nginx": [t.nginx_pid, *sysinfo.children(t.nginx_pid)],
        "memcached": t.memcached_pids,
        "app": [t.app_pid, *sysinfo.children(t.app_pid)],
    }
    for name, peer in ctx.peers.items():
        groups[f"peer_{name}"] = [peer.pid, *sysinfo.children(peer.pid)]
    return groups


def run_plan(ctx: Ctx, p: Plan, users: int) -> Row:
    base, path = system_url(ctx, p.system)
    app = p.system == "app"
    empty = p.scenario == "nocache-empty"  # users the app has nothing for
    targets = ctx.targets / ("app-empty.txt" if empty else "app-msg.txt" if app else "hits.txt")
    n_users = min(p.users, 20_000 if empty else ctx.app_users if app else users)
    env = {
        "FP_PATH": path,
        "FP_TARGETS": str(targets),
        "FP_USERS": str(n_users),
        "FP_HIT": str(p.hit),
        "FP_METHOD": p.method,
    }
    if p.hit < 1:
        env["FP_MISSES"] = str(ctx.miss_file())
    if p.check:
        env["FP_CHECK"] = "status" if app else p.check
        if p.system in ("fastpoll", "direct") and p.scenario.startswith("hit"):
            env["FP_SOURCE"] = "cache"
    meter = sysinfo.CpuMeter(cpu_groups(ctx))
    ours = p.system in ("fastpoll", "fastpoll_all", "direct")
    admin = ctx.target.stack.admin_ports if ours else []
    batches_before = stackctl.cache_batches(admin)
    mc_before = stackctl.memcached_stats(ctx.target.memcached_ports)
    meter.start()
    busy0, irq0, total0 = sysinfo.machine_cpu()
    tcp0 = sysinfo.tcp_counters()
    if p.tool == "ab":
        body = None
        if p.method == "POST":
            body = ctx.raw_log.parent / "post-body.json.tmp"
            body.write_text('{"since":0}')
        query = targets.open().readline().strip()  # the first user: the hot one
        r = loadgen.run_ab(
            f"{base}{path}?{query}",
            p.conns,
            p.n,
            p.keepalive,
            raw_log=ctx.raw_log,
            method_body=body,
        )
    else:
        r = loadgen.run_wrk(
            f"{base}{path}",
            p.conns,
            p.seconds,
            threads=2,
            env=env,
            timeout_s=10.0,
            raw_log=ctx.raw_log,
        )
    cpu = meter.stop()
    busy1, irq1, total1 = sysinfo.machine_cpu()
    tcp1 = sysinfo.tcp_counters()
    mc = stackctl.mc_delta(mc_before, stackctl.memcached_stats(ctx.target.memcached_ports))
    keys_per_trip = stackctl.keys_per_round_trip(batches_before, stackctl.cache_batches(admin))
    row: Row = {
        "name": p.name,
        "group": p.group,
        "system": p.system,
        "scenario": p.scenario,
        "method": p.method,
        "rep": p.rep,
        "users": n_users,
        "hit_ratio": p.hit,
        **r.as_dict(),
        "cpu_s": cpu,
        "memcached": mc,
        # Whatever else ran on the machine meanwhile (other users, the kernel's own threads):
        # busy CPU of the whole machine minus interrupts, ours and the client's, as a share of
        # its capacity. Interrupt time (mostly our own loopback softirq) is shown apart.
        "machine_busy_share": round((busy1 - busy0) / max(1e-9, total1 - total0), 3),
        "irq_share": round((irq1 - irq0) / max(1e-9, total1 - total0), 3),
        # Machine-wide, so other users' tests count too; a listen overflow means a dropped SYN.
        "tcp": {k: tcp1.get(k, 0) - tcp0.get(k, 0) for k in tcp1 if tcp1[k] != tcp0.get(k)},
        "other_cpu_share": round(
            max(0.0, (busy1 - busy0) - (irq1 - irq0) - sum(cpu.values()) - r.client_cpu_s)
            / max(1e-9, total1 - total0),
            3,
        ),
    }
    # Hits that quietly went to the app would still be 200s: memcached's own counters show them
    # (the app's fill is an `add`, counted in cmd_set).
    if p.system in ("fastpoll", "direct") and p.scenario.startswith("hit"):
        row["fallbacks_seen"] = mc["cmd_set"]
    # The poll servers' batching: keys per memcached round trip (it grows with load).
    if keys_per_trip is not None:
        row["keys_per_round_trip"] = keys_per_trip
    return row


# ---- memory with many connections ---------------------------------------------------------------


def measure_rss(ctx: Ctx, count: int) -> dict[str, object]:
    t = ctx.target
    pid, port = t.poller_pids[0], t.poller_ports[0]
    before = sysinfo.status_kb(pid, "VmRSS")
    req = (
        f"GET /getMessages?{ctx.signer.query(str(HOT_USER))} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    ).encode()
    t0 = time.monotonic()
    with conns.ConnectionCrowd(port, req, count) as crowd:
        time.sleep(0.5)
        during = sysinfo.status_kb(pid, "VmRSS")
        alive = crowd.still_open()
        answered, failed = crowd.answered, crowd.failed
    return {
        "connections": count,
        "answered": answered,
        "failed": failed,
        "still_open": alive,
        "rss_kb_before": before,
        "rss_kb_with_connections": during,
        "bytes_per_connection": round((during - before) * 1024 / max(1, answered)),
        "seconds": round(time.monotonic() - t0, 1),
    }


def fmt_row(r: Row) -> str:
    def ms(v: float | None) -> str:
        return "-" if v is None else (f"{v:.2f}ms" if float(v) < 100 else f"{v:.0f}ms")

    s = (
        f"{float(r['rps']):>10,.0f} req/s  p50 {ms(r['p50_ms']):>8}  p99 {ms(r['p99_ms']):>8}"
        f"  failed {r['failed']}"
    )
    if r.get("keys_per_round_trip") is not None:
        s += f"  keys/round trip {float(r['keys_per_round_trip']):.1f}"
    c = r.get("check") or {}
    if "bad_status" in c:
        bad = sum(c[k] for k in ("bad_status", "bad_body", "bad_source"))
        s += f"  answers checked: {c['n_hit'] + c['n_miss']:,}, wrong {bad}"
    if r.get("fallbacks_seen"):
        s += f"  fallbacks(app adds) {r['fallbacks_seen']}"
    tcp = r.get("tcp") or {}
    if tcp.get("ListenOverflows") or tcp.get("TCPSynRetrans"):
        s += (
            f"  [tcp: {tcp.get('ListenOverflows', 0)} listen overflows, "
            f"{tcp.get('TCPSynRetrans', 0)} SYN retransmits]"
        )
    if float(r.get("other_cpu_share") or 0) >= 0.05:
        s += f"  [other load on the machine: {float(r['other_cpu_share']):.0%} of its CPU]"
    return s


def sanity(ctx: Ctx, users: int, quick: bool, after: bool = False) -> list[str]:
    """Right bytes from every path before (and after) the load; returns problems."""
    import random

    rnd = random.Random(11 if after else 5)
    sample = sorted({HOT_USER, users, *rnd.sample(range(1, users + 1), min(users, 50))})
    t = ctx.target
    q = ctx.signer.query
    problems = [
        f"fastpoll {m}" for m in stackctl.check_hits(t.base_url, "/Poll/getMessages", sample, q)
    ]
    problems += [
        f"fastpoll POST {m}"
        for m in stackctl.check_hits(t.base_url, "/Poll/getMessages", sample[:10], q, post=True)
    ]
    problems += [
        f"direct {m}"
        for m in stackctl.check_hits(
            f"http://127.0.0.1:{t.poller_ports[0]}", "/getMessages", sample[:10], q
        )
    ]
    if "memcached_pass" in ctx.peers:
        problems += [
            f"memcached_pass {m}"
            for m in stackctl.check_hits(
                ctx.peers["memcached_pass"].base_url,
                "/Poll/getMessages",
                sample[:10],
                q,
                source=None,
            )
        ]
    if "return200" in ctx.peers:
        problems += [
            f"return200 {m}"
            for m in stackctl.check_hits(
                ctx.peers["return200"].base_url, "/Poll/getMessages", [HOT_USER], q, source=None
            )
        ]
    if ctx.signer.enabled:  # an unsigned poll is refused before the cache and the app
        a = stackctl.get(f"{t.base_url}/Poll/getMessages?user_id={HOT_USER}")
        if a.status != 403:
            problems.append(f"unsigned poll: {a.status}, expected 403")
    # A miss goes to the app (empty body: nothing new for a user with no messages).
    a = stackctl.get(f"{t.base_url}/Poll/getMessages?{q(ctx.next_miss_prefix() + '00000001')}")
    if (a.status, a.body, a.source) != (200, b"", "app"):
        problems.append(f"miss: {a.status} {a.source} {a.body[:80]!r}")
    a = stackctl.get(
        f"{ctx.peers['app'].base_url}/Poll/getMessages?user_id=0{preload.APP_USER_BASE + 1}"
    )
    seeded = ctx.app_users > 0
    if (a.status, a.source) != (200, "app") or a.body.startswith(b'{"unread":') != seeded:
        problems.append(f"app alone: {a.status} {a.source} {a.body[:80]!r}")
    if not problems:
        print(
            f"  answers {'after' if after else 'before'} the load: right "
            f"({len(sample)} users, POST, direct, peers, a miss, the app)"
        )
    return problems


def collect_logs(run_dir: Path) -> dict[str, dict[str, int]]:
    """What the poll servers and the stack's nginx logged during the run (warnings and errors),
    each message once with its count: the evidence behind a fallback or a failure."""
    import re

    out: dict[str, dict[str, int]] = {}
    files = {
        **{f.stem: f for f in sorted(run_dir.glob("poller-*.log"))},
        "nginx": run_dir / "nginx" / "error.log",
    }
    for name, path in files.items():
        counts: dict[str, int] = {}
        try:
            lines = path.read_text(errors="replace").splitlines()
        except OSError:
            continue
        for line in lines:
            if "[signing]" in line or " info:" in line or "[notice]" in line:
                continue
            msg = re.sub(r"^\S+ \[\d+\] |^\S+ \S+ |\d+#\d+: \*\d+ |, client: .*$", "", line)
            counts[msg[:200]] = counts.get(msg[:200], 0) + 1
        if counts:
            out[name] = dict(sorted(counts.items(), key=lambda kv: -kv[1])[:20])
    return out


def wait_quiet(limit_s: float, busy_max: float = 0.15, window_s: float = 5.0) -> dict:
    """Wait (bounded) until the machine's busy share over a window is below busy_max."""
    t0 = time.monotonic()
    share = 1.0
    while True:
        b0, _, n0 = sysinfo.machine_cpu()
        time.sleep(window_s)
        b1, _, n1 = sysinfo.machine_cpu()
        share = (b1 - b0) / max(1e-9, n1 - n0)
        waited = time.monotonic() - t0
        if share <= busy_max or waited >= limit_s:
            break
        print(
            f"  machine busy {share:.0%} (other users); waiting for it to calm down "
            f"({waited:.0f}/{limit_s:.0f}s)",
            flush=True,
        )
    print(f"  machine busy {share:.0%} over the last {window_s:.0f}s; starting", flush=True)
    return {"busy_share": round(share, 3), "waited_s": round(time.monotonic() - t0, 1)}
