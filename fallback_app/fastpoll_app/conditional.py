"""Conditional and long polls, the app's half (docs/api.md, "Conditional and long polls").

The ETag of a poll answer is XXH3-64 of its bytes, 16 lowercase hex digits, as a strong tag:
the poll server computes the same tag from the cached bytes (libxxhash), so an answer has one
tag whoever served it. If-None-Match is compared weakly (RFC 9110 8.8.3.2), because nginx's
gzip turns `"tag"` into `W/"tag"`; a header that is not a valid list of entity tags, or longer
than MAX_IF_NONE_MATCH, is ignored (the poll is answered in full).
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterable

import xxhash

from .config import WAIT_PARAM, PollSettings

# The whole If-None-Match (every line, joined with ", "). A client sends one tag (20 bytes);
# the bound lets the poll server parse it in a fixed buffer.
MAX_IF_NONE_MATCH = 1024
# RFC 9110: entity-tag = [ "W/" ] DQUOTE *etagc DQUOTE, etagc = %x21 / %x23-7E / obs-text.
_ETAG = re.compile(rb'\s*(?:W/)?"([\x21\x23-\x7e\x80-\xff]*)"\s*')
_WAIT = re.compile(rb"[0-9]{1,6}")


class BadWait(ValueError):
    """`wait` is repeated or not a decimal number of seconds."""


def etag_of(body: bytes) -> str:
    """The strong ETag header value of an answer: `"` + XXH3-64 hex + `"`."""
    return f'"{xxhash.xxh3_64_hexdigest(body)}"'


def _opaque_tags(value: bytes) -> list[bytes] | None:
    """The opaque tags of an If-None-Match list (W/ dropped); None if it is malformed."""
    tags: list[bytes] = []
    for item in value.split(b","):
        if not item.strip():
            continue  # RFC 9110 5.6.1: empty list elements are allowed and ignored
        m = _ETAG.fullmatch(item)
        if m is None:
            return None
        tags.append(m.group(1))
    return tags or None


def not_modified(lines: Iterable[bytes], etag: str) -> bool:
    """Does If-None-Match (its header lines, raw) match `etag`? Weak comparison; `*` matches
    any current answer (a poll always has one). Malformed or huge: False (ignored)."""
    value = b", ".join(lines)
    if not value or len(value) > MAX_IF_NONE_MATCH:
        return False
    if value.strip() == b"*":
        return True
    tags = _opaque_tags(value)
    return tags is not None and etag[1:-1].encode("ascii") in tags


def wait_seconds(query: bytes, settings: PollSettings) -> int:
    """The poll's `wait` in seconds, clamped to [poll] max_wait; 0 without one. BadWait (400)
    if it occurs more than once or its value is not 1-6 ASCII digits.

    One rule, the same in nginx, the poll server and the app (tests/vectors/wait.json): the
    query is split on `&`; a parameter is `wait` when its name, up to the first `=`, equals
    "wait" ASCII case-insensitively (`WAIT`, `Wait`); `wait` without `=` is an occurrence too
    (with an empty value). Name and value are read raw, never percent-decoded: `wait=%31` is
    not digits (400), `w%61it=1` is not `wait`. An ambiguous query (`wait=0&WAIT=30`) is
    refused rather than read one way here and another way elsewhere (docs/api.md, "`wait`:
    long polls")."""
    name = WAIT_PARAM.encode("ascii")
    values = [v for n, _, v in (p.partition(b"=") for p in query.split(b"&")) if n.lower() == name]
    if not values:
        return 0
    if len(values) > 1 or not _WAIT.fullmatch(values[0]):
        # The words of nginx's and the poll server's 400 for the same request.
        raise BadWait("wait must be given at most once, as 1-6 decimal digits")
    return min(int(values[0]), settings.max_wait)


def pace_ms(interval_ms: int, jitter_pct: int, rng: random.Random | None = None) -> int:
    """The Poll-Interval-Ms value: interval, plus a random 0..jitter_pct percent of it."""
    extra = interval_ms * jitter_pct // 100
    return interval_ms + (rng or random).randint(0, extra) if extra else interval_ms


def app_pace_ms(settings: PollSettings, filled: bool, wait_s: int) -> int:
    """The Poll-Interval-Ms of the app's answer (docs/api.md, "Poll-Interval-Ms").

    A miss the app has just filled (`filled`: its `add` stored the key, so the cache answers
    the next poll) is paced as the poll server paces a hit: `interval_ms`, or for a long poll
    (`wait` > 0) 0 plus the jitter of `interval_ms`, so that its next poll, with the tag, is held
    at once. Any other answer of the app (the cache down or slow, a poller down or hung, a fill
    that failed or was not tried) is stretched to `fallback_interval_ms`."""
    if not filled:
        return pace_ms(settings.fallback_interval_ms, settings.jitter_pct)
    hit = pace_ms(settings.interval_ms, settings.jitter_pct)
    return hit - settings.interval_ms if wait_s > 0 else hit
