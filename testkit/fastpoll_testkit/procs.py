"""Process control shared by every test and drill (standard library only, so the poll server's
stand-alone checks can import it too).

kill(pid, SIGSTOP) returns before the process has stopped: the kernel wakes one thread to take
the stop and that thread tells the others. On a busy machine a memcached worker thread can go on
answering for tens of milliseconds, so a test that "hangs" a server and sends requests at once
may see them answered. freeze() returns only when every thread is stopped.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time


def _all_stopped(pid: int) -> bool:
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return True  # gone: nothing left to answer
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat", encoding="ascii") as f:
                stat = f.read()
        except FileNotFoundError:
            continue  # a thread that exited
        # The state follows the parenthesised command name, which may hold spaces.
        if stat[stat.rindex(")") + 2] not in "Tt":
            return False
    return True


def freeze(pid: int, timeout: float = 5.0) -> None:
    """SIGSTOP pid and wait until all of its threads are stopped."""
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + timeout
    while not _all_stopped(pid):
        if time.monotonic() > deadline:
            raise TimeoutError(f"pid {pid} not stopped {timeout:.0f} s after SIGSTOP")
        time.sleep(0.001)


def terminate(
    popen: subprocess.Popen[bytes], timeout: float = 10.0, sig: int = signal.SIGTERM
) -> None:
    """Signal a process this test started (SIGTERM unless sig says otherwise), SIGKILL it if it
    is still there after timeout."""
    if popen.poll() is not None:
        return
    popen.send_signal(sig)
    try:
        popen.wait(timeout)
    except subprocess.TimeoutExpired:
        popen.kill()
        popen.wait()
