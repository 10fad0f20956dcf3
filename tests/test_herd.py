"""The app is never buried: nginx admits fallbacks up to
fastpoll_fallback_max_conns per host; the rest get a fast 503 with Retry-After
(X-Poll-Source: shed), never a timeout and never a place in the app's queue.

The short herd drill: the cache is gone, so every poll falls back, and far more
clients poll than the cap admits.
"""

from __future__ import annotations

import os
import re
import signal
import statistics
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from fastpoll_testkit.helpers import new_uid
from fastpoll_testkit.loadgen import run as load
from fastpoll_testkit.procs import freeze
from fastpoll_testkit.stack import Stack

CAP = 4
RETRY_AFTER = 3


@pytest.fixture(scope="module")
def herd_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    s = Stack(
        run_dir=tmp_path_factory.mktemp("herd"),
        n_memcached=1,
        n_pollers=1,
        app_workers=1,
        access_log=True,
        nginx_vars={"fastpoll_fallback_max_conns": CAP, "fastpoll_retry_after": RETRY_AFTER},
    )
    s.start()
    yield s
    s.stop()


def _app_pid(stack: Stack) -> int:
    """With one worker the app is one process: stopping it stops every answer."""
    return stack.procs[Stack.app_name(0)].pid


def test_over_the_cap_a_poll_is_shed_at_once_with_retry_after(herd_stack: Stack) -> None:
    """CAP fallbacks held by a stopped app fill the cap; the next poll is answered at once."""
    stack = herd_stack
    pid = _app_pid(stack)
    urls = [stack.poll_url(new_uid()) for _ in range(CAP + 1)]
    held: list[httpx.Response] = []
    freeze(pid)
    try:
        threads = [
            threading.Thread(
                target=lambda u=u: held.append(httpx.get(stack.base_url + u, timeout=30))
            )
            for u in urls[:CAP]
        ]
        for t in threads:
            t.start()
        time.sleep(1.0)  # every one of them is now waiting on the app
        t0 = time.monotonic()
        r = httpx.get(stack.base_url + urls[CAP], timeout=10)
        took = time.monotonic() - t0
    finally:
        os.kill(pid, signal.SIGCONT)
    for t in threads:
        t.join(30)
    assert r.status_code == 503, r.text
    assert r.headers["x-poll-source"] == "shed"
    assert RETRY_AFTER <= int(r.headers["retry-after"]) < 2 * RETRY_AFTER
    assert r.json()["error"]
    assert took < 0.5, f"the shed answer took {took:.2f}s"
    # The held ones were admitted, not shed: the app answers them once it runs again.
    assert sorted(x.status_code for x in held) == [200] * CAP, [x.text for x in held]
    assert {x.headers["x-poll-source"] for x in held} == {"app"}
    # Below the cap again: the next fallback is admitted.
    assert httpx.get(stack.base_url + urls[CAP], timeout=10).headers["x-poll-source"] == "app"


def _app_times(access_log: Path) -> list[float]:
    """The app's time for every request nginx sent it (the last ut= value of a fallback)."""
    times = []
    for line in access_log.read_text().splitlines():
        if " src=app " not in line:
            continue
        m = re.search(r" ut=(\S+(?: : \S+)*) ", line)
        if m:
            times.append(float(m.group(1).split(" : ")[-1]))
    return times


def test_herd_with_the_cache_gone_no_timeouts_and_the_app_not_queued(herd_stack: Stack) -> None:
    stack = herd_stack
    urls = [stack.poll_url(new_uid()) for _ in range(500)]
    stack.stop_proc("memcached-0")  # every poll now falls back
    try:
        r = load(stack.base_url, [f"GET {u}" for u in urls], 4, connections=64, threads=2)
    finally:
        stack.start_memcached(0)
    assert r.requests > 0, r.summary()
    assert r.errors == {} or sum(r.errors.values()) == 0, r.summary()
    assert set(r.statuses) <= {200, 503}, r.summary()
    assert set(r.sources) <= {"app", "shed"}, r.summary()
    assert r.sources.get("shed", 0) > 0, f"64 clients against a cap of {CAP}: {r.summary()}"
    assert r.sources.get("app", 0) > 0, r.summary()
    # Admitted fallbacks never waited behind the herd: at most CAP in the app at once.
    times = sorted(_app_times(stack.run_dir / "nginx" / "access.log"))
    assert times, "no fallback in the access log"
    p99 = times[int(0.99 * (len(times) - 1))]
    assert p99 < 1.0, f"app p99 {p99:.3f}s (median {statistics.median(times):.3f}s)"
