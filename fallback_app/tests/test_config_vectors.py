"""The app's INI reader against the config vectors shared with the poll server
(tests/vectors/config.json; poll_server/tests/test_config_vectors.c runs the same cases)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from fastpoll_app import config

from .conftest import REPO_ROOT

VECTORS: dict[str, Any] = json.loads(
    (REPO_ROOT / "tests" / "vectors" / "config.json").read_text(encoding="utf-8")
)
SIDES = ("both", "c-only", "app-only")


def _write_case(tmp_path: Path, case: dict[str, Any]) -> Path:
    for name, spec in VECTORS["files"].items():
        p = tmp_path / name
        p.write_bytes(spec["text"].encode("utf-8"))
        os.chmod(p, int(spec["mode"], 8))
    ini = tmp_path / "fastpoll.ini"
    ini.write_bytes(case["ini"].replace("{dir}", str(tmp_path)).encode("utf-8"))
    return ini


@pytest.mark.parametrize("case", VECTORS["cases"], ids=lambda c: c["why"][:60])
def test_vector(case: dict[str, Any], tmp_path: Path) -> None:
    assert case["sides"] in SIDES
    ini = _write_case(tmp_path, case)
    # c-only: a section or rule of the poll server's alone, which the app must accept.
    if case["expect"] == "accept" or case["sides"] == "c-only":
        config.load(ini)
        return
    with pytest.raises(config.ConfigError) as exc:
        config.load(ini)
    msg = str(exc.value)
    assert f"{ini}:{case['line']}:" in msg
    if case["key"] is not None:
        assert case["key"] in msg


def test_vectors_cover_both_outcomes_and_sides() -> None:
    cases = VECTORS["cases"]
    assert len(cases) > 40
    assert {c["sides"] for c in cases} == set(SIDES)
    assert {c["expect"] for c in cases} == {"accept", "refuse"}
    assert all(c["expect"] == "refuse" for c in cases if c["sides"] != "both")
