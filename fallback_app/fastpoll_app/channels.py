"""Channels (docs/channels.md): the `ch` parameter, channel keys, the signed message and the
composed answer. The poll server implements the same rules; tests/vectors/channels.json holds
the vectors both are checked against.

A poll URL may name channels besides the user's key: `ch=room.a,room.b`. The poll answer is
then `{"user":U,"channels":{"room.a":A,"room.b":B}}`, each part's cached bytes as they are, or
`null` for an empty part; its ETag is the same function of the composed body as a single
answer's."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence

from .config import CH_PARAM
from .keys import InvalidKey, _decode

_CH = CH_PARAM.encode("ascii")
NAME_RULE = "a channel name is 1-64 bytes of A-Z a-z 0-9 _ . -"
_NAME = re.compile(rb"[A-Za-z0-9_.-]{1,64}")


class BadChannels(ValueError):
    """The `ch` parameter is refused (400); the message names the problem."""


def valid_name(name: bytes) -> bool:
    return _NAME.fullmatch(name) is not None


def parse_ch(query: bytes, max_channels: int) -> tuple[bytes, list[bytes]] | None:
    """(ch value as decoded, channel names) of a raw query, None without `ch`.

    A piece is `ch` when its name up to the first `=`, raw (never decoded), is "ch" in any
    ASCII case; `ch` without `=` is an occurrence with an empty value. The value is decoded
    as a keyed value (docs/keys.md: %XX, '+' is a space) and split on ','."""
    values = [v for n, _, v in (p.partition(b"=") for p in query.split(b"&")) if n.lower() == _CH]
    if not values:
        return None
    if len(values) > 1:
        raise BadChannels("ch given more than once")
    try:
        value = _decode(values[0], plus_is_space=True)
    except InvalidKey:
        raise BadChannels("ch has a malformed %-escape") from None
    if not value:
        raise BadChannels("ch is empty")
    names = value.split(b",")
    if len(names) > max_channels:
        raise BadChannels(f"ch names more than {max_channels} channels")
    prev = b""
    for name in names:
        if not name:
            raise BadChannels("ch has an empty channel name")
        if not valid_name(name):
            raise BadChannels(NAME_RULE)
        if name <= prev:
            raise BadChannels("ch must list channels in strictly ascending byte order, each once")
        prev = name
    return value, names


def channel_key(prefix: bytes, name: bytes) -> bytes:
    """The cache key of a channel's answer: prefix + '#' + name."""
    return prefix + b"#" + name


def signed_key(key: bytes, ch_value: bytes | None) -> bytes:
    """What a signature covers after `exp:`: the user's key, and with channels ' ' + ch."""
    return key if ch_value is None else key + b" " + ch_value


def compose(user: bytes, parts: Sequence[tuple[bytes, bytes]]) -> bytes:
    """The composed answer: each part's bytes as they are, `null` for an empty part."""
    out = [b'{"user":', user or b"null", b',"channels":{']
    for i, (name, value) in enumerate(parts):
        out.append(b'%s"%s":%s' % (b"," if i else b"", name, value or b"null"))
    out.append(b"}}")
    return b"".join(out)


# A listed message: (id, text) or (id, text, data), data its compact JSON encoding or None.
Listed = tuple[int, str] | tuple[int, str, str | None]


def encode_data(value: object) -> str:
    """A message's data as it is stored and listed: compact JSON, UTF-8 as is (ValueError:
    NaN or infinity, a lone surrogate; RecursionError: nested too deeply)."""
    encoded = json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    encoded.encode("utf-8")  # UnicodeEncodeError (a ValueError): a lone surrogate
    return encoded


def message_doc(message: Listed) -> dict[str, object]:
    """A listed message in an answer: {"id":N,"text":"..."}, and "data" only when it has
    data, so that an answer without data is the same bytes as before data existed."""
    doc: dict[str, object] = {"id": message[0], "text": message[1]}
    if len(message) > 2 and message[2] is not None:
        doc["data"] = json.loads(message[2])
    return doc


def encode_channel(messages: Sequence[Listed], before: int | None = None) -> bytes:
    """A channel's cached value: its newest messages, ascending id, and `before`, the id of
    the message before the oldest listed (None: there is none); empty without messages."""
    if not messages:
        return b""
    doc: dict[str, object] = {"messages": [message_doc(m) for m in messages]}
    if before is not None:
        doc["before"] = before
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
