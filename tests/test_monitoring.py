"""Monitoring (docs/operations.md, "Monitoring"): the files the monitoring role deploys,
checked against the real programs.

One local stack (testkit/fastpoll_testkit/stack.py, nginx writing its `fastpoll` access log) gets
a known mix of polls; then the metric names every rule, dashboard panel and console query uses
must be among those really exported by: the poll servers and the app (scraped), mtail running
monitoring/mtail/fastpoll_nginx.mtail over that access log (and counting exactly that mix),
node_exporter serving what monitoring/textfile/memcached_stats.py wrote about the stack's
memcached, and Debian's nginx, Redis and PostgreSQL exporters pointed at the stack, and its Redis
exporter run as role exporters runs it against a Redis Sentinel (configured as role redis_sentinel
configures it) watching the stack's Redis. The dashboard's
and console's expressions are also parsed by promtool, the rendered prometheus.yml is checked with
`promtool check config`, and the console renders on a real Prometheus. Every process started here
is stopped by its pid.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jinja2
import pytest
import yaml

from fastpoll_testkit.monitoring import (
    KNOWN_ELSEWHERE,
    Running,
    binary,
    exposition_names,
    mtail_program,
    render_template,
    sample,
    scrape_when_up,
)
from fastpoll_testkit.procs import free_port, wait_for
from fastpoll_testkit.stack import ROOT, Stack
from fastpoll_testkit.standalone import Procs

MON = ROOT / "monitoring"
RULES = MON / "rules" / "fastpoll.rules.yml"
RULE_TESTS = MON / "rules" / "fastpoll.rules.test.yml"
DASHBOARD = MON / "dashboards" / "fastpoll.json"
CONSOLE = MON / "consoles" / "fastpoll.html"
MEMCACHED_STATS = MON / "textfile" / "memcached_stats.py"
TLS_CERT_EXPIRY = MON / "textfile" / "tls_cert_expiry.py"
ROLE = ROOT / "ansible" / "roles" / "monitoring"
RUNBOOK = ROOT / "docs" / "runbook.md"
CONSOLE_LIBS = Path("/usr/share/doc/prometheus/examples/console_libraries")

# ---- PromQL: the metric names an expression reads -------------------------------------------

_KEYWORDS = {
    "and",
    "or",
    "unless",
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "offset",
    "inf",
    "nan",
    "atan2",
}
_LABEL_LISTS = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")


def metric_names(expr: str) -> set[str]:
    """Metric names in a PromQL expression (Grafana's $variables allowed): the identifiers
    that are neither functions, keywords, label names nor parts of a matcher or a range."""
    s = re.sub(r'"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])*\'|`[^`]*`', '""', expr)
    s = re.sub(r"\{[^}]*\}", " ", s)  # label matchers
    s = re.sub(r"\[[^\]]*\]", " ", s)  # ranges and subqueries
    s = _LABEL_LISTS.sub(" ", s)
    s = re.sub(r"\$\w+", " ", s)
    names = set()
    for m in re.finditer(r"(?<![\w.:])([A-Za-z_:][\w:]*)(\s*\()?", s):
        word, call = m.group(1), m.group(2)
        if call or word.lower() in _KEYWORDS:
            continue
        if re.fullmatch(r"\d+[smhdwy]", word):
            continue
        names.add(word)
    return names


def mtail_one_shot(
    log: Path, tmp: Path, prefix: str | None = None
) -> subprocess.CompletedProcess[str]:
    """The edge SLI program (rendered for `prefix`) run once over `log`, its metrics printed in
    Prometheus's format."""
    progs = tmp / "mtail-progs"
    mtail_program(progs, prefix)
    return subprocess.run(
        [
            binary("mtail"),
            "--progs",
            str(progs),
            "--logs",
            str(log),
            "--one_shot",
            "--address",
            "127.0.0.1",
            "--port",
            str(free_port()),
            "--one_shot_format",
            "prometheus",
            "--logtostderr",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_metric_names_parser() -> None:
    got = metric_names(
        'sum by (host, le) (rate(fastpoll_x_bucket{route="poll",host=~"$host"}[$__rate_interval]))'
        " / on (host) group_left count(up == 0) or vector(14.4 * 0.001) and a:b:c offset 5m"
    )
    assert got == {"fastpoll_x_bucket", "up", "a:b:c"}


# ---- processes -----------------------------------------------------------------------------


def app_declared() -> set[str]:
    """Every metric the app's code declares (fastpoll_app.metrics): under several workers the app
    exports a family only once it has counted something, and a repair round may not happen here."""
    from prometheus_client.metrics import MetricWrapperBase

    from fastpoll_app import metrics

    names = set()
    for obj in vars(metrics).values():
        if isinstance(obj, MetricWrapperBase):
            for fam in obj.describe():
                names |= exposition_names(f"# TYPE {fam.name} {fam.type}\n")
    return names


# ---- Redis Sentinel as roles redis_sentinel and exporters deploy it ---------------------------

EXPORTERS_ROLE = ROOT / "ansible" / "roles" / "exporters"
SENTINEL_ROLE = ROOT / "ansible" / "roles" / "redis_sentinel"
SENTINEL_PWFILE = "/etc/prometheus/fastpoll-sentinel-exporter.json"
SENTINEL_MASTER = "fastpoll"


def ansible_env() -> jinja2.Environment:
    """Jinja with the few Ansible filters the Sentinel templates use."""
    env = jinja2.Environment(trim_blocks=True, undefined=jinja2.StrictUndefined)
    env.filters["to_json"] = json.dumps
    env.filters["hash"] = lambda s, alg: hashlib.new(alg, str(s).encode()).hexdigest()
    env.filters["regex_replace"] = lambda s, pat, rep: re.sub(pat, rep, str(s))
    return env


def role_sentinel(procs: Procs, master_port: int, password: str) -> int:
    """A sentinel whose config is role redis_sentinel's sentinel.conf.j2 as Ansible renders it
    (its client password, the password between sentinels, the master's auth-pass, the quorum of
    three sentinels), on loopback; only its address, files and down-after (1 s) are the test's."""
    defaults = yaml.safe_load((SENTINEL_ROLE / "defaults" / "main.yml").read_text())
    text = (
        ansible_env()
        .from_string((SENTINEL_ROLE / "templates" / "sentinel.conf.j2").read_text())
        .render(
            **{
                **{k: v for k, v in defaults.items() if not isinstance(v, str) or "{{" not in v},
                "ansible_managed": "test",
                "redis_sentinel_listen": "127.0.0.1",
                "redis_sentinel_quorum": 2,
                "redis_sentinel_down_after_ms": 1000,
                "fastpoll_redis_sentinel_port": 0,
                "fastpoll_redis_master_name": SENTINEL_MASTER,
                "fastpoll_redis_password": password,
                "fastpoll_redis_previous_passwords": [],
                "fastpoll_redis_username": "",
            }
        )
    )
    lines = [line for line in text.splitlines() if line and not line.startswith("#")]
    (monitor,) = [line for line in lines if line.startswith("sentinel monitor ")]
    assert monitor.endswith(" MASTER_IP MASTER_PORT 2"), monitor
    own = ("bind ", "port ", "pidfile ", "logfile ", "dir ", "daemonize ", "sentinel monitor ")
    rest = [line for line in lines if not line.startswith(own)]
    assert any(line.startswith("user default on #") for line in rest), rest
    return procs.sentinel(master_port, SENTINEL_MASTER, *rest, quorum=2)


def sentinel_exporter(tmp: Path, sentinel_port: int, password: str) -> tuple[Running, str]:
    """Debian's redis_exporter started with the ExecStart of role exporters'
    fastpoll-sentinel-exporter.service and its password file, both rendered from the role's
    templates with its default exporters_sentinel_url (for a host whose address is 127.0.0.1,
    its sentinel on sentinel_port); only the password file's path is the test's. Returns the
    exporter and its metrics URL."""
    defaults = yaml.safe_load((EXPORTERS_ROLE / "defaults" / "main.yml").read_text())
    port = free_port()
    host: dict[str, object] = {
        "fastpoll_address": "127.0.0.1",
        "fastpoll_redis_sentinel_port": sentinel_port,
        "fastpoll_exporter_ports": {"sentinel": port},
        "fastpoll_redis_password": password,
    }
    env = ansible_env()
    url = env.from_string(defaults["exporters_sentinel_url"]).render(**host)
    assert url == f"redis://127.0.0.1:{sentinel_port}", url
    variables = {**host, "exporters_sentinel_url": url, "ansible_managed": "test"}
    templates = EXPORTERS_ROLE / "templates"
    pwfile = tmp / f"sentinel-exporter-{port}.json"
    pwfile.write_text(
        env.from_string((templates / "sentinel-exporter.json.j2").read_text()).render(**variables)
    )
    pwfile.chmod(0o600)
    unit = env.from_string(
        (templates / "fastpoll-sentinel-exporter.service.j2").read_text()
    ).render(**variables)
    (exec_start,) = [
        line.removeprefix("ExecStart=")
        for line in unit.splitlines()
        if line.startswith("ExecStart=")
    ]
    argv = shlex.split(exec_start)
    assert argv[0] == "/usr/bin/prometheus-redis-exporter", argv
    assert SENTINEL_PWFILE in argv[1:] or any(a.endswith("=" + SENTINEL_PWFILE) for a in argv)
    assert password not in exec_start
    args = [a.replace(SENTINEL_PWFILE, str(pwfile)) for a in argv[1:]]
    exporter = Running([binary("redis"), *args], tmp / f"sentinel-exporter-{port}.log")
    return exporter, f"http://127.0.0.1:{port}/metrics"


# ---- the stack, its traffic, and everything scraped from it ------------------------------------


def assert_valid_exposition(text: str) -> None:
    """promtool accepts `text` as a scrape (what node_exporter's textfile collector serves)."""
    check = subprocess.run(
        [binary("promtool"), "check", "metrics"],
        input=text,
        capture_output=True,
        text=True,
        check=False,
    )
    assert check.returncode == 0, check.stdout + check.stderr


def textfile_probe(script: Path, args: list[str], out: Path) -> None:
    """One run of a textfile collector script of monitoring/textfile/, writing `out`."""
    subprocess.run(
        [sys.executable, str(script), *args, "--out", str(out)],
        check=True,
        capture_output=True,
        timeout=30,
    )


class Exported:
    def __init__(self) -> None:
        self.names: set[str] = set()
        self.mtail = ""
        self.memcached = ""
        self.node = ""
        self.redis = ""
        self.tls = ""
        self.cert = ""


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Exported]:
    tmp = tmp_path_factory.mktemp("monitoring")
    stack = Stack(run_dir=tmp / "stack", backend="memcached", n_pollers=1, access_log=True)
    stack.start()
    started: list[Running] = []
    procs = Procs(tmp)
    out = Exported()
    try:
        base = stack.base_url
        with httpx.Client(base_url=base, timeout=10) as c:
            uid = 7_000_000 + os.getpid() % 100_000
            # A miss (the app answers and fills), then two hits; a forged signature (403).
            assert c.get(stack.poll_url(uid)).headers.get("x-poll-source") == "app"
            for _ in range(2):
                assert c.get(stack.poll_url(uid)).headers.get("x-poll-source") == "cache"
            assert c.get(f"/Poll/getMessages?user_id={uid}&exp=1&sig=00").status_code == 403
            assert c.get("/healthz").status_code == 200
            # The app scraped before it is stopped for the edge's own 503.
            app_metrics = httpx.get(stack.app_url() + "/metrics", timeout=5).text
            stack.stop_proc(stack.app_name(0))
            r = c.get(stack.poll_url(uid + 1))
            assert r.status_code == 503 and "x-poll-source" not in r.headers
        admin = httpx.get(f"http://127.0.0.1:{stack.admin_ports[0]}/metrics", timeout=5).text
        out.names |= exposition_names(admin) | exposition_names(app_metrics) | app_declared()

        # nginx's buffered access log is written out on reopen (SIGUSR1).
        log = stack.run_dir / "nginx" / "access.log"
        os.kill(stack.procs["nginx"].pid, signal.SIGUSR1)
        wait_for("the access log", lambda: log.exists() and log.read_text().count("\n") >= 5)
        run = mtail_one_shot(log, tmp)
        assert run.returncode == 0, run.stderr[-2000:]
        out.mtail = run.stdout
        out.names |= exposition_names(run.stdout)

        # memcached's stats through node_exporter's textfile collector.
        textdir = tmp / "textfile"
        textdir.mkdir()
        mc = f"127.0.0.1:{stack.memcached_ports[0]}"
        textfile_probe(
            MEMCACHED_STATS,
            ["--server", mc, "--server", "127.0.0.1:1"],
            textdir / "fastpoll_memcached.prom",
        )
        out.memcached = (textdir / "fastpoll_memcached.prom").read_text()
        # A TLS certificate valid for 10 days, through the textfile collector too.
        cert = tmp / "fullchain.pem"
        subprocess.run(
            [
                "openssl",
                "req",
                "-x509",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:P-256",
                "-nodes",
                "-keyout",
                str(tmp / "key.pem"),
                "-out",
                str(cert),
                "-days",
                "10",
                "-subj",
                "/CN=fastpoll.test",
            ],
            check=True,
            capture_output=True,
            timeout=30,
        )
        textfile_probe(
            TLS_CERT_EXPIRY,
            ["--cert", str(cert), "--cert", str(tmp / "missing.pem")],
            textdir / "fastpoll_tls.prom",
        )
        out.tls = (textdir / "fastpoll_tls.prom").read_text()
        out.cert = str(cert)
        port = free_port()
        # The collectors the host rules read (disks, clocks) besides the textfile; systemd's
        # needs a running systemd (KNOWN_ELSEWHERE).
        node = Running(
            [
                binary("node"),
                f"--web.listen-address=127.0.0.1:{port}",
                "--collector.disable-defaults",
                "--collector.textfile",
                "--collector.filesystem",
                "--collector.timex",
                f"--collector.textfile.directory={textdir}",
            ],
            tmp / "node.log",
        )
        started.append(node)
        out.node = scrape_when_up(f"http://127.0.0.1:{port}/metrics", node, "node_exporter")
        out.names |= exposition_names(out.node)

        port = free_port()
        ngx = Running(
            [
                binary("nginx"),
                f"-nginx.scrape-uri=http://127.0.0.1:{stack.nginx_status_port}/nginx_status",
                f"-web.listen-address=127.0.0.1:{port}",
            ],
            tmp / "nginx-exporter.log",
        )
        started.append(ngx)
        text = scrape_when_up(f"http://127.0.0.1:{port}/metrics", ngx, "nginx exporter")
        assert sample(text, "nginx_up") == 1, text
        out.names |= exposition_names(text)

        pw = (stack.run_dir / "redis.pass").read_text().strip()
        pwfile = tmp / "redis-passwords.json"
        redis_url = f"redis://127.0.0.1:{stack.redis_port}"
        pwfile.write_text(json.dumps({redis_url: pw}))
        pwfile.chmod(0o600)
        port = free_port()
        red = Running(
            [
                binary("redis"),
                f"-redis.addr={redis_url}",
                f"-redis.password-file={pwfile}",
                f"-web.listen-address=127.0.0.1:{port}",
            ],
            tmp / "redis-exporter.log",
        )
        started.append(red)
        out.redis = scrape_when_up(f"http://127.0.0.1:{port}/metrics", red, "redis exporter")
        out.names |= exposition_names(out.redis)

        # A sentinel watching the stack's Redis, and the Sentinel exporter on it (job sentinel).
        sentinel_port = role_sentinel(procs, stack.redis_port, pw)
        sen, sen_url = sentinel_exporter(tmp, sentinel_port, pw)
        started.append(sen)
        text = scrape_when_up(sen_url, sen, "sentinel exporter")
        assert sample(text, "redis_up") == 1, text
        out.names |= exposition_names(text)

        # No database here: the exporter still serves pg_up (0), the name the rules use.
        port = free_port()
        pg = Running(
            [binary("postgres"), f"--web.listen-address=127.0.0.1:{port}"],
            tmp / "postgres-exporter.log",
            env={"DATA_SOURCE_NAME": f"host=127.0.0.1 port={free_port()} user=x sslmode=disable"},
        )
        started.append(pg)
        text = scrape_when_up(f"http://127.0.0.1:{port}/metrics", pg, "postgres exporter")
        assert sample(text, "pg_up") == 0, text
        out.names |= exposition_names(text)
        yield out
    finally:
        for p in started:
            p.stop()
        procs.stop()
        stack.stop()


def test_mtail_counts_the_edge_exactly(exported: Exported) -> None:
    """The SLI program parses the real log format and counts every answer, nginx's own too."""
    m = exported.mtail

    def polls(status: str, src: str) -> float | None:
        return sample(m, "fastpoll_edge_requests_total", route="poll", status=status, src=src)

    assert polls("200", "app") == 1, m
    assert polls("200", "cache") == 2, m
    assert polls("403", "-") == 1, m
    assert polls("503", "-") == 1, m  # the app was down: nginx's own JSON 503
    assert sample(m, "fastpoll_edge_log_unparsed_lines_total") == 0, m
    assert sample(m, "fastpoll_edge_request_duration_seconds_count", route="poll") == 5
    assert sample(m, "fastpoll_edge_request_duration_seconds_bucket", route="poll", le="+Inf") == 5


LINE = (
    '2026-11-21T05:46:01+00:00 127.0.0.1 "GET {target} HTTP/1.1" {status} 43 rt={rt} src=cache'
    " us=200\n"
)


def test_mtail_follows_the_configured_prefix(tmp_path: Path) -> None:
    """The program is rendered for the poll location nginx has ([keys] prefix): polls under
    another prefix are polls; /Poll/ is then just another path. Regex characters in the
    prefix are taken literally."""
    log = tmp_path / "access.log"
    log.write_text(
        LINE.format(target="/api/v1.poll/getMessages?user_id=1&sig=-", status=200, rt="0.002")
        + LINE.format(target="/api/v1.poll/getMessages?user_id=2", status=503, rt="0.001")
        + LINE.format(target="/api/v1xpoll/getMessages?user_id=3", status=200, rt="0.001")
        + LINE.format(target="/Poll/getMessages?user_id=4", status=200, rt="0.001")
    )
    run = mtail_one_shot(log, tmp_path, prefix="/api/v1.poll")
    assert run.returncode == 0, run.stderr[-2000:]
    m = run.stdout

    def count(route: str, status: str) -> float | None:
        return sample(m, "fastpoll_edge_requests_total", route=route, status=status)

    assert (count("poll", "200"), count("poll", "503"), count("other", "200")) == (1, 1, 2), m


def test_mtail_keeps_held_polls_apart(tmp_path: Path) -> None:
    """Long polls (wait= 1-6 digits, not all zeros, any case: nginx's @poll_held) are
    route="poll_held", out of the SLIs; wait=0 and no wait are plain polls."""
    log = tmp_path / "access.log"
    held = ["wait=30", "WAIT=1", "user_id=1&Wait=000120&sig=-", "wait=999999"]
    plain = ["wait=0", "wait=000000", "user_id=1", "waited=5", "wait=1234567"]
    log.write_text(
        "".join(LINE.format(target=f"/Poll/getMessages?{q}", status=304, rt="30.002") for q in held)
        + "".join(
            LINE.format(target=f"/Poll/getMessages?{q}", status=200, rt="0.001") for q in plain
        )
    )
    run = mtail_one_shot(log, tmp_path)
    assert run.returncode == 0, run.stderr[-2000:]
    m = run.stdout
    assert sample(m, "fastpoll_edge_requests_total", route="poll_held", status="304") == 4, m
    assert sample(m, "fastpoll_edge_requests_total", route="poll", status="200") == 5, m
    # The latency SLI's histogram has the plain polls only: all in the 1 ms bucket.
    assert sample(m, "fastpoll_edge_request_duration_seconds_bucket", route="poll", le="0.001") == 5
    assert sample(m, "fastpoll_edge_request_duration_seconds_count", route="poll") == 5


def test_tls_cert_expiry_through_node_exporter(exported: Exported) -> None:
    """The certificate's notAfter (10 days from now) and a missing file, as node_exporter serves
    them; promtool accepts the file."""
    node = exported.node
    end = sample(node, "fastpoll_tls_cert_not_after_timestamp_seconds", path=exported.cert)
    assert end is not None and abs(end - (time.time() + 10 * 86400)) < 3600, node
    assert sample(node, "fastpoll_tls_cert_read_success", path=exported.cert) == 1
    missing = str(Path(exported.cert).parent / "missing.pem")
    assert sample(node, "fastpoll_tls_cert_read_success", path=missing) == 0
    assert_valid_exposition(exported.tls)


def test_mtail_counts_a_line_it_cannot_parse(tmp_path: Path) -> None:
    log = tmp_path / "access.log"
    log.write_text("GET /Poll/x 200\n")
    run = mtail_one_shot(log, tmp_path)
    assert sample(run.stdout, "fastpoll_edge_log_unparsed_lines_total") == 1, run.stdout


def test_memcached_stats_through_node_exporter(exported: Exported) -> None:
    node = exported.node
    servers = {
        s: sample(node, "memcached_up", server=s)
        for s in re.findall(r'memcached_up\{server="([^"]+)"\}', node)
    }
    values = [v for v in servers.values() if v is not None]
    assert len(values) == len(servers) and sorted(values) == [0, 1], (
        servers
    )  # the stack's, and one nobody answers
    (up,) = [s for s, v in servers.items() if v == 1]
    items = sample(node, "memcached_current_items", server=up)
    assert items is not None and items >= 1  # the app filled a key
    limit = sample(node, "memcached_limit_bytes", server=up)
    assert limit is not None and limit > 0
    assert_valid_exposition(exported.memcached)


# ---- rules, dashboard, console -------------------------------------------------------------


def rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load(RULES.read_text())
    return [r for g in doc["groups"] for r in g["rules"]]


def recorded() -> set[str]:
    return {r["record"] for r in rules() if "record" in r}


ALWAYS = {"up", "ALERTS"}  # made by Prometheus itself
# Prometheus's and Alertmanager's own metrics: tests/test_alerting.py checks them against the
# real ones.
OWN = re.compile(r"^(prometheus|alertmanager)_")


def unknown(exprs: list[str], names: set[str]) -> dict[str, set[str]]:
    known = names | recorded() | ALWAYS | KNOWN_ELSEWHERE
    return {
        e: {n for n in metric_names(e) - known if not OWN.match(n)}
        for e in exprs
        if {n for n in metric_names(e) - known if not OWN.match(n)}
    }


def dashboard_exprs() -> list[str]:
    d = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in d["panels"] for t in p.get("targets", [])]
    exprs += [a["expr"] for a in d["annotations"]["list"] if "expr" in a]
    for v in d["templating"]["list"]:
        m = re.fullmatch(r"label_values\((.*),\s*\w+\)", v["definition"])
        assert m, v["definition"]
        exprs.append(m.group(1))
    return exprs


def console_exprs() -> list[str]:
    text = CONSOLE.read_text()
    found = re.findall(r'expr: "((?:\\.|[^"\\])*)"', text)
    found += [e.replace('\\"', '"') for e in re.findall(r'\(args "((?:\\.|[^"\\])*)"', text)]
    found += re.findall(r'\(printf "((?:\\.|[^"\\])*)"', text)
    found += re.findall(r'query "((?:\\.|[^"\\])*)"', text)
    return [re.sub(r"%s", "x", e) for e in found]


def test_rules_read_only_exported_metrics(exported: Exported) -> None:
    exprs = [r["expr"] for r in rules()]
    assert unknown(exprs, exported.names) == {}


def test_dashboard_reads_only_exported_metrics(exported: Exported) -> None:
    exprs = dashboard_exprs()
    assert len(exprs) > 30
    assert unknown(exprs, exported.names) == {}


def test_console_reads_only_exported_metrics(exported: Exported) -> None:
    exprs = console_exprs()
    assert len(exprs) >= 10
    assert unknown(exprs, exported.names) == {}


def test_every_query_parses(tmp_path: Path) -> None:
    """promtool parses each dashboard and console expression (as a recording rule)."""
    exprs = [
        e.replace("$__rate_interval", "5m").replace("$host", ".*")
        for e in dashboard_exprs() + console_exprs()
    ]
    doc = {
        "groups": [
            {
                "name": "q",
                "rules": [{"record": f"q:{i}", "expr": e} for i, e in enumerate(exprs)],
            }
        ]
    }
    f = tmp_path / "q.yml"
    f.write_text(yaml.safe_dump(doc))
    run = subprocess.run(
        [binary("promtool"), "check", "rules", str(f)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode == 0, run.stdout + run.stderr


def test_dashboard_is_importable() -> None:
    d = json.loads(DASHBOARD.read_text())
    assert d["uid"] and d["title"] and d["schemaVersion"] >= 30
    assert [i["name"] for i in d["__inputs"]] == ["DS_PROMETHEUS"]
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids))
    for p in d["panels"]:
        g = p["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24, p["title"]
        if p["type"] != "row":
            assert p["datasource"]["uid"] == "${DS_PROMETHEUS}", p["title"]
            assert p["targets"], p["title"]
            assert len({t["refId"] for t in p["targets"]}) == len(p["targets"])


def runbook_anchors() -> set[str]:
    anchors = set()
    for line in RUNBOOK.read_text().splitlines():
        m = re.match(r"^#+\s+(.*)$", line)
        if m:
            slug = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
            anchors.add(slug)
    return anchors


def test_every_alert_links_its_runbook_section() -> None:
    anchors = runbook_anchors()
    alerts = [r for r in rules() if "alert" in r]
    assert len(alerts) >= 6
    for r in alerts:
        url = r["annotations"]["runbook_url"]
        path, _, anchor = url.partition("#")
        assert path == "docs/runbook.md" and anchor in anchors, (r["alert"], url)
        assert r["labels"]["severity"] in ("page", "ticket", "none"), r["alert"]


def test_rules_and_their_unit_tests() -> None:
    promtool = binary("promtool")
    for argv in (["check", "rules", str(RULES)], ["test", "rules", str(RULE_TESTS)]):
        run = subprocess.run([promtool, *argv], capture_output=True, text=True, check=False)
        assert run.returncode == 0, run.stdout + run.stderr


def test_rendered_prometheus_yml_passes_promtool(tmp_path: Path) -> None:
    defaults = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    rules_dir = tmp_path / "rules"
    rules_dir.mkdir()
    shutil.copy(RULES, rules_dir)
    for alertmanagers in ([], ["10.0.0.9:9093"]):
        text = render_template(
            ROLE / "templates",
            "prometheus.yml.j2",
            **{
                **defaults,
                "monitoring_alertmanagers": alertmanagers,
                "monitoring_external_labels": {"fleet": "test"},
            },
            fastpoll_address="10.0.0.24",
            fastpoll_prometheus_port=9090,
            inventory_hostname="mon1",
        ).replace("/etc/prometheus/rules/", f"{rules_dir}/")
        f = tmp_path / "prometheus.yml"
        f.write_text(text)
        run = subprocess.run(
            [binary("promtool"), "check", "config", str(f)],
            capture_output=True,
            text=True,
            check=False,
        )
        assert run.returncode == 0, run.stdout + run.stderr
        jobs = [j["job_name"] for j in yaml.safe_load(text)["scrape_configs"]]
        ams = ["alertmanager"] if alertmanagers else []
        assert jobs == ["prometheus", *ams, *defaults["monitoring_jobs"]]


def test_console_renders_on_prometheus(tmp_path: Path) -> None:
    consoles, libs, data = tmp_path / "consoles", tmp_path / "libs", tmp_path / "data"
    for d in (consoles, libs, data):
        d.mkdir()
    shutil.copy(CONSOLE, consoles)
    for lib in ("prom.lib", "menu.lib"):
        shutil.copy(CONSOLE_LIBS / lib, libs)
    cfg = tmp_path / "prometheus.yml"
    cfg.write_text(f"global: {{scrape_interval: 15s}}\nrule_files: [{RULES}]\nscrape_configs: []\n")
    port = free_port()
    prom = Running(
        [
            binary("prometheus"),
            f"--config.file={cfg}",
            f"--storage.tsdb.path={data}",
            f"--web.listen-address=127.0.0.1:{port}",
            f"--web.console.templates={consoles}",
            f"--web.console.libraries={libs}",
        ],
        tmp_path / "prometheus.log",
    )
    try:
        scrape_when_up(f"http://127.0.0.1:{port}/-/ready", prom, "prometheus")
        r = httpx.get(f"http://127.0.0.1:{port}/consoles/fastpoll.html", timeout=10)
        assert r.status_code == 200, r.text[-2000:]
        assert "fastpoll" in r.text and "error" not in r.text.lower()
        # The rules loaded: every alert is known to this Prometheus.
        got = httpx.get(f"http://127.0.0.1:{port}/api/v1/rules", timeout=10).json()
        names = {r["name"] for g in got["data"]["groups"] for r in g["rules"]}
        assert {r.get("alert") or r["record"] for r in rules()} <= names
    finally:
        prom.stop()
    time.sleep(0)


# ---- Alertmanager (role alertmanager) ------------------------------------------------------

AM_ROLE = ROOT / "ansible" / "roles" / "alertmanager"


def alertmanager_yml(tmp: Path, **variables: object) -> Path:
    defaults = yaml.safe_load((AM_ROLE / "defaults" / "main.yml").read_text())
    f = tmp / "alertmanager.yml"
    f.write_text(
        render_template(AM_ROLE / "templates", "alertmanager.yml.j2", **{**defaults, **variables})
    )
    return f


def test_alertmanager_config_passes_amtool(tmp_path: Path) -> None:
    hooks = {
        f"alertmanager_{r}_webhook_url": f"https://hooks.example/{r}"
        for r in ("page", "ticket", "watchdog")
    }
    for variables in ({}, hooks):  # without receivers (the default), and with them
        f = alertmanager_yml(tmp_path, **variables)
        run = subprocess.run(
            [binary("amtool"), "check-config", str(f)], capture_output=True, text=True, check=False
        )
        assert run.returncode == 0, run.stdout + run.stderr


@pytest.mark.parametrize(
    ("labels", "receiver"),
    [
        ({"alertname": "ErrorBudgetBurn", "slo": "poll-availability", "severity": "page"}, "page"),
        ({"alertname": "ErrorBudgetBurn", "slo": "poll-latency", "severity": "ticket"}, "ticket"),
        (
            {
                "alertname": "CacheServerUnreachable",
                "server": "10.0.0.21:11211",
                "severity": "page",
            },
            "page",
        ),
        (
            {
                "alertname": "CacheServerDownCovered",
                "server": "10.0.0.21:11211",
                "severity": "ticket",
            },
            "ticket",
        ),
        ({"alertname": "Watchdog", "severity": "none"}, "watchdog"),
        ({"alertname": "Unknown"}, "ticket"),
    ],
)
def test_alertmanager_routes_by_severity(
    tmp_path: Path, labels: dict[str, str], receiver: str
) -> None:
    f = alertmanager_yml(tmp_path)
    run = subprocess.run(
        [binary("amtool"), "config", "routes", "test", f"--config.file={f}",
         f"--verify.receivers={receiver}", *(f"{k}={v}" for k, v in labels.items())],
        capture_output=True,
        text=True,
        check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr


def test_without_replicas_one_cache_server_down_pages(tmp_path: Path) -> None:
    """monitoring_cache_replicas false: the role writes fastpoll:cache_replicas as vector(0),
    and a single server down pages (its keys have no other copy)."""
    doc = yaml.safe_load(RULES.read_text())
    for g in doc["groups"]:
        for r in g["rules"]:
            if r.get("record") == "fastpoll:cache_replicas":
                assert r["expr"] == "vector(1)"
                r["expr"] = "vector(0)"
    (tmp_path / "rules.yml").write_text(yaml.safe_dump(doc))
    up = 'fastpoll_backend_up{{job="fastpoll_poller",host="fp-poll1",poller="8101",server="{}"}}'
    case = {
        "rule_files": ["rules.yml"],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [
                    {"series": up.format("10.0.0.21:11211"), "values": "0 0 0 0"},
                    {"series": up.format("10.0.0.22:11211"), "values": "1 1 1 1"},
                ],
                "promql_expr_test": [
                    {
                        "expr": 'ALERTS{alertstate="firing",alertname=~"CacheServer.*"}',
                        "eval_time": "2m",
                        "exp_samples": [
                            {
                                "labels": 'ALERTS{alertname="CacheServerUnreachable",'
                                'alertstate="firing",server="10.0.0.21:11211",severity="page"}',
                                "value": 1,
                            }
                        ],
                    }
                ],
            }
        ],
    }
    (tmp_path / "test.yml").write_text(yaml.safe_dump(case))
    run = subprocess.run(
        [binary("promtool"), "test", "rules", str(tmp_path / "test.yml")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode == 0, run.stdout + run.stderr


# ---- Redis Sentinel: the alerts on what a real exporter reads from a real sentinel --------------

SENTINEL_ALERTS = [
    "SentinelDown",
    "SentinelQuorumLost",
    "SentinelNoReplica",
    "SentinelMastersDisagree",
    "RedisDown",
]
SENTINEL_TARGET = {"job": "sentinel", "host": "sen1", "instance": "10.0.0.23:9355"}


def scrape_until(url: str, proc: Running, what: str, ok: Any) -> str:
    """The first scrape of url for which ok(text) holds (the sentinels take a few seconds to
    find each other, and to find one down)."""
    got: list[str] = []

    def check() -> bool:
        try:
            text = httpx.get(url, timeout=5).text
        except httpx.HTTPError:
            return False
        if ok(text):
            got.append(text)
        return bool(got)

    wait_for(what, check, timeout=60, proc=proc.popen, logs=[proc.log], interval=0.5)
    return got[0]


def promtool_sentinel_alerts(tmp: Path, scrape: str, want: dict[str, dict[str, str]]) -> None:
    """One scrape of the Sentinel exporter as 15 minutes of series of a `sentinel` target, run
    through the shipped rules with promtool: at 10 min exactly the alerts of `want` (name: the
    labels it must carry besides severity) fire among SENTINEL_ALERTS, with their annotations."""

    def selector(name: str, labels: dict[str, str]) -> str:
        return name + "{" + ",".join(f"{k}={json.dumps(v)}" for k, v in labels.items()) + "}"

    series = [{"series": selector("up", SENTINEL_TARGET), "values": "1x15"}]
    for m in re.finditer(r"^(redis_up|redis_sentinel_\w+)(?:\{(.*)\})?\s+(\S+)$", scrape, re.M):
        labels = dict(re.findall(r'(\w+)="((?:\\.|[^"\\])*)"', m.group(2) or ""))
        series.append(
            {
                "series": selector(m.group(1), {**labels, **SENTINEL_TARGET}),
                "values": f"{m.group(3)}x15",
            }
        )
    by_name = {r["alert"]: r for r in rules() if "alert" in r}
    cases = []
    for name in SENTINEL_ALERTS:
        exp = []
        if name in want:
            rule = by_name[name]
            exp_labels = {**want[name], **rule["labels"]}

            def expand(m: re.Match[str], have: dict[str, str] = exp_labels) -> str:
                return have[m.group(1)]

            annotations = {
                k: re.sub(r"\{\{ \$labels\.(\w+) \}\}", expand, v)
                for k, v in rule["annotations"].items()
            }
            exp = [{"exp_labels": exp_labels, "exp_annotations": annotations}]
        cases.append({"eval_time": "10m", "alertname": name, "exp_alerts": exp})
    doc = {
        "rule_files": [str(RULES)],
        "evaluation_interval": "1m",
        "tests": [{"interval": "1m", "input_series": series, "alert_rule_test": cases}],
    }
    f = tmp / "sentinel.test.yml"
    f.write_text(yaml.safe_dump(doc, sort_keys=False, width=1000))
    run = subprocess.run(
        [binary("promtool"), "test", "rules", str(f)], capture_output=True, text=True, check=False
    )
    assert run.returncode == 0, run.stdout + run.stderr + "\n" + scrape[-3000:]


def test_sentinel_alerts_from_a_real_sentinel(tmp_path: Path) -> None:
    """A master with a replica and three sentinels as role redis_sentinel configures them, the
    Sentinel exporter as role exporters runs it on the first one. Every metric the Sentinel alerts
    and RedisDown read is in its scrape, and each scrape, run through the shipped rules (promtool),
    fires what it should: all healthy, nothing; two sentinels and the replica stopped,
    SentinelQuorumLost and SentinelNoReplica; its own sentinel stopped, SentinelDown (and not
    RedisDown, the Redis hosts' alert)."""
    procs = Procs(tmp_path)
    exporter: Running | None = None
    try:
        pw = secrets.token_hex(16)
        master = procs.redis(f"requirepass {pw}")
        replica = procs.redis(
            f"replicaof 127.0.0.1 {master}", f"masterauth {pw}", f"requirepass {pw}"
        )
        sentinels = [role_sentinel(procs, master, pw) for _ in range(3)]
        exporter, url = sentinel_exporter(tmp_path, sentinels[0], pw)

        def ms(text: str, name: str) -> float | None:
            return sample(text, name, master_name=SENTINEL_MASTER)

        text = scrape_until(
            url,
            exporter,
            "the sentinels to find each other and the replica",
            lambda t: ms(t, "redis_sentinel_master_ok_sentinels") == 3
            and ms(t, "redis_sentinel_master_ok_slaves") == 1,
        )
        names = exposition_names(text)
        read = {
            r["alert"]: metric_names(r["expr"]) - ALWAYS
            for r in rules()
            if r.get("alert") in SENTINEL_ALERTS
        }
        assert set(read) == set(SENTINEL_ALERTS)
        assert {a: n - names for a, n in read.items() if n - names} == {}
        assert sample(text, "redis_up") == 1
        assert 'redis_mode="sentinel"' in text
        assert ms(text, "redis_sentinel_master_ckquorum_status") == 1
        addr = f"127.0.0.1:{master}"
        assert sample(text, "redis_sentinel_master_ok_sentinels", master_address=addr) == 3
        promtool_sentinel_alerts(tmp_path, text, {})

        by_name = {p.name: p for p in procs.started}
        for name in (f"sentinel-{sentinels[1]}", f"sentinel-{sentinels[2]}", f"redis-{replica}"):
            by_name[name].stop()
        text = scrape_until(
            url,
            exporter,
            "the sentinel to find the others and the replica down",
            lambda t: ms(t, "redis_sentinel_master_ckquorum_status") == 0
            and ms(t, "redis_sentinel_master_ok_slaves") == 0,
        )
        promtool_sentinel_alerts(
            tmp_path,
            text,
            {
                "SentinelQuorumLost": {**SENTINEL_TARGET, "master_name": SENTINEL_MASTER},
                "SentinelNoReplica": {"master_name": SENTINEL_MASTER, "master_address": addr},
            },
        )

        by_name[f"sentinel-{sentinels[0]}"].stop()
        text = scrape_until(
            url, exporter, "redis_up 0", lambda t: sample(t, "redis_up") == 0
        )
        promtool_sentinel_alerts(tmp_path, text, {"SentinelDown": SENTINEL_TARGET})
    finally:
        if exporter is not None:
            exporter.stop()
        procs.stop()
