"""SIGINT and SIGTERM during a contract run: an exception in the main thread, so that every
process the command started is stopped, by pid, before it exits (the runner stops its stack; the
defects command stops its runner, then whatever is still running under it).

A stack's processes run in sessions of their own (a terminal's ^C reaches only the command), so
nothing but the command itself can stop them."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import time
from types import FrameType

from fastpoll_testkit.status import start_time

_PR_SET_CHILD_SUBREAPER = 36


class Interrupted(BaseException):
    """Not an Exception: the runs' `except Exception` (a fault that failed) must not swallow it."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _raise(signum: int, frame: FrameType | None) -> None:
    del frame
    for sig in (signal.SIGINT, signal.SIGTERM):  # the cleanup itself is not interrupted
        signal.signal(sig, signal.SIG_IGN)
    raise Interrupted(signum)


def install() -> None:
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _raise)


def adopt_orphans() -> None:
    """Become a child subreaper (prctl(2)): a process started under this one whose parent dies
    is reparented here rather than to init, so `descendants(os.getpid())` still finds it."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")


def _stat(pid: int) -> tuple[int, str] | None:
    """(parent pid, state) from /proc/PID/stat; None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return int(fields[1]), fields[0]


def descendants(pid: int) -> list[tuple[int, int]]:
    """(pid, kernel start time) of every live process under pid, by /proc's parent links."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and (st := _stat(int(name))) is not None and st[1] != "Z":
            children.setdefault(st[0], []).append(int(name))
    found: list[tuple[int, int]] = []
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append((child, start_time(child)))
            todo.append(child)
    return found


def _running(proc: tuple[int, int]) -> bool:
    """Still the process that was found (same start time), and not a zombie."""
    st = _stat(proc[0])
    return st is not None and st[1] != "Z" and proc[1] != 0 and start_time(proc[0]) == proc[1]


def reap() -> None:
    """Collects this process's exited children (orphans adopted as a subreaper included)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def stop(procs: list[tuple[int, int]], timeout: float = 10.0) -> None:
    """SIGTERM each of procs still running (SIGCONT first: the nemesis may have frozen it),
    SIGKILL the ones left after timeout."""
    for sigs in ((signal.SIGCONT, signal.SIGTERM), (signal.SIGKILL,)):
        for proc in procs:
            for sig in sigs:
                if _running(proc):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(proc[0], sig)
        deadline = time.monotonic() + timeout
        while any(_running(p) for p in procs) and time.monotonic() < deadline:
            reap()
            time.sleep(0.05)
        reap()
