"""make check-contract-defects, interrupted (a terminal's ^C, a CI job's SIGTERM) once its stack is
up, stops every process it started: the patched copy's build and short run, the run's stack
(memcached, Redis, the apps, the poll servers, nginx) and its fault proxies, by pid
(testkit/fastpoll_testkit/contract/defects.py, interrupt.py)."""

from __future__ import annotations

import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from fastpoll_testkit.contract.defects import DEFECTS
from fastpoll_testkit.contract.interrupt import descendants, stop
from fastpoll_testkit.stack import ROOT
from fastpoll_testkit.status import start_time

RUNS = ROOT / "run" / "contract-defects"
UP_DEADLINE_S = 300.0  # HEAD copied and built, then the stack started, on a loaded machine


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def running(proc: tuple[int, int]) -> bool:
    try:
        state = Path(f"/proc/{proc[0]}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z" and start_time(proc[0]) == proc[1]


def stack_up_since(t: float) -> Path | None:
    found = [p for p in RUNS.glob("fastpoll-defect-*/*/stack.json") if p.stat().st_mtime >= t]
    return found[0] if found else None


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupted_defects_run_leaves_no_process(sig: signal.Signals, tmp_path: Path) -> None:
    patch = sorted(DEFECTS.glob("*.patch"))[0]
    started = time.time()
    with (tmp_path / "defects.log").open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "fastpoll_testkit.contract.defects", "--seed", "1", str(patch)],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    tree: list[tuple[int, int]] = []
    try:
        deadline = time.monotonic() + UP_DEADLINE_S
        while (state := stack_up_since(started)) is None:
            assert proc.poll() is None, (tmp_path / "defects.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "no stack up"
            time.sleep(0.5)
        tree = descendants(proc.pid)
        names = " ".join(cmdline(p) for p, _ in tree)
        for part in ("memcached", "redis-server", "poll_server", "nginx", "fastpoll_app"):
            assert part in names, f"{part} not running under the defects command: {names}"
        proc.send_signal(sig)
        code = proc.wait(150)
    finally:
        if proc.poll() is None:  # the test failed: stop what it started, by pid
            proc.kill()
            proc.wait()
        left = [(p, cmdline(p)) for p, t in tree if running((p, t))]
        stop(tree)  # so that a failure leaves nothing running either
    assert not left, f"still running after {sig.name}: {left}"
    assert code == 128 + sig, (tmp_path / "defects.log").read_text()[-3000:]
    out = (tmp_path / "defects.log").read_text()
    assert "its stack is stopped" in out, out[-3000:]  # the run stopped its own first
    assert "every process started is stopped" in out, out[-3000:]
    # The patched copy is removed too (the run directory, named after it, stays).
    assert not (Path(tempfile.gettempdir()) / state.parent.parent.name).exists()
