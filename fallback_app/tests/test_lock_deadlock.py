"""The per-user locks across worker processes: the kernel's false EDEADLK is retried."""

from __future__ import annotations

import multiprocessing
import threading
import time
from pathlib import Path

from fastpoll_app.locks import UserLocks


def _other_worker(path: str, ready, go) -> None:  # noqa: ANN001 -- multiprocessing events
    locks = UserLocks(path, stripes=8)
    with locks.hold(2):  # stripe 2
        ready.set()
        go.wait(10)
        with locks.hold(1):  # waits: stripe 1 is held by the other process
            pass


def test_no_false_deadlock_between_two_workers(tmp_path: Path) -> None:
    """Thread A of this process holds stripe 1; another process holds stripe 2 and waits for
    stripe 1; now thread B of this process asks for stripe 2. To the kernel (per-process lock
    owners) that is a cycle, and lockf fails B with EDEADLK; but A lets go, so B must simply
    get stripe 2 once the other process is done with it."""
    path = str(tmp_path / "db.locks")
    locks = UserLocks(path, stripes=8)
    ctx = multiprocessing.get_context("fork")
    ready, go = ctx.Event(), ctx.Event()
    errors: list[BaseException] = []
    got: list[bool] = []

    def thread_b() -> None:
        try:
            with locks.hold(2):
                got.append(True)
        except BaseException as exc:  # noqa: BLE001 -- reported below
            errors.append(exc)

    with locks.hold(1):  # thread A
        other = ctx.Process(target=_other_worker, args=(path, ready, go))
        other.start()
        assert ready.wait(10)
        go.set()
        time.sleep(0.3)  # the other process now waits for stripe 1
        b = threading.Thread(target=thread_b)
        b.start()
        time.sleep(0.3)  # B asks for stripe 2 while A still holds 1
    b.join(10)
    other.join(10)
    assert not errors, errors
    assert got == [True]
    assert other.exitcode == 0
