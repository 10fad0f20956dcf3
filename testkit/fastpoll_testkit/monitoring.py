"""Helpers for the monitoring and alerting tests (tests/test_monitoring.py, tests/test_alerting.py):
Debian's monitoring programs found on PATH, started and stopped by pid, scraped, and the
templates of the monitoring side rendered the way Ansible renders them."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import httpx
import jinja2
import pytest

from fastpoll_testkit.procs import terminate, wait_for
from fastpoll_testkit.stack import ROOT

# Read by the rules, exported by what tests/test_monitoring.py cannot run: node_exporter's
# systemd collector (on in Debian's package; it needs systemd as PID 1), the backup job's and
# the restore drill's textfiles (written by the jobs on the backup host), Patroni's and etcd's
# own /metrics, and PostgreSQL's archiver statistics (the exporter there has no database). The
# fleet test's monitoring scenario asks its Prometheus for each, exported by the real engines.
KNOWN_ELSEWHERE: frozenset[str] = frozenset(
    {
        "node_systemd_unit_state",
        "fastpoll_backup_last_success_timestamp_seconds",
        "fastpoll_restore_drill_success",
        "fastpoll_restore_drill_last_success_timestamp_seconds",
        "patroni_primary",
        "patroni_failsafe_mode_is_active",
        "patroni_pending_restart",
        "etcd_server_has_leader",
        "etcd_server_leader_changes_seen_total",
        "etcd_mvcc_db_total_size_in_bytes",
        "etcd_server_quota_backend_bytes",
        "pg_stat_archiver_failed_count",
    }
)


BINARIES = {
    "promtool": "promtool",
    "prometheus": "prometheus",
    "alertmanager": "prometheus-alertmanager",
    "amtool": "amtool",
    "mtail": "mtail",
    "node": "prometheus-node-exporter",
    "nginx": "prometheus-nginx-exporter",
    "redis": "prometheus-redis-exporter",
    "postgres": "prometheus-postgres-exporter",
}


def binary(name: str) -> str:
    path = shutil.which(BINARIES[name])
    if path is None:
        pytest.fail(f"{BINARIES[name]} is not installed: make deps-monitoring installs it")
    return path


class Running:
    """A program started here, stopped by its pid."""

    def __init__(self, argv: list[str], log: Path, env: dict[str, str] | None = None) -> None:
        self.log = log
        self.popen = subprocess.Popen(
            argv,
            stdout=log.open("wb"),
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
            start_new_session=True,
        )

    def stop(self) -> None:
        terminate(self.popen)


def scrape_when_up(url: str, proc: Running, what: str) -> str:
    """The first successful GET of url (the program is starting)."""
    body: list[str] = []

    def ok() -> bool:
        try:
            r = httpx.get(url, timeout=3)
        except httpx.HTTPError:
            return False
        if r.status_code == 200:
            body.append(r.text)
        return bool(body)

    wait_for(what, ok, proc=proc.popen, logs=[proc.log])
    return body[0]


def exposition_names(text: str) -> set[str]:
    """Series names in a scrape, and those its # TYPE lines declare (a labelled counter that
    has not counted yet has no series, but the exporter does export it)."""
    names = {m.group(1) for m in re.finditer(r"^([A-Za-z_:][\w:]*)(?:\{|\s)", text, re.MULTILINE)}
    for name, kind in re.findall(r"^# TYPE (\S+) (\w+)", text, re.MULTILINE):
        if kind == "counter":
            names.add(name if name.endswith("_total") else name + "_total")
        elif kind in ("histogram", "summary"):
            names |= {name + "_bucket", name + "_sum", name + "_count"}
        else:
            names.add(name)
    return names


def sample(text: str, name: str, **labels: str) -> float | None:
    """The value of the one series of `name` whose labels include `labels`."""
    for line in text.splitlines():
        m = re.match(r"^([A-Za-z_:][\w:]*)(\{(.*)\})?\s+(\S+)", line)
        if not m or m.group(1) != name:
            continue
        have = dict(re.findall(r'(\w+)="((?:\\.|[^"\\])*)"', m.group(3) or ""))
        if all(have.get(k) == v for k, v in labels.items()):
            return float(m.group(4))
    return None


def render_template(directory: Path, name: str, **variables: object) -> str:
    """A template of a role (or of monitoring/), as Ansible renders it (the filters it uses)."""
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(directory),
        trim_blocks=True,
        undefined=jinja2.StrictUndefined,
    )
    env.filters["to_json"] = json.dumps
    return env.get_template(name).render(ansible_managed="test", **variables)


MTAIL_TEMPLATE = ROOT / "monitoring" / "mtail" / "fastpoll_nginx.mtail.j2"


def mtail_program(directory: Path, prefix: str | None = None) -> Path:
    """The edge SLI program rendered for the poll prefix (unset: the template's default), alone in
    `directory` (mtail runs every program of its --progs directory)."""
    directory.mkdir(parents=True, exist_ok=True)
    variables = {} if prefix is None else {"fastpoll_poll_prefix": prefix}
    prog = directory / "fastpoll_nginx.mtail"
    prog.write_text(render_template(MTAIL_TEMPLATE.parent, MTAIL_TEMPLATE.name, **variables))
    return prog
