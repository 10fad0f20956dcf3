"""The history read (docs/api.md, "The history read"): the poll URL plus after=ID, answered
from the database, against a temp database and a real cache."""

from __future__ import annotations

import dataclasses
import json

import pytest
from starlette.testclient import TestClient

from fastpoll_app import config, history
from fastpoll_app.app import create_app
from fastpoll_app.config import ConfigError

URL = "/Poll/getMessages?user_id=42"


def publish(c: TestClient, texts: str) -> list[int]:
    return [c.post("/api/messages", json={"user_id": 42, "text": t}).json()["id"] for t in texts]


def read(c: TestClient, query: str) -> dict[str, object]:
    r = c.get(f"{URL}&{query}")
    assert r.status_code == 200, r.text
    assert r.headers["cache-control"] == "no-store"
    assert r.headers["content-type"] == "application/json"
    assert "etag" not in r.headers and "x-poll-source" not in r.headers
    doc: dict[str, object] = json.loads(r.content)
    return doc


def test_the_messages_after_an_id_ascending_with_more(client: TestClient) -> None:
    ids = publish(client, "abcd")
    every = [{"id": i, "text": t} for i, t in zip(ids, "abcd", strict=True)]
    assert read(client, "after=0") == {"messages": every, "more": False}
    assert read(client, f"after={ids[0]}") == {"messages": every[1:], "more": False}
    assert read(client, f"after={ids[0]}&limit=2") == {"messages": every[1:3], "more": True}
    assert read(client, f"AFTER={ids[2]}&Limit=2") == {"messages": every[3:], "more": False}
    assert read(client, f"after={ids[3]}") == {"messages": [], "more": False}
    # Unread only, as the answer: what the user marked read is not a gap.
    client.post("/api/messages/read", json={"user_id": 42, "up_to_id": ids[1]})
    assert read(client, "after=0") == {"messages": every[2:], "more": False}
    # A cache-buster and wait= change nothing; nothing is cached for the read.
    assert read(client, "after=0&_=1&wait=5") == {"messages": every[2:], "more": False}
    h = client.head(f"{URL}&after=0")
    assert h.status_code == 200 and h.content == b"" and int(h.headers["content-length"]) > 0


@pytest.mark.parametrize(
    "query",
    [
        "after=",
        "after",
        "after=x",
        "after=-1",
        "after=1.0",
        "after=9223372036854775808",
        "after=%31",
        "after=1&after=2",
        "after=1&AFTER=2",
        "after=1&limit=0",
        "after=1&limit=101",
        "after=1&limit=",
        "after=1&limit=1&limit=2",
        "after=1&of=room.a",
    ],
)
def test_bad_parameters_are_a_well_formed_400(client: TestClient, query: str) -> None:
    r = client.get(f"{URL}&{query}")
    assert r.status_code == 400, (query, r.text)
    assert isinstance(r.json()["error"], str) and r.json()["error"]


def test_a_channel_of_the_urls_ch(settings: config.Settings) -> None:
    """`of` names one of the URL's channels (its signature covers them all); without `of` the
    read is the user's; a channel not in `ch` is refused."""
    s = dataclasses.replace(settings, channels=config.ChannelSettings(max=4, history=2))
    with TestClient(create_app(s)) as c:
        rid = [
            c.post("/api/channels/room.a/messages", json={"text": t}).json()["id"] for t in "xyz"
        ]
        mine = publish(c, "m")
        url = f"{URL}&ch=room.a,room.b"
        # The room's answer lists two, "before" the first; the read gives the one left out.
        room = json.loads(c.get(url).content)["channels"]["room.a"]
        assert [m["id"] for m in room["messages"]] == rid[1:] and room["before"] == rid[0]
        r = c.get(f"{url}&after=0&of=room.a&limit=1")
        assert r.json() == {"messages": [{"id": rid[0], "text": "x"}], "more": True}
        assert c.get(f"{url}&after=0").json() == {
            "messages": [{"id": mine[0], "text": "m"}],
            "more": False,
        }
        assert c.get(f"{url}&after=0&of=room.b").json() == {"messages": [], "more": False}
        assert c.get(f"{url}&after=0&of=room.c").status_code == 400


def test_the_history_parameters_cannot_be_keyed() -> None:
    for name in ("after", "Limit", "OF"):
        with pytest.raises(ConfigError, match="reserved for the history read"):
            config.parse(f"[keys]\nparams = user_id {name}\n")
    assert history.is_history(b"user_id=1&after=3") and history.is_history(b"After")
    assert not history.is_history(b"user_id=1&%61fter=3") and not history.is_history(b"afters=1")
