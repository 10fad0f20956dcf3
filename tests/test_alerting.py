"""Paging end to end (docs/operations.md, "Alerting"): the rules
that ship (monitoring/rules/fastpoll.rules.yml) on a real Prometheus, the alertmanager role's
configuration on a real Alertmanager, and a webhook receiver here, fed by a real local stack
(two poll servers behind nginx, three memcached nodes with replicas, the app) under poll load,
through mtail on nginx's access log, the poll servers' and the app's /metrics, and node_exporter
serving the memcached probe.

Time is compressed: every duration of the rules (windows, `for:`, group intervals) and of
Alertmanager's grouping is divided by SCALE, and Prometheus scrapes and evaluates every second;
the expressions are the shipped ones. Checked:

- one memcached node killed (its keys covered by their replicas): a ticket, and no page;
- a fleet-wide outage (the app and every poll server stopped: nginx answers 503): exactly one
  page, the availability SLO's, while the per-host alerts it causes are held back (inhibited).

Every process started here is stopped by its pid.
"""

from __future__ import annotations

import contextlib
import json
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from fastpoll_testkit.monitoring import (
    Running,
    binary,
    exposition_names,
    mtail_program,
    render_template,
    scrape_when_up,
)
from fastpoll_testkit.procs import free_port, wait_for
from fastpoll_testkit.stack import ROOT, Stack

RULES = ROOT / "monitoring" / "rules" / "fastpoll.rules.yml"
MEMCACHED_STATS = ROOT / "monitoring" / "textfile" / "memcached_stats.py"
ROLES = ROOT / "ansible" / "roles"
SCALE = 30  # 5m -> 10s, 1h -> 2m, a 2m `for` -> 4s
HOST = "fp-local"  # the one host of this fleet: its nginx, poll servers and app

_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def seconds(duration: str) -> float:
    """A Prometheus duration ("1h30m", "5m") in seconds."""
    parts = re.findall(r"(\d+)(ms|s|m|h|d|w)", duration)
    assert parts and "".join(n + u for n, u in parts) == duration, duration
    return sum(int(n) * _UNITS[u] for n, u in parts)


def scaled(duration: str, scale: int = SCALE) -> str:
    ms = round(seconds(duration) * 1000 / scale)
    return f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms}ms"


def compressed_rules(scale: int = SCALE) -> dict[str, Any]:
    """The shipped rules with every duration divided by `scale`: range selectors, `for:` and
    group intervals. Nothing else changes."""
    doc = yaml.safe_load(RULES.read_text())
    for group in doc["groups"]:
        if "interval" in group:
            group["interval"] = scaled(group["interval"], scale)
        for rule in group["rules"]:
            rule["expr"] = re.sub(
                r"\[(\w+)\]", lambda m: f"[{scaled(m.group(1), scale)}]", rule["expr"]
            )
            if "for" in rule:
                rule["for"] = scaled(rule["for"], scale)
    return doc


def test_compression_changes_durations_only() -> None:
    shipped = yaml.safe_load(RULES.read_text())
    fast = compressed_rules()
    assert scaled("5m") == "10s" and scaled("3d") == "8640s" and scaled("1m") == "2s"
    for g, h in zip(shipped["groups"], fast["groups"], strict=True):
        for r, s in zip(g["rules"], h["rules"], strict=True):
            assert re.sub(r"\[\w+\]", "[]", r["expr"]) == re.sub(r"\[\w+\]", "[]", s["expr"])
            assert {k: v for k, v in r.items() if k not in ("expr", "for")} == {
                k: v for k, v in s.items() if k not in ("expr", "for")
            }


# ---- the webhook receiver ------------------------------------------------------------------


class Receiver:
    """Alertmanager's webhook notifications, by path (/page, /ticket, /watchdog)."""

    def __init__(self) -> None:
        self.got: list[tuple[str, dict[str, Any]]] = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                with receiver.lock:
                    receiver.got.append((self.path, json.loads(body)))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}/{path}"

    def notifications(self, path: str) -> list[dict[str, Any]]:
        with self.lock:
            return [n for p, n in self.got if p == f"/{path}"]

    def alertnames(self, path: str) -> list[set[str]]:
        return [{a["labels"]["alertname"] for a in n["alerts"]} for n in self.notifications(path)]

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


