"""A message's data (docs/api.md, "Data"): any JSON value beside or instead of the text, listed
as it was published in every answer that lists the message (the poll answer, a room's, the
history read), on both databases and both caches; refused cleanly when over the bound or not
JSON; an answer without data stays the same bytes as before data existed."""

from __future__ import annotations

import json
from typing import Any

import pytest
from starlette.testclient import TestClient

from fastpoll_app import app, channels

URL = "/Poll/getMessages?user_id=42"
DATA = {"n": 7, "tags": ["a", "ü"], "ok": True, "none": None, "f": 1.5, "deep": [[{}]]}


def post(c: TestClient, path: str, body: dict[str, Any], **headers: str) -> dict[str, Any]:
    r = c.post(path, json=body, headers=headers)
    assert r.status_code == 201, r.text
    doc: dict[str, Any] = r.json()
    return doc


def test_data_round_trips_through_publish_the_answer_and_the_history_read(
    client: TestClient,
) -> None:
    both = post(client, "/api/messages", {"user_id": 42, "text": "hi", "data": DATA})
    only = post(client, "/api/messages", {"user_id": 42, "data": [1, "two"]})
    plain = post(client, "/api/messages", {"user_id": 42, "text": "plain"})
    assert both["data"] == DATA and both["text"] == "hi"
    assert only["data"] == [1, "two"] and only["text"] == ""
    assert "data" not in plain
    assert list(both) == ["id", "user_id", "text", "data", "created", "read"]
    assert list(plain) == ["id", "user_id", "text", "created", "read"]  # as before data
    listed = [
        {"id": both["id"], "text": "hi", "data": DATA},
        {"id": only["id"], "text": "", "data": [1, "two"]},
        {"id": plain["id"], "text": "plain"},
    ]
    answer = client.get(URL).json()
    assert answer["messages"] == listed and answer["newest"] == listed[-1]
    assert client.get(f"{URL}&after=0").json() == {"messages": listed, "more": False}
    # A falsy value is data too.
    values: list[object] = [0, "", False, [], {}]
    for value in values:
        msg = post(client, "/api/messages", {"user_id": 43, "data": value})
        assert msg["data"] == value
        answer = client.get("/Poll/getMessages?user_id=43").json()
        assert answer["newest"] == {"id": msg["id"], "text": "", "data": value}


def test_data_in_rooms_and_batches(client: TestClient) -> None:
    room = post(client, "/api/channels/room.d/messages", {"text": "r", "data": {"k": 1}})
    assert (room["channel"], room["text"], room["data"]) == ("room.d", "r", {"k": 1})
    ids = post(
        client,
        "/api/messages/batch",
        {
            "items": [
                {"user_id": 42, "data": {"b": 1}},
                {"channel": "room.d", "text": "t", "data": ["x"]},
                {"user_id": 42, "text": "no data"},
            ]
        },
    )["ids"]
    answer = client.get(f"{URL}&ch=room.d").json()
    assert answer["user"]["messages"] == [
        {"id": ids[0], "text": "", "data": {"b": 1}},
        {"id": ids[2], "text": "no data"},
    ]
    want = [
        {"id": room["id"], "text": "r", "data": {"k": 1}},
        {"id": ids[1], "text": "t", "data": ["x"]},
    ]
    assert answer["channels"]["room.d"]["messages"] == want
    assert client.get(f"{URL}&ch=room.d&after=0&of=room.d").json() == {
        "messages": want,
        "more": False,
    }


def test_text_only_answers_are_the_same_bytes(client: TestClient) -> None:
    a = post(client, "/api/messages", {"user_id": 42, "text": 'ä "q"'})["id"]
    b = post(client, "/api/messages", {"user_id": 42, "text": "b"})["id"]
    one = f'{{"id":{a},"text":"ä \\"q\\""}}'
    two = f'{{"id":{b},"text":"b"}}'
    want = f'{{"unread":2,"newest":{two},"messages":[{one},{two}]}}'
    assert client.get(URL).content == want.encode()
    assert (
        client.get(f"{URL}&after=0").content
        == f'{{"messages":[{one},{two}],"more":false}}'.encode()
    )


def test_data_is_listed_as_compact_json() -> None:
    assert channels.encode_channel([(1, "t", channels.encode_data({"a": [1, "é"]}))]) == (
        '{"messages":[{"id":1,"text":"t","data":{"a":[1,"é"]}}]}'.encode()
    )


def _refused(c: TestClient, path: str, body: bytes | dict[str, Any], says: str) -> None:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    r = c.post(path, content=content, headers={"Content-Type": "application/json"})
    assert r.status_code == 400, r.text
    assert says in r.json()["error"], r.text


@pytest.mark.parametrize(
    "body, says",
    [
        ({"user_id": 42, "data": "x" * app.MAX_DATA_BYTES}, f"over {app.MAX_DATA_BYTES}"),
        ({"user_id": 42, "text": "t", "data": ["é" * 4095]}, "data: "),
        ({"user_id": 42}, "text, data or both"),
        ({"user_id": 42, "data": None}, "text, data or both"),
        ({"user_id": 42, "text": "", "data": 1}, "text"),
        (b'{"user_id": 42, "data": NaN}', "data: "),
        (b'{"user_id": 42, "data": [Infinity]}', "data: "),
        (b'{"user_id": 42, "data": "\\ud800"}', "data: "),
        (b'{"user_id": 42, "data": ' + b"[" * 2000 + b"]" * 2000 + b"}", "nested too deeply"),
        (b'{"user_id": 42, "data": {"a": 1, "a": 2}}', "duplicate key"),
        (b'{"user_id": 42, "data": {1: 2}}', "JSON object"),
    ],
)
def test_bad_data_is_a_clean_400_and_stores_nothing(
    client: TestClient, body: bytes | dict[str, Any], says: str
) -> None:
    post(client, "/api/messages", {"user_id": 42, "text": "kept"})
    _refused(client, "/api/messages", body, says)
    rest = {k: v for k, v in body.items() if k != "user_id"} if isinstance(body, dict) else None
    if rest is not None:
        _refused(client, "/api/channels/room.e/messages", rest, says)
        _refused(client, "/api/messages/batch", {"items": [{"channel": "room.e", **rest}]}, says)
    assert [m["text"] for m in client.get(URL).json()["messages"]] == ["kept"]
    assert client.get(f"{URL}&ch=room.e").json()["channels"] == {"room.e": None}


def test_the_largest_data_is_taken() -> None:
    value = "x" * (app.MAX_DATA_BYTES - 2)
    assert app.PublishBody.model_validate({"user_id": 1, "data": value}).data == value


def test_a_replayed_key_with_other_data_is_a_conflict(client: TestClient) -> None:
    key = {"Idempotency-Key": "data-1"}
    first = post(client, "/api/messages", {"user_id": 42, "text": "t", "data": {"v": 1}}, **key)
    again = post(client, "/api/messages", {"user_id": 42, "text": "t", "data": {"v": 1}}, **key)
    assert again == first
    for other in ({"text": "t", "data": {"v": 2}}, {"text": "t"}, {"data": {"v": 1}}):
        r = client.post("/api/messages", json={"user_id": 42, **other}, headers=key)
        assert r.status_code == 409, r.text
    room = {"text": "r", "data": [1]}
    path = "/api/channels/room.f/messages"
    assert post(client, path, room, **key) == post(client, path, room, **key)
    r = client.post(path, json={"text": "r", "data": [2]}, headers=key)
    assert r.status_code == 409, r.text
    assert len(client.get(URL).json()["messages"]) == 1
