"""`make status` (fastpoll_testkit.status) on a real stack with one poll server killed: one
clear line for it (which poller, its admin address, what failed, its pid and poll port), a
process count that agrees, and the ATR and nginx columns explained."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from fastpoll_testkit.helpers import start_stack
from fastpoll_testkit.stack import Stack


@pytest.fixture()
def two_pollers(tmp_path: Path) -> Iterator[Stack]:
    s = start_stack(tmp_path / "run", "memcached", n_pollers=2, app_workers=1)
    yield s
    s.stop()


def status(stack: Stack) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fastpoll_testkit.status", "--run-dir", str(stack.run_dir),
         "--interval", "0.2"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def test_a_killed_poller_is_one_clear_line(two_pollers: Stack) -> None:
    stack = two_pollers
    r = status(stack)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "processes  " in r.stdout and " running (" in r.stdout
    assert "ATR: the event loop's active-to-total ratio" in r.stdout
    assert "connections dropped (accepted, never handled" in r.stdout
    assert "accepted-handled" not in r.stdout

    victim = stack.procs["poller-1"]
    admin = stack.admin_ports[1]
    # Killed and not yet reaped by its parent (this process): a zombie still has its /proc entry.
    os.kill(victim.pid, signal.SIGKILL)
    r = status(stack)
    out = r.stdout
    assert r.returncode == 1, out
    assert "Traceback" not in out + r.stderr and "urlopen" not in out and "Errno" not in out
    n = len(stack.procs)
    assert f"processes  {n - 1}/{n} running; gone: poller-1\n" in out, out
    down = [line for line in out.splitlines() if "DOWN" in line]
    assert down == [
        f"  poller-1   DOWN    admin http://127.0.0.1:{admin}/metrics: connection refused; "
        f"process {victim.pid} gone (poll port {victim.port})"
    ], out
    assert re.search(r"^  poller-0   up ", out, re.M), out
    assert out.rstrip().endswith("NOT ALL UP")
