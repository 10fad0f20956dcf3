"""The write API's OpenAPI document on a real stack (docs/api.md, "OpenAPI document"): served on
the app's own listener, never by nginx's public server; and the app answers what it documents,
checked by schemathesis (generated requests, valid and invalid, against the running app)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from fastpoll_testkit.stack import Stack

# positive_data_acceptance is off: JSON Schema counts 42.0 as an integer and the app refuses it
# (strict: docs/api.md), and no pattern can refuse a lone surrogate in `text`, which the app
# refuses too. A body over [app] max_body_size is 413 before its fields are read.
CONFIG = """\
[checks.positive_data_acceptance]
enabled = false
[checks.negative_data_rejection]
expected-statuses = [400, 401, 404, 409, 413, 415]
"""


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    s = Stack(
        run_dir=tmp_path_factory.mktemp("openapi-stack"), n_pollers=1, app_workers=1, announce=False
    )
    s.start()
    yield s
    s.stop()


def test_served_by_the_app_not_by_the_edge(stack: Stack) -> None:
    r = httpx.get(stack.app_url() + "/openapi.json", timeout=10)
    assert r.status_code == 200 and r.json()["openapi"] == "3.1.0"
    assert set(r.json()["paths"]) >= {"/api/messages", "/api/poll-url"}
    for path in ("/openapi.json", "/openapi.json?x=1", "/api/messages"):
        edge = httpx.get(stack.base_url + path, timeout=10)
        assert edge.status_code == 404, (path, edge.text)
        assert "openapi" not in edge.text


def test_the_app_answers_as_documented(stack: Stack, tmp_path: Path) -> None:
    """Every operation, 30 generated requests each (seeded: a failure replays): no 5xx, every
    status, content type, header and body as the document says, invalid input refused."""
    config = tmp_path / "schemathesis.toml"
    config.write_text(CONFIG)
    st = Path(sys.executable).parent / "st"
    run = subprocess.run(
        [str(st), "--config-file", str(config), "run", stack.app_url() + "/openapi.json",
         "-H", f"Authorization: Bearer {stack.api_token}", "--max-examples", "30",
         "--seed", "20240601", "--workers", "1", "--checks", "all",
         "--exclude-checks", "positive_data_acceptance", "--report-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]
    assert "5 passed" in run.stdout, run.stdout[-3000:]
