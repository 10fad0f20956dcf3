"""Cache key derivation, the Python twin of poll_server/src/keys.c.

The scheme is specified in docs/keys.md; tests/vectors/keys.json holds the
vectors both implementations are checked against.
"""

from __future__ import annotations

from collections.abc import Iterable

MAX_KEY_LENGTH = 250

_HEX = b"0123456789abcdefABCDEF"
_SAFE_VALUE = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")
_SAFE_PATH = _SAFE_VALUE | {ord("/")}


class InvalidKey(ValueError):
    """The request cannot be mapped to a cache key."""


def _decode(raw: bytes, plus_is_space: bool) -> bytes:
    out = bytearray()
    i = 0
    n = len(raw)
    while i < n:
        c = raw[i]
        if c == 0x25:  # '%'
            pair = raw[i + 1 : i + 3]
            if len(pair) != 2 or pair[0] not in _HEX or pair[1] not in _HEX:
                raise InvalidKey("malformed escape")
            out.append(int(pair, 16))
            i += 3
        elif c == 0x2B and plus_is_space:  # '+'
            out.append(0x20)
            i += 1
        else:
            out.append(c)
            i += 1
    return bytes(out)


def _has_ctl(b: bytes) -> bool:
    return any(c <= 0x20 or c == 0x7F for c in b)


def _encode(b: bytes, safe: frozenset[int]) -> bytes:
    return b"".join(bytes((c,)) if c in safe else b"%%%02X" % c for c in b)


def derive_key(prefix: bytes, target: bytes, params: Iterable[bytes]) -> bytes:
    """Return the cache key for a request-target, or raise InvalidKey."""
    keyed = set(params)
    if not target.startswith(b"/") or b"#" in target:
        raise InvalidKey("target must start with '/' and have no fragment")
    raw_path, _, raw_query = target.partition(b"?")

    path = _decode(raw_path, plus_is_space=False)
    if _has_ctl(path):
        raise InvalidKey("control character or space in path")
    if any(seg in (b".", b"..") for seg in path.split(b"/")):
        raise InvalidKey("dot segment in path")

    values: dict[bytes, bytes] = {}
    for piece in raw_query.split(b"&"):
        if not piece:
            continue
        raw_name, _, raw_value = piece.partition(b"=")
        try:
            name = _decode(raw_name, plus_is_space=True)
        except InvalidKey:
            continue
        if name not in keyed:
            continue
        if name in values:
            raise InvalidKey("repeated keyed parameter")
        value = _decode(raw_value, plus_is_space=True)
        if _has_ctl(value):
            raise InvalidKey("control character or space in a keyed value")
        values[name] = value

    key = prefix + _encode(path, _SAFE_PATH)
    if values:
        key += b"?" + b"&".join(
            name + b"=" + _encode(values[name], _SAFE_VALUE) for name in sorted(values)
        )
    if len(key) > MAX_KEY_LENGTH:
        raise InvalidKey("key longer than 250 bytes")
    return key