# ---- background work: poll load, the memcached probe ----------------------------------------


class Loop:
    """`step` called again and again on a thread until stop()."""

    def __init__(self, step: Any, pause: float) -> None:
        self.done = threading.Event()
        self.errors: list[BaseException] = []

        def run() -> None:
            while not self.done.is_set():
                try:
                    step()
                except Exception as e:  # noqa: BLE001 (kept, reported by the test)
                    self.errors.append(e)
                self.done.wait(pause)

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.done.set()
        self.thread.join(30)


def poll_load(stack: Stack) -> Loop:
    """Plain polls of 200 users through nginx, about 50 a second, whatever they get."""
    urls = [stack.poll_url(8_000_000 + i) for i in range(200)]
    client = httpx.Client(base_url=stack.base_url, timeout=5)
    n = iter(range(10**9))

    def step() -> None:
        # nginx itself is never stopped here; a slow or failed answer is the SLI's business.
        with contextlib.suppress(httpx.HTTPError):
            client.get(urls[next(n) % len(urls)])

    return Loop(step, 0.02)


def memcached_probe(stack: Stack, textdir: Path) -> Loop:
    """What fastpoll-memcached-stats.timer does on the fleet, every second."""
    servers = [a for p in stack.memcached_ports for a in ("--server", f"127.0.0.1:{p}")]
    argv = [sys.executable, str(MEMCACHED_STATS), *servers, "--timeout", "0.5"]
    out = ["--out", str(textdir / "fastpoll_memcached.prom")]
    return Loop(lambda: subprocess.run(argv + out, capture_output=True, timeout=10), 1.0)


# ---- the monitoring hosts ------------------------------------------------------------------


class Monitoring:
    def __init__(self, prom: int, am: int, receiver: Receiver) -> None:
        self.prom = f"http://127.0.0.1:{prom}"
        self.am = f"http://127.0.0.1:{am}"
        self.receiver = receiver

    def query(self, expr: str) -> list[dict[str, Any]]:
        r = httpx.get(f"{self.prom}/api/v1/query", params={"query": expr}, timeout=5)
        r.raise_for_status()
        result: list[dict[str, Any]] = r.json()["data"]["result"]
        return result

    def am_alerts(self) -> list[dict[str, Any]]:
        r = httpx.get(f"{self.am}/api/v2/alerts", timeout=5)
        r.raise_for_status()
        alerts: list[dict[str, Any]] = r.json()
        return alerts


def write_targets(sd: Path, stack: Stack, mtail: int, node: int) -> None:
    """file_sd targets as role exporters writes them (one file per host and job)."""
    targets = {
        "fastpoll_poller": [
            {"targets": [f"127.0.0.1:{p}"], "labels": {"host": HOST, "poller": str(i)}}
            for i, p in enumerate(stack.admin_ports)
        ],
        "fastpoll_app": [{"targets": [f"127.0.0.1:{stack.app_port}"], "labels": {"host": HOST}}],
        "mtail": [{"targets": [f"127.0.0.1:{mtail}"], "labels": {"host": HOST}}],
        "node": [{"targets": [f"127.0.0.1:{node}"], "labels": {"host": HOST}}],
    }
    for job, entries in targets.items():
        (sd / job).mkdir(parents=True, exist_ok=True)
        (sd / job / f"{HOST}.yml").write_text(yaml.safe_dump(entries))


def role_defaults(role: str) -> dict[str, Any]:
    defaults: dict[str, Any] = yaml.safe_load((ROLES / role / "defaults" / "main.yml").read_text())
    return defaults


