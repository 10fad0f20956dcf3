"""The app's /metrics: in one process (TestClient), and summed over uvicorn workers."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families
from starlette.testclient import TestClient

from fastpoll_testkit.procs import Server, free_port


def samples(text: str) -> dict[tuple[str, tuple], float]:
    out: dict[tuple[str, tuple], float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def moved(before: dict, after: dict, name: str) -> dict[tuple, float]:
    return {
        labels: v - before.get((n, labels), 0)
        for (n, labels), v in after.items()
        if n == name and v != before.get((n, labels), 0)
    }


def test_fill_publish_and_requests_are_counted(client: TestClient) -> None:
    before = samples(client.get("/metrics").text)
    assert client.get("/Poll/getMessages?user_id=5").status_code == 200  # fills: stored
    assert client.get("/Poll/getMessages?user_id=5").status_code == 200  # fills: exists
    assert client.get("/Poll/getMessages?user_id=5&user_id=6").status_code == 400
    r = client.post("/api/messages", json={"user_id": 5, "text": "hi"})
    assert r.status_code == 201
    page = client.get("/metrics")
    assert page.headers["content-type"].startswith("text/plain")
    after = samples(page.text)

    assert moved(before, after, "fastpoll_app_cache_fills_total") == {
        (("result", "stored"),): 1,
        (("result", "exists"),): 1,
    }
    assert moved(before, after, "fastpoll_app_publishes_total") == {(("result", "written"),): 1}
    reqs = moved(before, after, "fastpoll_app_requests_total")
    assert reqs[(("method", "GET"), ("route", "poll"), ("status", "200"))] == 2
    assert reqs[(("method", "GET"), ("route", "poll"), ("status", "400"))] == 1
    assert reqs[(("method", "POST"), ("route", "publish"), ("status", "201"))] == 1
    assert reqs[(("method", "GET"), ("route", "metrics"), ("status", "200"))] == 1
    hist = moved(before, after, "fastpoll_app_request_duration_seconds_count")
    assert hist[(("route", "poll"),)] == 3
    assert moved(before, after, "fastpoll_app_cache_seconds_count") == {
        (("op", "fill"),): 2,
        (("op", "publish"),): 1,
    }
    db = moved(before, after, "fastpoll_app_db_seconds_count")
    assert db[(("op", "read"),)] >= 2 and db[(("op", "commit"),)] >= 1


def test_unknown_paths_share_one_route_label(client: TestClient) -> None:
    for i in range(3):
        client.get(f"/scan/{i}")
    after = samples(client.get("/metrics").text)
    routes = {dict(k[1]).get("route") for k in after if k[0] == "fastpoll_app_requests_total"}
    assert "other" in routes and not any(r.startswith("/") for r in routes if r)


def test_workers_share_their_counts(memcached: Server, tmp_path: Path) -> None:
    """uvicorn --workers 2 through the CLI: /metrics, whichever worker answers it, counts the
    requests of both, and the directory the CLI made for them is gone after it exits."""
    ini = tmp_path / "f.ini"
    ini.write_text(
        f"[app]\ndatabase = {tmp_path / 'db'}\nopen_api = true\n"
        f"[memcached]\nservers = {memcached.addr}\n"
    )
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"}
    env["TMPDIR"] = str(tmp_path)
    argv = [sys.executable, "-m", "fastpoll_app", "-c", str(ini), "--port", str(port)]
    app_dir = Path(__file__).resolve().parents[1]  # this checkout's fastpoll_app
    healthz = f"http://127.0.0.1:{port}/healthz"
    app = Server(
        "the app", [*argv, "--workers", "2"], port, env=env, cwd=app_dir, timeout=60,
        stop_timeout=30, ready=lambda: httpx.get(healthz).status_code == 200,
    )  # fmt: skip
    try:
        app.start()
        n = 40
        for i in range(n):  # a new connection each time: both workers get some
            assert httpx.get(f"http://127.0.0.1:{port}/Poll/getMessages?user_id={i}").is_success
        pages = [httpx.get(f"http://127.0.0.1:{port}/metrics").text for _ in range(6)]
        for page in pages:
            s = samples(page)
            polls = s[("fastpoll_app_requests_total", (("method", "GET"), ("route", "poll"),
                                                        ("status", "200")))]  # fmt: skip
            assert polls == n
            assert s[("fastpoll_app_cache_fills_total", (("result", "stored"),))] == n
        assert list(tmp_path.glob("fastpoll-app-metrics-*"))
    finally:
        app.stop()
    assert not list(tmp_path.glob("fastpoll-app-metrics-*"))


def test_a_stuck_outbox_row_shows_its_age(tmp_path: Path) -> None:
    """fastpoll_app_repair_stuck_seconds: the age of a row whose repairs keep failing (the cache
    stopped under a publish), back to 0 once a repair writes it."""
    from fastpoll_app.app import create_app
    from fastpoll_testkit.procs import start_memcached

    from .conftest import make_settings

    srv = start_memcached()
    try:
        s = make_settings(tmp_path, f"[memcached]\nservers = {srv.addr}\n")
        with TestClient(create_app(s)) as c:

            def stuck() -> float:
                return samples(c.get("/metrics").text)[("fastpoll_app_repair_stuck_seconds", ())]

            assert stuck() == 0
            srv.stop()
            r = c.post("/api/messages", json={"user_id": 77, "text": "while down"})
            assert r.headers["x-cache-publish"] == "pending"
            end = time.monotonic() + 20
            while stuck() < 1.5:  # claimed after the outbox's grace, then failing each second
                assert time.monotonic() < end, "the stuck row's age never showed"
                time.sleep(0.2)
            first = stuck()
            time.sleep(1.5)
            assert stuck() > first  # it grows while the row stays stuck
            srv.start()
            while stuck() != 0:
                assert time.monotonic() < end + 10, "the age stayed after the repair"
                time.sleep(0.2)
    finally:
        srv.stop()
