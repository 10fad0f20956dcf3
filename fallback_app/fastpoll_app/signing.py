"""Signed, expiring poll URLs: the Python twin of poll_server/src/sign.c.

A poll URL carries ``exp=<unix seconds>&sig=<base64url(HMAC-SHA256(secret, "<exp>:<key>"))>``
where ``key`` is the cache key the request derives (docs/keys.md). The poll server checks it
before the cache sees the request; this module checks it on the fallback path and signs the URLs
the app hands out. ``exp`` and ``sig`` are not keyed parameters, so they never enter the key.
docs/security.md explains the choice; tests/vectors/signing.json holds the shared vectors.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import stat
from collections.abc import Sequence
from pathlib import Path

EXP_PARAM = b"exp"
SIG_PARAM = b"sig"
SIG_LENGTH = 43  # base64url of 32 bytes, no padding
MAX_EXP_DIGITS = 19
MAX_SECRETS = 4
SECRET_MIN = 32
SECRET_MAX = 1024
RESERVED_PARAMS = frozenset({"exp", "sig"})


class SecretFileError(ValueError):
    """The secret file is missing, too open, or malformed; the message never shows a secret."""


def sign(secret: bytes, exp: bytes, key: bytes) -> bytes:
    """The signature of ``key`` until ``exp`` (decimal text) under ``secret``."""
    digest = hmac.new(secret, exp + b":" + key, hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=")


def signed_query(secret: bytes, key: bytes, exp: int) -> bytes:
    """``exp=...&sig=...`` to append to a poll URL whose key is ``key``."""
    e = b"%d" % exp
    return b"exp=" + e + b"&sig=" + sign(secret, e, key)


def _raw_params(query: bytes) -> tuple[bytes | None, bytes | None] | None:
    """The raw exp and sig values; None if either is repeated. Raw names, no decoding."""
    exp: bytes | None = None
    sig: bytes | None = None
    for piece in query.split(b"&"):
        if piece.startswith(b"exp="):
            if exp is not None:
                return None
            exp = piece[4:]
        elif piece.startswith(b"sig="):
            if sig is not None:
                return None
            sig = piece[4:]
    return exp, sig


def verify(secrets: Sequence[bytes], key: bytes | None, query: bytes, now: float) -> bool:
    """True if ``query`` carries one exp and one sig, exp is later than ``now`` and sig
    signs ``key`` under one of ``secrets``. A request without a key cannot be signed."""
    if key is None or not secrets:
        return False
    params = _raw_params(query)
    if params is None:
        return False
    exp, sig = params
    if exp is None or sig is None or len(sig) != SIG_LENGTH:
        return False
    if not (1 <= len(exp) <= MAX_EXP_DIGITS and exp.isdigit() and exp.isascii()):
        return False
    if int(exp) <= int(now):
        return False
    ok = False
    for secret in secrets:  # every one, so the time does not tell which matched
        ok |= hmac.compare_digest(sign(secret, exp, key), sig)
    return ok


def read_private_file(path: str | os.PathLike[str], limit: int) -> bytes:
    """The bytes of a secret file: a regular file that others cannot read and the group cannot
    write (0600 or 0640), at most `limit` bytes. Used for every secret the app reads."""
    try:
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode):
                raise SecretFileError(f"{path}: not a regular file")
            if st.st_mode & (stat.S_IWGRP | stat.S_IRWXO):
                mode = stat.S_IMODE(st.st_mode)
                raise SecretFileError(
                    f"{path}: mode {mode:04o}: must not be readable by others nor writable "
                    "by the group (use 0600 or 0640)"
                )
            data = f.read(limit + 1)
            if len(data) > limit:
                raise SecretFileError(f"{path}: larger than {limit} bytes")
    except OSError as exc:
        raise SecretFileError(f"{path}: cannot read: {exc.strerror}") from None
    return data


def load_secrets(path: str | os.PathLike[str]) -> list[bytes]:
    """Every non-empty line of the file is a secret; the first signs, all verify.

    The file must be a regular file that others cannot read and the group cannot write
    (0600 or 0640), as the poll server requires.
    """
    data = read_private_file(path, MAX_SECRETS * (SECRET_MAX + 2) + 64)
    secrets: list[bytes] = []
    for lineno, line in enumerate(data.split(b"\n"), start=1):
        line = line.removesuffix(b"\r")
        if not line:
            continue
        if not SECRET_MIN <= len(line) <= SECRET_MAX:
            raise SecretFileError(
                f"{path}: line {lineno}: a secret is {SECRET_MIN}..{SECRET_MAX} bytes"
            )
        if any(not 0x21 <= c <= 0x7E for c in line):
            raise SecretFileError(
                f"{path}: line {lineno}: only printable ASCII without spaces "
                "(e.g. openssl rand -hex 32)"
            )
        if len(secrets) == MAX_SECRETS:
            raise SecretFileError(f"{path}: more than {MAX_SECRETS} secrets")
        secrets.append(line)
    if not secrets:
        raise SecretFileError(f"{path}: no secret in the file")
    return secrets


def write_secret_file(path: Path) -> None:
    """A new random secret in a 0600 file (created with that mode, never wider)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, os.urandom(32).hex().encode() + b"\n")
    finally:
        os.close(fd)
