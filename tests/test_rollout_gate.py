"""The rollout gate's script (ansible/roles/rollout_gate/files/fastpoll-gate) on nginx access logs
in the `fastpoll` format: what it counts, and when it stops a rollout. The fleet test's
gated-release scenario runs it on real hosts."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from fastpoll_testkit.helpers import load_script

SCRIPT = Path(__file__).resolve().parents[1] / "ansible/roles/rollout_gate/files/fastpoll-gate"


gate = load_script(SCRIPT, "fastpoll_gate")


def _line(t: float, target: str, status: int = 200, rt: float = 0.002, src: str = "cache") -> str:
    ts = datetime.fromtimestamp(t, UTC).isoformat(timespec="seconds")
    return (
        f'{ts} 10.0.0.1 "GET {target} HTTP/1.1" {status} 45 rt={rt:.3f} src={src} '
        f"us={status} ut={rt:.3f} ua=unix:/run/fastpoll/poller-8101.sock\n"
    )


def _args(**kw: float) -> argparse.Namespace:
    d = dict(
        seconds=15.0,
        min_polls=20,
        max_error_increase=0.01,
        max_app_share_increase=0.1,
        max_p99_ratio=2.0,
        p99_slack_s=0.05,
        max_cache_failure_ratio=0.05,
    )
    d.update(kw)
    return argparse.Namespace(**d)


def test_window_counts_polls_only_in_range(tmp_path: Path) -> None:
    log = tmp_path / "a.log"
    now = time.time()
    lines = []
    for i in range(3000):  # one line per 0.1 s over 300 s: the binary search must skip most
        t = now - 300 + i * 0.1
        src = "app" if i % 10 == 0 else "cache"
        lines.append(_line(t, "/Poll/getMessages?user_id=1&exp=9&sig=-", src=src))
    lines.append(_line(now - 5, "/healthz"))  # not a poll
    lines.append(_line(now - 5, "/Poll/getMessages?user_id=2&wait=30", rt=29.0))  # held: no p99
    lines.append(_line(now - 5, "/Poll/getMessages?user_id=3", status=502, rt=0.5))
    log.write_text("".join(lines))
    w = gate.window(str(log), "/Poll", now - 60, now)
    assert 585 <= w["polls"] <= 615  # whole seconds in the log
    assert w["error_ratio"] == pytest.approx(1 / w["polls"])
    assert w["app_share"] == pytest.approx(0.1, abs=0.01)
    assert w["p99_s"] == pytest.approx(0.002)  # the 0.5 s 502 is 1 of 602: above p99
    assert gate.window(str(tmp_path / "missing.log"), "/Poll", now - 60, now)["polls"] == 0


BEFORE = {"polls": 500, "error_ratio": 0.0, "app_share": 0.02, "p99_s": 0.01, "start": 0, "end": 60}
AFTER = {"polls": 200, "error_ratio": 0.0, "app_share": 0.02, "p99_s": 0.010, "start": 0, "end": 15}


def test_judge_passes_a_release_like_the_last() -> None:
    after = dict(AFTER, app_share=0.05, p99_s=0.020)
    assert gate.judge(BEFORE, after, {"hit": 900.0, "miss": 30.0, "error": 1.0}, _args()) == []


@pytest.mark.parametrize(
    ("after", "reads", "words"),
    [
        ({"app_share": 0.98}, {}, "share of polls answered by the app"),
        ({"error_ratio": 0.05}, {}, "5xx ratio"),
        ({"p99_s": 0.200}, {}, "p99 200 ms"),
        ({}, {"hit": 10.0, "error": 90.0}, "cache reads failed"),
    ],
)
def test_judge_stops_a_release_that_is_worse(
    after: dict[str, float], reads: dict[str, float], words: str
) -> None:
    failed = gate.judge(BEFORE, dict(AFTER, **after), reads, _args())
    assert len(failed) == 1 and words in failed[0], failed


def test_judge_leaves_a_window_with_too_few_polls_unjudged() -> None:
    # Clients that stopped polling are not a failed release: nothing to judge.
    quiet = dict(AFTER, polls=3, app_share=1.0, error_ratio=1.0, p99_s=5.0)
    assert gate.judge(BEFORE, quiet, {}, _args()) == []


def test_baseline_command_prints_json(tmp_path: Path) -> None:
    log = tmp_path / "a.log"
    now = time.time()
    log.write_text("".join(_line(now - 30 + i * 0.05, "/Poll/x?user_id=1") for i in range(400)))
    argv = [sys.executable, str(SCRIPT), "baseline", "--log", str(log), "--seconds", "20"]
    out = subprocess.run(argv, check=True, capture_output=True, text=True)
    got = json.loads(out.stdout)
    # The window ends 6 s ago (nginx's flush): 16 s of these 30 s, at 20 polls a second.
    assert 290 <= got["polls"] <= 350 and got["app_share"] == 0.0
    # With nginx flushing every second (fastpoll_access_log_flush_seconds: 1; the gate gets 2 s)
    # the window is the 20 s up to 2 s ago: 12 s of these (30 to 10 s ago), less the time the
    # first run took (the log's times are fixed).
    argv += ["--flush-seconds", "2"]
    out = subprocess.run(argv, check=True, capture_output=True, text=True)
    got = json.loads(out.stdout)
    assert 160 <= got["polls"] <= 245
