"""The fleet gate's script (ansible/roles/slo_gate/files/fastpoll-slo-gate): its verdicts, and the
script itself against a real Prometheus scraping real mtail processes (the edge SLI program on
two hosts' access logs, labelled as the monitoring role labels them) and a real node exporter
(a textfile of poll server lookups). The fleet test's slo-gate scenario runs it in a rollout."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest

from fastpoll_testkit.helpers import load_script
from fastpoll_testkit.monitoring import Running, binary, mtail_program, scrape_when_up
from fastpoll_testkit.procs import free_port, wait_for
from fastpoll_testkit.stack import ROOT

SCRIPT = ROOT / "ansible/roles/slo_gate/files/fastpoll-slo-gate"


gate = load_script(SCRIPT, "fastpoll_slo_gate")


def _args(**kw: float) -> argparse.Namespace:
    d = dict(
        min_polls=20,
        max_error_ratio=0.01,
        max_error_increase=0.01,
        max_app_share_increase=0.1,
        max_p99_ratio=2.0,
        p99_slack_s=0.05,
    )
    d.update(kw)
    return argparse.Namespace(**d)


GOOD = {"hosts": ["a"], "polls": 500.0, "error_ratio": 0.0, "app_share": 0.02, "p99_s": 0.01}


def test_a_batch_like_the_others_passes() -> None:
    updated = dict(GOOD, hosts=["b"], app_share=0.05, p99_s=0.02, error_ratio=0.005)
    assert gate.judge(updated, GOOD, [], _args()) == []


@pytest.mark.parametrize(
    ("updated", "words"),
    [
        ({"error_ratio": 0.03}, "5xx ratio of the updated hosts 0.0300 against 0.0000"),
        ({"app_share": 0.9}, "share of polls answered by the app 0.900"),
        ({"p99_s": 0.2}, "p99 of plain polls 200 ms on the updated hosts against 10 ms"),
    ],
)
def test_a_batch_worse_than_the_others_fails(updated: dict[str, float], words: str) -> None:
    failed = gate.judge(dict(GOOD, **updated), GOOD, [], _args())
    assert len(failed) == 1 and words in failed[0], failed


def test_the_last_batch_is_judged_on_its_own_errors() -> None:
    assert gate.judge(dict(GOOD, app_share=0.9), None, [], _args()) == []
    failed = gate.judge(dict(GOOD, error_ratio=0.02), None, [], _args())
    assert failed == ["5xx ratio of the updated hosts 0.0200 above 0.0100"]
    # Others with too few polls to compare with count as none.
    idle = dict(GOOD, polls=3.0, error_ratio=0.0)
    assert gate.judge(dict(GOOD, error_ratio=0.02), idle, [], _args()) == failed


def test_a_page_fails_the_batch_even_without_polls() -> None:
    idle = dict(GOOD, polls=0.0)
    assert gate.judge(idle, GOOD, ["alertname=X,severity=page"], _args()) == [
        "page firing: alertname=X,severity=page"
    ]
    assert gate.judge(idle, GOOD, [], _args()) == []


def test_hosts_are_matched_exactly() -> None:
    # A PromQL string holding an RE2 regex: each host's regex characters escaped, and the
    # backslashes escaped again for the string.
    assert gate.hosts_re(["fp-poll1", "a.b"]) == "fp\\\\-poll1|a\\\\.b"


def _line(target: str, status: int, src: str) -> str:
    ts = datetime.now(UTC).isoformat(timespec="seconds")
    return f'{ts} 10.0.0.1 "GET {target} HTTP/1.1" {status} 43 rt=0.002 src={src} us={status}\n'


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict[str, Path]]]:
    """Prometheus (1 s scrapes) over two mtail processes, one per host's access log (labels
    host=fp-a, fp-b, as the monitoring role's file_sd gives them), a node exporter's textfile
    of poll server lookups, and one rule: TestPage (severity page) while fp-c has polls."""
    tmp = tmp_path_factory.mktemp("slo-gate")
    progs = tmp / "progs"
    mtail_program(progs)
    started: list[Running] = []
    logs = {h: tmp / f"{h}.access.log" for h in ("fp-a", "fp-b", "fp-c")}
    ports = {h: free_port() for h in logs}
    textdir = tmp / "textfile"
    textdir.mkdir()
    node_port, prom_port = free_port(), free_port()
    try:
        for h, log in logs.items():
            log.write_text("")
            started.append(Running(
                [binary("mtail"), "--progs", str(progs), "--logs", str(log), "--address",
                 "127.0.0.1", "--port", str(ports[h]), "--logtostderr"],
                tmp / f"mtail-{h}.log",
            ))  # fmt: skip
        started.append(Running(
            [binary("node"), f"--web.listen-address=127.0.0.1:{node_port}",
             "--collector.disable-defaults", "--collector.textfile",
             f"--collector.textfile.directory={textdir}"],
            tmp / "node.log",
        ))  # fmt: skip
        rules = tmp / "rules.yml"
        rules.write_text(
            "groups:\n  - name: test\n    rules:\n      - alert: TestPage\n"
            '        expr: sum(fastpoll_edge_requests_total{host="fp-c"}) > 0\n'
            "        labels: {severity: page}\n"
        )
        targets = "".join(
            f"  - job_name: mtail-{h}\n    static_configs:\n"
            f"      - targets: ['127.0.0.1:{p}']\n        labels: {{host: {h}}}\n"
            for h, p in ports.items()
        )
        cfg = tmp / "prometheus.yml"
        cfg.write_text(
            "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
            f"rule_files: ['{rules}']\nscrape_configs:\n{targets}"
            f"  - job_name: node\n    static_configs:\n      - targets: ['127.0.0.1:{node_port}']\n"
        )
        prom = Running(
            [binary("prometheus"), f"--config.file={cfg}", f"--storage.tsdb.path={tmp / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{prom_port}"],
            tmp / "prometheus.log",
        )  # fmt: skip
        started.append(prom)
        url = f"http://127.0.0.1:{prom_port}"
        scrape_when_up(f"{url}/-/ready", prom, "prometheus")
        yield url, {**logs, "textfile": textdir / "lookups.prom"}
    finally:
        for p in reversed(started):
            p.stop()


def _polls(stop: threading.Event, logs: dict[str, Path], srcs: dict[str, str]) -> None:
    """20 plain polls a second to each host's log, answered by the source given for it."""
    while not stop.wait(0.05):
        for h, src in srcs.items():
            with logs[h].open("a") as f:
                f.write(_line("/Poll/getMessages?user_id=1&sig=-", 200, src))


