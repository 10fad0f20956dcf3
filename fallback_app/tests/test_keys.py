"""derive_key against the vectors shared with the C poll server."""

from __future__ import annotations

import json

import pytest

from fastpoll_app.keys import InvalidKey, derive_key

from .conftest import REPO_ROOT

VECTORS = json.loads((REPO_ROOT / "tests" / "vectors" / "keys.json").read_text(encoding="utf-8"))


@pytest.mark.parametrize("case", VECTORS["cases"], ids=lambda c: c["why"])
def test_vector(case: dict) -> None:
    prefix = case.get("prefix", VECTORS["prefix"]).encode()
    params = [p.encode() for p in case.get("params", VECTORS["params"])]
    target = case["target"].encode("utf-8")
    if case["key"] is None:
        with pytest.raises(InvalidKey):
            derive_key(prefix, target, params)
    else:
        assert derive_key(prefix, target, params) == case["key"].encode("utf-8")


def test_vectors_not_empty() -> None:
    assert len(VECTORS["cases"]) > 20
    assert any(c["key"] is None for c in VECTORS["cases"])
