"""The stack under test, through the one harness: start a tuned one, or attach
to one that `make up` started. Also the checks that a poll is answered right, and memcached's
counters (they show fallbacks and coalescing that a req/s figure hides)."""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from fastpoll_testkit.procs import free_port
from fastpoll_testkit.stack import Stack, poller_servers  # the one stack harness
from fastpoll_testkit.stack import memcached_stats as node_stats
from loadtests import preload

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


@dataclass
class Target:
    """Where the parts of a running stack listen, and their pids."""

    stack: Stack
    started_here: bool
    http_port: int
    poller_ports: list[int]
    poller_pids: list[int]
    memcached_ports: list[int]
    memcached_pids: list[int]
    app_port: int
    app_pid: int
    nginx_pid: int
    nginx_vars: dict[str, object] = field(default_factory=dict)
    nginx_vars_via: str = ""
    poller_hop: str = "tcp"  # how nginx reaches the poll servers
    active_pollers: int = 0  # of them, those nginx sends to as the stack started (not `backup`)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"


def _target(stack: Stack, started_here: bool) -> Target:
    procs = stack.procs
    pollers = sorted(
        (p for n, p in procs.items() if n.startswith("poller-")),
        key=lambda p: int(p.name.split("-")[1]),
    )
    mcs = sorted(
        (p for n, p in procs.items() if n.startswith("memcached-")),
        key=lambda p: int(p.name.split("-")[1]),
    )
    if not pollers or not mcs or "nginx" not in procs or "app" not in procs:
        raise RuntimeError(
            "the stack must run nginx, the app, poll servers and memcached "
            f"(has: {', '.join(procs)}); the bench needs the memcached backend"
        )
    return Target(
        stack=stack,
        started_here=started_here,
        http_port=stack.http_port,
        poller_ports=[p.port for p in pollers],
        poller_pids=[p.pid for p in pollers],
        memcached_ports=[p.port for p in mcs],
        memcached_pids=[p.pid for p in mcs],
        app_port=procs["app"].port,
        app_pid=procs["app"].pid,
        nginx_pid=procs["nginx"].pid,
        active_pollers=active_pollers(stack.run_dir / "nginx" / "fastpoll.conf"),
    )


def active_pollers(site: Path) -> int:
    """The servers of nginx's poller upstream that are not `backup`, in a rendered site file."""
    return sum(1 for s in poller_servers(site.read_text()) if not s.endswith(" backup"))


def attach(run_dir: Path) -> Target:
    stack = Stack.load(run_dir)
    if stack.backend != "memcached":
        raise RuntimeError(
            "the running stack uses Redis; the bench compares against "
            "memcached_pass and needs the memcached backend"
        )
    return _target(stack, started_here=False)


def start(
    run_dir: Path,
    nginx_vars: dict[str, object],
    ini: dict[str, dict[str, str]],
    n_pollers: int | None = None,
    cache_timeout_ms: int | None = None,
    poller_unix: bool = True,
    memcached_args: list[str] | None = None,
    memcached_conns: int | None = None,
    signing: bool = True,
) -> Target:
    """A fresh stack on free loopback ports with the bench's nginx tuning; nginx reaches the
    poll servers through unix sockets when the harness and the poll server support it."""
    stack = Stack(
        run_dir=run_dir,
        backend="memcached",
        http_port=free_port(),
        extra_ini=ini,
        signing=signing,
    )
    if cache_timeout_ms:
        stack.cache_timeout_ms = cache_timeout_ms
    if hasattr(stack, "poller_unix"):
        stack.poller_unix = poller_unix
    if n_pollers:
        stack.n_pollers = n_pollers
    if memcached_args:
        stack.memcached_args = memcached_args
    if memcached_conns:
        stack.memcached_conns = memcached_conns
    via = _apply_nginx_vars(stack, nginx_vars)
    stack.start()
    t = _target(stack, started_here=True)
    t.nginx_vars, t.nginx_vars_via = nginx_vars, via
    t.poller_hop = "unix" if getattr(stack, "poller_unix", False) else "tcp"
    return t


def _apply_nginx_vars(stack: Stack, nginx_vars: dict[str, object]) -> str:
    """Pass the tuning to both nginx templates (Stack.nginx_vars); listen options ride along
    with the address, since the template has one `listen` variable."""
    vars_ = dict(nginx_vars)
    listen_opts = str(vars_.pop("listen_options", ""))
    vars_["fastpoll_listen"] = f"127.0.0.1:{stack.http_port}{listen_opts}"
    stack.nginx_vars.update(vars_)
    return "Stack.nginx_vars (fastpoll_testkit.stack)"


# ---- answers and counters ---------------------------------------------------------------------


@dataclass
class Answer:
    status: int
    body: bytes
    source: str | None


def get(url: str, data: bytes | None = None) -> Answer:
    req = urllib.request.Request(
        url,
        data=data,
        method="POST" if data is not None else "GET",
        headers={"Content-Type": "application/json"} if data else {},
    )
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return Answer(r.status, r.read(), r.headers.get("X-Poll-Source"))
    except urllib.error.HTTPError as e:
        return Answer(e.code, e.read(), e.headers.get("X-Poll-Source"))


def check_hits(
    base_url: str,
    path: str,
    users: list[int],
    query: Callable[[str], str],
    source: str | None = "cache",
    post: bool = False,
) -> list[str]:
    """Every listed user gets exactly its preloaded bytes; returns the problems found.
    query(uid) gives the (signed) query string of a user."""
    problems = []
    for u in users:
        a = get(f"{base_url}{path}?{query(str(u))}", b'{"since":0}' if post else None)
        if a.status != 200 or a.body != preload.answer(u) or (source and a.source != source):
            problems.append(f"user {u}: {a.status} {a.source} {a.body[:80]!r}")
    return problems


def memcached_stats(ports: list[int]) -> dict[str, int]:
    """memcached's counters summed over the nodes."""
    total: dict[str, int] = {}
    for port in ports:
        for name, value in node_stats(port).items():
            total[name] = total.get(name, 0) + value
    return total


MC_COUNTERS = ("cmd_get", "get_hits", "get_misses", "cmd_set", "total_connections")


BATCH_METRICS = ("fastpoll_backend_round_trips_total", "fastpoll_backend_keys_sent_total")


def cache_batches(admin_ports: list[int]) -> dict[str, float]:
    """The poll servers' cache round trips (batches of gets) and the keys sent in them, summed
    over their cache servers and over the poll servers (/metrics); a poll server that does not
    answer, or a build without these counters, adds nothing."""
    total = dict.fromkeys(BATCH_METRICS, 0.0)
    for port in admin_ports:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                text = r.read().decode()
        except (OSError, urllib.error.URLError):
            continue
        for line in text.splitlines():
            name = line.split("{", 1)[0]
            if name in total:
                total[name] += float(line.split()[-1])
    return total


def keys_per_round_trip(before: dict[str, float], after: dict[str, float]) -> float | None:
    """Keys per cache round trip between two cache_batches() readings (None: no round trip)."""
    trips = after[BATCH_METRICS[0]] - before[BATCH_METRICS[0]]
    keys = after[BATCH_METRICS[1]] - before[BATCH_METRICS[1]]
    return round(keys / trips, 2) if trips > 0 else None


def mc_delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    d = {k: after.get(k, 0) - before.get(k, 0) for k in MC_COUNTERS}
    d["curr_connections"] = after.get("curr_connections", 0)
    return d