def role_template(role: str, name: str, **variables: object) -> str:
    """A template of an Ansible role rendered with the role's defaults and `variables`."""
    return render_template(ROLES / role / "templates", name, **{**role_defaults(role), **variables})


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Stack, Monitoring]]:
    tmp = tmp_path_factory.mktemp("alerting")
    stack = Stack(
        run_dir=tmp / "stack", backend="memcached", n_pollers=2, n_memcached=3, access_log=True
    )
    stack.start()
    started: list[Running] = []
    loops: list[Loop] = []
    receiver = Receiver()
    try:
        loops.append(poll_load(stack))
        textdir = tmp / "textfile"
        textdir.mkdir()
        loops.append(memcached_probe(stack, textdir))

        mtail_port, node_port, prom_port, am_port = (free_port() for _ in range(4))
        progs = tmp / "mtail-progs"
        mtail_program(progs)
        log = stack.run_dir / "nginx" / "access.log"
        mtail = Running(
            [binary("mtail"), "--progs", str(progs), "--logs", str(log), "--address",
             "127.0.0.1", "--port", str(mtail_port), "--logtostderr"],
            tmp / "mtail.log",
        )  # fmt: skip
        started.append(mtail)
        node = Running(
            [binary("node"), f"--web.listen-address=127.0.0.1:{node_port}",
             "--collector.disable-defaults", "--collector.textfile",
             f"--collector.textfile.directory={textdir}"],
            tmp / "node.log",
        )  # fmt: skip
        started.append(node)

        # Alertmanager: the role's template, with its grouping compressed like the rules.
        am_cfg = tmp / "alertmanager.yml"
        am_cfg.write_text(
            role_template(
                "alertmanager",
                "alertmanager.yml.j2",
                alertmanager_page_webhook_url=receiver.url("page"),
                alertmanager_ticket_webhook_url=receiver.url("ticket"),
                alertmanager_watchdog_webhook_url=receiver.url("watchdog"),
                alertmanager_group_wait="1s",
                alertmanager_group_interval=scaled(
                    role_defaults("alertmanager")["alertmanager_group_interval"]
                ),
                alertmanager_watchdog_interval="1h",
            )
        )
        check = subprocess.run(
            [binary("amtool"), "check-config", str(am_cfg)], capture_output=True, text=True
        )
        assert check.returncode == 0, check.stdout + check.stderr
        am = Running(
            [binary("alertmanager"), f"--config.file={am_cfg}", f"--storage.path={tmp / 'am'}",
             f"--web.listen-address=127.0.0.1:{am_port}", "--cluster.listen-address="],
            tmp / "alertmanager.log",
        )  # fmt: skip
        started.append(am)

        # Prometheus: the role's prometheus.yml, the compressed rules.
        rules_dir = tmp / "rules"
        rules_dir.mkdir()
        (rules_dir / "fastpoll.rules.yml").write_text(yaml.safe_dump(compressed_rules()))
        sd = tmp / "file_sd"
        write_targets(sd, stack, mtail_port, node_port)
        prom_cfg = tmp / "prometheus.yml"
        prom_cfg.write_text(
            role_template(
                "monitoring",
                "prometheus.yml.j2",
                monitoring_scrape_interval="1s",
                monitoring_scrape_timeout="1s",
                monitoring_evaluation_interval="1s",
                monitoring_alertmanagers=[f"127.0.0.1:{am_port}"],
                monitoring_file_sd_dir=str(sd),
                fastpoll_address="127.0.0.1",
                fastpoll_prometheus_port=prom_port,
                inventory_hostname="fp-mon",
            ).replace("/etc/prometheus/rules/", f"{rules_dir}/")
        )
        prom = Running(
            [binary("prometheus"), f"--config.file={prom_cfg}",
             f"--storage.tsdb.path={tmp / 'prom'}", f"--web.listen-address=127.0.0.1:{prom_port}"],
            tmp / "prometheus.log",
        )  # fmt: skip
        started.append(prom)
        for url, proc, what in (
            (f"http://127.0.0.1:{mtail_port}/metrics", mtail, "mtail"),
            (f"http://127.0.0.1:{node_port}/metrics", node, "node_exporter"),
            (f"http://127.0.0.1:{am_port}/-/ready", am, "alertmanager"),
            (f"http://127.0.0.1:{prom_port}/-/ready", prom, "prometheus"),
        ):
            scrape_when_up(url, proc, what)
        mon = Monitoring(prom_port, am_port, receiver)
        # Every target scraped, and the edge SLI flowing (the access log is flushed every 5 s).
        jobs = {"prometheus", "alertmanager", "fastpoll_poller", "fastpoll_app", "mtail", "node"}
        wait_for(
            "every target up",
            lambda: (
                {s["metric"]["job"] for s in mon.query("up == 1")} == jobs
                and len(mon.query("up == 1")) == len(jobs) + 1
            ),
            timeout=30,
            proc=prom.popen,
            logs=[prom.log],
        )
        wait_for(
            "the edge SLI",
            lambda: bool(mon.query('rate(fastpoll_edge_requests_total{route="poll"}[10s]) > 0')),
            timeout=30,
            logs=[mtail.log],
        )
        yield stack, mon
    finally:
        for loop in loops:
            loop.stop()
        for p in reversed(started):
            p.stop()
        receiver.stop()
        stack.stop()


