"""The app's half of the one definition of `wait`: every case of the vectors
shared with nginx and the poll server (tests/vectors/wait.json) through conditional.wait_seconds.
"refuse" is BadWait, which the poll route answers 400."""

from __future__ import annotations

import json
from typing import Any

import pytest

from fastpoll_app import conditional
from fastpoll_app.config import PollSettings

from .conftest import REPO_ROOT

VECTORS: dict[str, Any] = json.loads(
    (REPO_ROOT / "tests" / "vectors" / "wait.json").read_text(encoding="utf-8")
)


@pytest.mark.parametrize("case", VECTORS["cases"], ids=lambda c: c["query"] or "(empty)")
def test_wait_vector(case: dict[str, Any]) -> None:
    settings = PollSettings(max_wait=VECTORS["max_wait"])
    query = case["query"].encode("utf-8")
    if case["expect"] == "refuse":
        with pytest.raises(conditional.BadWait):
            conditional.wait_seconds(query, settings)
    else:
        assert conditional.wait_seconds(query, settings) == case["expect"], case["why"]