def _run(*args: str) -> tuple[int, dict[str, object]]:
    r = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True,
                       timeout=120, check=False)  # fmt: skip
    assert r.returncode in (0, 1, 2), r.stderr
    return r.returncode, json.loads(r.stdout)


def test_the_gate_on_a_real_prometheus(prometheus: tuple[str, dict[str, Path]]) -> None:
    url, logs = prometheus
    stop = threading.Event()
    feeder = threading.Thread(target=_polls, args=(stop, logs, {"fp-a": "app", "fp-b": "cache"}))
    feeder.start()
    try:
        wait_for(
            "both hosts' polls in Prometheus",
            lambda: len(gate.query(url, 'fastpoll_edge_requests_total{route="poll"}')) >= 2,
            timeout=30,
        )
        common = [f"--prometheus={url}", "--bake=4", "--scrape-wait=2", '--alerts=severity="page"']
        rc, doc = _run("batch", *common, "--updated=fp-a", "--others=fp-b")
        assert rc == 1, doc
        failed = doc["failed"]
        assert isinstance(failed, list) and len(failed) == 1
        assert (
            "share of polls answered by the app 1.000 on the updated hosts against 0.000"
            in failed[0]
        )
        rc, doc = _run("batch", *common, "--updated=fp-b", "--others=fp-a")
        assert rc == 0 and doc["failed"] == [], doc
        # A page firing stops any batch.
        with logs["fp-c"].open("a") as f:
            f.write(_line("/Poll/getMessages?user_id=1&sig=-", 200, "cache"))
        wait_for("TestPage firing", lambda: gate.firing(url, 'severity="page"') != [], timeout=30)
        rc, doc = _run("batch", *common, "--updated=fp-b", "--others=fp-a")
        assert rc == 1 and doc["failed"] == ["page firing: alertname=TestPage,severity=page"]
    finally:
        stop.set()
        feeder.join()
    # Prometheus that cannot be asked: the gate does not pass (2), and says why.
    rc, doc = _run("batch", f"--prometheus=http://127.0.0.1:{free_port()}", "--bake=0",
                   "--scrape-wait=0", "--updated=fp-a")  # fmt: skip
    assert rc == 2 and "cannot ask Prometheus" in str(doc["failed"]), doc


def test_the_hit_ratio_gate_on_a_real_prometheus(prometheus: tuple[str, dict[str, Path]]) -> None:
    url, files = prometheus
    text = files["textfile"]
    stop = threading.Event()

    def count() -> None:  # 9 hits to 1 miss, growing like a poll server's counters
        n = 0
        while not stop.wait(0.2):
            n += 10
            tmp = text.with_suffix(".tmp")
            tmp.write_text(
                "# TYPE fastpoll_requests_total counter\n"
                f'fastpoll_requests_total{{outcome="hit"}} {9 * n}\n'
                f'fastpoll_requests_total{{outcome="miss"}} {n}\n'
            )
            tmp.rename(text)

    counter = threading.Thread(target=count)
    counter.start()
    try:
        wait_for(
            "lookups in Prometheus",
            lambda: gate.hit_ratio(url, 3) is not None,
            timeout=30,
        )
        rc, doc = _run("hit-ratio", f"--prometheus={url}", "--window=3")
        assert rc == 0 and doc["hit_ratio"] == pytest.approx(0.9, abs=0.02), doc
        t0 = time.monotonic()
        rc, doc = _run("hit-ratio", f"--prometheus={url}", "--window=3", "--at-least=0.85",
                       "--timeout=10", "--interval=1")  # fmt: skip
        assert rc == 0, doc
        rc, doc = _run("hit-ratio", f"--prometheus={url}", "--window=3", "--at-least=0.95",
                       "--timeout=3", "--interval=1")  # fmt: skip
        assert rc == 1 and "not back to 0.9500 within 3 s" in str(doc["failed"]), doc
        assert time.monotonic() - t0 >= 6  # each waited its window first
    finally:
        stop.set()
        counter.join()
    assert httpx.get(f"{url}/-/ready", timeout=5).status_code == 200
