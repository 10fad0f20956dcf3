"""Channels on the app side: the vectors shared with the poll server (tests/vectors/channels.json)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from fastpoll_app import channels, signing
from fastpoll_app.conditional import etag_of

from .conftest import REPO_ROOT

VECTORS: dict[str, Any] = json.loads(
    (REPO_ROOT / "tests" / "vectors" / "channels.json").read_text(encoding="utf-8")
)


def test_names() -> None:
    for c in VECTORS["names"]:
        assert channels.valid_name(c["name"].encode()) == c["valid"], c["why"]


@pytest.mark.parametrize("case", VECTORS["ch"], ids=lambda c: c["why"][:50])
def test_ch(case: dict[str, Any]) -> None:
    query = case["query"].encode()
    if "error" in case:
        with pytest.raises(channels.BadChannels) as exc:
            channels.parse_ch(query, case["max"])
        assert str(exc.value) == case["error"]
        return
    got = channels.parse_ch(query, case["max"])
    if case["ch"] is None:
        assert got is None and case["channels"] is None
    else:
        assert got == (case["ch"].encode(), [n.encode() for n in case["channels"]])


def test_keys_signatures_bodies_values() -> None:
    for c in VECTORS["keys"]:
        assert channels.channel_key(c["prefix"].encode(), c["name"].encode()).decode() == c["key"]
    for c in VECTORS["sign"]:
        ch = None if c["ch"] is None else c["ch"].encode()
        signed = channels.signed_key(c["key"].encode(), ch)
        assert c["exp"].encode() + b":" + signed == c["message"].encode()
        assert signing.sign(c["secret"].encode(), c["exp"].encode(), signed).decode() == c["sig"]
    for c in VECTORS["compose"]:
        parts = [(n.encode(), v.encode()) for n, v in c["channels"]]
        body = channels.compose(c["user"].encode(), parts)
        assert body.decode() == c["body"], c["why"]
        assert etag_of(body) == c["etag"]
    for c in VECTORS["values"]:
        msgs = [(i, t) for i, t in c["messages"]][-c["history"] :]
        assert channels.encode_channel(msgs).decode() == c["value"], c["why"]


def test_vectors_cover_refusals_and_acceptances() -> None:
    kinds = {("error" in c) for c in VECTORS["ch"]}
    assert kinds == {True, False}
    assert len({c["sig"] for c in VECTORS["sign"]}) == len(VECTORS["sign"])
