"""The write side's cost (docs/channels.md, "Batched writes"): publishes/s and CPU per message,
single publishes (POST /api/messages) against batches of 100 (POST /api/messages/batch), on
SQLite and PostgreSQL, through `python -m fastpoll_app` (1 worker) with one memcached. One
client sends one request at a time for SECONDS per case; each message goes to its own user (the
worst case: a key per message). CPU is read from /proc for the app's process and for PostgreSQL's
(every process of its cluster), before and after. Not a test (timing on a shared box):

    cd fallback_app && ../.venv/bin/python -m tests.batch_publish_bench [SECONDS]
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import httpx

from .conftest import app_process, postgres, start_memcached

BATCH = 100
_TICK = os.sysconf("SC_CLK_TCK")


def _cpu_by_name() -> dict[str, float]:
    """CPU seconds (user + system) of this process's descendants, summed by command name."""
    kids: dict[int, list[int]] = {}
    stats: dict[int, tuple[str, float]] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            raw = Path(f"/proc/{d}/stat").read_text()
        except OSError:
            continue
        name = raw[raw.index("(") + 1 : raw.rindex(")")]
        f = raw[raw.rindex(")") + 2 :].split()
        kids.setdefault(int(f[1]), []).append(int(d))
        stats[int(d)] = (name, (int(f[11]) + int(f[12])) / _TICK)
    out: dict[str, float] = {}
    todo = list(kids.get(os.getpid(), []))
    while todo:
        pid = todo.pop()
        todo += kids.get(pid, [])
        name, cpu = stats[pid]
        kind = "postgres" if name.startswith("postgres") else name
        out[kind] = out.get(kind, 0.0) + cpu
    return out


def _run(base: str, seconds: float, batch: int) -> tuple[int, float, dict[str, float]]:
    """(messages, wall seconds, CPU seconds by process name)."""
    n = 0
    uid = 1_000_000
    with httpx.Client(base_url=base, timeout=60) as c:
        c.post("/api/messages", json={"user_id": 1, "text": "warm"})
        before, start = _cpu_by_name(), time.perf_counter()
        for _ in range(10_000_000):  # bounded; ends after `seconds`
            if time.perf_counter() - start > seconds:
                break
            if batch == 1:
                r = c.post("/api/messages", json={"user_id": uid, "text": f"m{uid}"})
            else:
                items = [{"user_id": uid + i, "text": f"m{uid + i}"} for i in range(batch)]
                r = c.post("/api/messages/batch", json={"items": items})
            if r.status_code != 201:
                raise RuntimeError(r.text)
            n += batch
            uid += batch
        wall, after = time.perf_counter() - start, _cpu_by_name()
    return n, wall, {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}


@contextmanager
def _database(kind: str, tmp: Path) -> Iterator[str]:
    if kind == "sqlite":
        yield f"database = {tmp / 'db'}\n"
    else:
        with postgres(tmp) as srv:
            yield srv.app_lines


def main(seconds: float) -> list[str]:
    lines = []
    for kind in ("sqlite", "postgresql"):
        for batch in (1, BATCH):
            tmp = Path(tempfile.mkdtemp(prefix="fastpoll-batch-"))
            with ExitStack() as stack:
                mc = start_memcached()
                stack.callback(mc.stop)
                app_lines = stack.enter_context(_database(kind, tmp))
                ini = tmp / "f.ini"
                ini.write_text(
                    f"[memcached]\nservers = {mc.addr}\n[app]\n{app_lines}open_api = true\n"
                )
                base = stack.enter_context(app_process(ini, workers=1))
                n, wall, cpu = _run(base, seconds, batch)
            app, db = cpu.get("python", 0.0), cpu.get("postgres", 0.0)
            lines.append(
                f"{kind:10} batch {batch:3}: {n / wall:7.0f} messages/s, CPU per message: "
                f"app {app / n * 1000:.3f} ms + database {db / n * 1000:.3f} ms = "
                f"{(app + db) / n * 1000:.3f} ms ({n} messages in {wall:.1f} s)"
            )
            print(lines[-1], flush=True)
    return lines


if __name__ == "__main__":
    main(float(sys.argv[1]) if len(sys.argv) > 1 else 10.0)
