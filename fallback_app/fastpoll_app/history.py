"""The history read (docs/api.md, "The history read"): a signed poll URL plus `after=ID`
(optional `limit=N`, and `of=NAME` for one of the URL's channels) reads the messages after ID
from the database. nginx routes every request with `after` to the app (nginx/fastpoll.conf.j2,
map $fastpoll_history); the poll server never sees one.

The parameters are read as `ch` and `wait` are: the raw query split on `&`, a piece's name up
to its first `=` compared in any ASCII case and never percent-decoded (`%61fter=` is not
`after`: nginx's map reads the same raw name), a piece without `=` an occurrence with an empty
value. None of them is a keyed parameter ([keys] params refuses them), so the URL's signature
and key are those of the poll URL."""

from __future__ import annotations

import re
from dataclasses import dataclass

AFTER_PARAM = b"after"
LIMIT_PARAM = b"limit"
OF_PARAM = b"of"
PARAMS = ("after", "limit", "of")  # config refuses them as [keys] params
MAX_LIMIT = 100
MAX_ID = 2**63 - 1
_DIGITS = re.compile(rb"[0-9]{1,19}")
_LIMIT = re.compile(rb"[0-9]{1,3}")


class BadHistory(ValueError):
    """A history read's parameters are refused (400); the message names the problem."""


@dataclass(frozen=True)
class HistoryRead:
    after: int
    limit: int
    of: bytes | None  # one of the URL's channels; None: the user


def _values(query: bytes, name: bytes) -> list[bytes]:
    return [v for n, _, v in (p.partition(b"=") for p in query.split(b"&")) if n.lower() == name]


def is_history(query: bytes) -> bool:
    """Whether the request is a history read: a piece named `after` (nginx's rule)."""
    return bool(_values(query, AFTER_PARAM))


def parse(query: bytes, channels: list[bytes] | None) -> HistoryRead:
    """The history read's parameters; `channels` the URL's `ch` names (None without `ch`)."""
    after = _values(query, AFTER_PARAM)
    if len(after) != 1:
        raise BadHistory("after must be given once")
    if not _DIGITS.fullmatch(after[0]) or int(after[0]) > MAX_ID:
        raise BadHistory("after must be a message id: 1-19 decimal digits, at most 2^63-1")
    limit = _values(query, LIMIT_PARAM)
    if len(limit) > 1:
        raise BadHistory("limit must be given at most once")
    if limit and (not _LIMIT.fullmatch(limit[0]) or not 1 <= int(limit[0]) <= MAX_LIMIT):
        raise BadHistory(f"limit must be 1-{MAX_LIMIT}")
    of = _values(query, OF_PARAM)
    if len(of) > 1:
        raise BadHistory("of must be given at most once")
    if of and (channels is None or of[0] not in channels):
        raise BadHistory("of must name one of the channels of the URL's ch")
    return HistoryRead(int(after[0]), int(limit[0]) if limit else MAX_LIMIT, of[0] if of else None)
