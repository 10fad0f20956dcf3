"""Publish latency on SQLite under concurrency (docs/api.md, the durability paragraph): CLIENTS
clients publish at once, each to its own user, through `python -m fastpoll_app` (2 workers) with
one memcached, for SECONDS; prints p50/p90/p99/max. Not a test (timing on a shared box):

    cd fallback_app && ../.venv/bin/python -m tests.sqlite_publish_latency [SECONDS] [CLIENTS]
"""

from __future__ import annotations

import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

from fastpoll_testkit.procs import start_memcached

from .conftest import app_process


def main(seconds: float, clients: int) -> str:
    tmp = Path(tempfile.mkdtemp(prefix="fastpoll-p99-"))
    mc = start_memcached()
    ini = tmp / "f.ini"
    ini.write_text(
        f"[memcached]\nservers = {mc.addr}\n[app]\ndatabase = {tmp / 'db'}\nopen_api = true\n"
    )
    took: list[float] = []
    lock = threading.Lock()
    try:
        with app_process(ini, workers=2) as base:
            end = time.monotonic() + seconds

            def run(uid: int) -> None:
                with httpx.Client(base_url=base, timeout=30) as c:
                    for i in range(1_000_000):  # bounded; ends after `seconds`
                        if time.monotonic() > end:
                            return
                        start = time.perf_counter()
                        r = c.post("/api/messages", json={"user_id": uid, "text": f"m{i}"})
                        elapsed = time.perf_counter() - start
                        if r.status_code != 201:
                            raise RuntimeError(r.text)
                        with lock:
                            took.append(elapsed)

            threads = [threading.Thread(target=run, args=(1000 + k,)) for k in range(clients)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
    finally:
        mc.stop()
    took.sort()

    def ms(q: float) -> float:
        return took[min(len(took) - 1, int(q * len(took)))] * 1000

    return (
        f"{len(took)} publishes in {seconds:g} s ({len(took) / seconds:.0f}/s), {clients} "
        f"clients: p50 {ms(0.5):.0f} ms, p90 {ms(0.9):.0f} ms, p99 {ms(0.99):.0f} ms, "
        f"max {took[-1] * 1000:.0f} ms"
    )


if __name__ == "__main__":
    secs = float(sys.argv[1]) if len(sys.argv) > 1 else 8.0
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 20
    print(main(secs, n))