def firing(notes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [n for n in notes if n["status"] == "firing"]


def test_replica_covered_node_loss_is_a_ticket_not_a_page(
    fleet: tuple[Stack, Monitoring],
) -> None:
    stack, mon = fleet
    rx = mon.receiver
    lost = f"127.0.0.1:{stack.memcached_ports[1]}"
    stack.stop_proc("memcached-1", signal.SIGKILL)
    t0 = time.monotonic()
    wait_for(
        "the covered-node ticket",
        lambda: any(
            a["labels"]["alertname"] == "CacheServerDownCovered" and a["labels"]["server"] == lost
            for n in firing(rx.notifications("ticket"))
            for a in n["alerts"]
        ),
        timeout=45,
    )
    # As long again as the ticket took (at least 8 s: `for` 2 s, group_wait 1 s, evaluations):
    # a page would have come by then.
    time.sleep(max(8.0, time.monotonic() - t0))
    assert rx.notifications("page") == [], rx.notifications("page")
    assert not mon.query('ALERTS{alertname="CacheServerUnreachable"}')
    # The node's own probe saw it too; the poll servers' view holds it back in Alertmanager.
    probe = [a for a in mon.am_alerts() if a["labels"]["alertname"] == "MemcachedDown"]
    assert probe and all(a["status"]["inhibitedBy"] for a in probe), probe

    # Back: read through the replicas for recovery_ms, then usable again, and nothing pages.
    stack.start_memcached(1)
    wait_for(
        "every cache server usable",
        lambda: (
            not mon.query("fastpoll:cache_server_unusable")
            and not mon.query("fastpoll_backend_up == 0")
        ),
        timeout=45,
    )
    assert rx.notifications("page") == []


def test_fleet_wide_outage_is_one_page(fleet: tuple[Stack, Monitoring]) -> None:
    stack, mon = fleet
    rx = mon.receiver
    assert rx.notifications("page") == []
    for name in (stack.app_name(0), "poller-0", "poller-1"):
        stack.stop_proc(name)
    wait_for("the page", lambda: bool(rx.notifications("page")), timeout=60)
    first = time.monotonic()
    (note,) = rx.notifications("page")
    assert note["status"] == "firing"
    (alert,) = note["alerts"]
    assert {k: alert["labels"][k] for k in ("alertname", "slo", "severity")} == {
        "alertname": "ErrorBudgetBurn",
        "slo": "poll-availability",
        "severity": "page",
    }
    assert "host" not in alert["labels"]  # the fleet's, not a host's
    # The causes reached Prometheus and Alertmanager, as tickets, held back while the page is
    # out: each instance down, the host without a poll server, the app.
    causes = {"PollerDown", "PollerHostDown", "AppDown"}

    def held() -> set[str]:
        return {
            a["labels"]["alertname"]
            for a in mon.am_alerts()
            if a["labels"]["alertname"] in causes and a["status"]["inhibitedBy"]
        }

    wait_for("the per-host alerts inhibited", lambda: held() == causes, timeout=30)
    # One group interval and more later: still that one page (new alerts joining a page group
    # would be notified after group_interval).
    time.sleep(max(0.0, seconds(scaled("5m")) + 5 - (time.monotonic() - first)))
    assert len(rx.notifications("page")) == 1, rx.notifications("page")
    assert rx.alertnames("page") == [{"ErrorBudgetBurn"}]


def test_own_metrics_the_rules_read_are_exported(fleet: tuple[Stack, Monitoring]) -> None:
    """The rules' prometheus_* and alertmanager_* names, against the real programs' /metrics."""
    _, mon = fleet
    names = exposition_names(httpx.get(f"{mon.prom}/metrics", timeout=5).text)
    names |= exposition_names(httpx.get(f"{mon.am}/metrics", timeout=5).text)
    used = {
        n
        for g in yaml.safe_load(RULES.read_text())["groups"]
        for r in g["rules"]
        for n in re.findall(r"\b((?:prometheus|alertmanager)_\w+)", r["expr"])
    }
    assert used and used <= names, used - names
