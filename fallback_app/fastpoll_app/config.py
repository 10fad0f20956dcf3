"""Read the app's settings from the shared INI file (docs/configuration.md).

The file is also read by the poll server with libinih, so the reader follows
the dialect both understand: `[section]`, `key = value` (or `key: value`),
whole-line comments starting with `;` or `#`, inline comments that start with
`;` or `#` after whitespace. A small line reader is used instead of
configparser's because errors must name the line, and `[memcached] servers`
may be repeated to append (configparser can do neither). Both readers run the cases of
tests/vectors/config.json (fallback_app/tests/test_config_vectors.py).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from . import history, signing

CONFIG_ENV = "FASTPOLL_CONFIG"

# memcached reads an exptime above 30 days as a Unix timestamp.
MAX_TTL = 30 * 24 * 3600
MAX_PREFIX = 64
# Debian's libinih reads lines into a 200-byte buffer (newline and NUL
# included): a longer line is an error for the poll server, so for us too.
MAX_LINE = 198
# The poll server's FP_MAX_PARAMS, FP_MAX_SERVERS and FP_MAX_SENTINELS (poll_server/src/settings.h).
MAX_PARAMS = 16
MAX_SERVERS = 64
MAX_SENTINELS = 8
# The poll server's bounds: a Sentinel master name, a unix socket path (sizeof(sun_path) - 1),
# a password (the first line of its file).
MAX_MASTER_NAME = 128
MAX_UNIX_PATH = 107
MAX_PASSWORD = 1024
API_TOKEN_MIN = 16
API_TOKEN_MAX = 1024
# The long-poll parameter (docs/api.md): never a keyed parameter, never signed.
WAIT_PARAM = "wait"
# The channels' parameter (docs/channels.md): never a keyed parameter.
CH_PARAM = "ch"
MAX_CHANNELS = 255
MAX_HISTORY = 1000
# A room's answer must fit one cache item (docs/channels.md, "A room's size"). memcached's
# default item size (-I) is 1 MiB, and the poll server reads no value over 1 MiB on either
# backend (a larger one is a failed read: the poll falls back), so the bound is 1 MiB at most.
ITEM_MAX_BYTES = 1024 * 1024
ITEM_MIN_BYTES = 1024
# memcached's own bytes in an item besides the value: the item header (48 bytes on 64-bit), the
# CAS unique (8), the key (a channel's: at most 64 + 1 + 64 bytes) and its NUL, the flags, the
# value's CRLF; rounded up.
ITEM_OVERHEAD = 512
# The longest text of a message the API takes, in characters (app.py), and the most bytes one
# character takes in a room's JSON answer (written with ensure_ascii=False: a control character
# is \u0001, 6 bytes; any other character 4 bytes of UTF-8 at most).
MAX_TEXT_CHARS = 2000
MAX_CHAR_BYTES = 6
# The most bytes a message's data (any JSON value) takes as compact JSON (app.py), which is how
# an answer lists it: `,"data":` and these bytes.
MAX_DATA_BYTES = 8192
_MAX_ID_DIGITS = len(str(2**63 - 1))  # message ids are 64-bit
MAX_WAIT = 300
MAX_INTERVAL_MS = 3600 * 1000

_IGNORED_SECTIONS = frozenset({"server", "stream", "admin", "log"})
# Keys the app reads in a section it otherwise leaves to the poll server: its own log's format.
_READ_IN_IGNORED = {("log", "format")}
_PARAM_RE = re.compile(r"[A-Za-z0-9_.-]{1,64}")
_HOST_RE = re.compile(r"[A-Za-z0-9.-]+")
# libinih's whitespace (isspace in the C locale); list items are separated as config.c is_sep does.
_WS = " \t\n\v\f\r"
_SPLIT_RE = re.compile(r"[ \t,]+")
_INLINE_COMMENT_RE = re.compile(r"\s[;#]", re.ASCII)
_KEY_VALUE_RE = re.compile(r"([^=:]+?)\s*[=:](.*)", re.ASCII)


class ConfigError(ValueError):
    """A bad config file; the message names the file, line and key."""


@dataclass(frozen=True)
class KeySettings:
    prefix: bytes = b"/Poll"
    params: tuple[bytes, ...] = (b"user_id",)


@dataclass(frozen=True)
class CacheSettings:
    backend: str = "memcached"
    timeout_ms: int = 100
    content_type: str = "application/json"
    ttl: int = 300
    # The largest value the cache stores (memcached -I): a room's answer must fit.
    item_max_bytes: int = ITEM_MAX_BYTES


# [memcached] recovery_ms: how long a poll server reads a node that came back from down or hung
# through its keys' replicas. The app's outbox back-off cap (store.OUTBOX_BACKOFF_MAX, 2 s) must
# stay well below it, so the outbox rewrites the node's stale keys inside the window.
RECOVERY_MS_DEFAULT = 5000


@dataclass(frozen=True)
class MemcachedSettings:
    servers: tuple[str, ...] = ("127.0.0.1:11211",)
    # Every key is also written to its replica (ketama over the other servers); 1 by default
    # with at least 2 servers (docs/design.md, "Replicas").
    replicas: int = 0
    recovery_ms: int = RECOVERY_MS_DEFAULT
    # The list before a membership change: while set, every key is written to both placements
    # (docs/operations.md, "Adding or removing a memcached node").
    previous_servers: tuple[str, ...] = ()


@dataclass(frozen=True)
class RedisSettings:
    server: str = "127.0.0.1:6379"
    password_file: str | None = None
    db: int = 0
    username: str | None = None  # a Redis ACL user (AUTH username password)
    # With sentinels, `server` is not used: redis-py asks them for master_name's address.
    sentinels: tuple[str, ...] = ()
    master_name: str | None = None
    # The sentinels' own password (their requirepass), sent as AUTH to each sentinel.
    sentinel_password_file: str | None = None

    @property
    def unix_path(self) -> str | None:
        return self.server[5:] if self.server.startswith("unix:") else None

    @property
    def host_port(self) -> tuple[str, int]:
        host, _, port = self.server.rpartition(":")
        return host, int(port)

    @property
    def sentinel_addrs(self) -> list[tuple[str, int]]:
        return [(h, int(p)) for h, _, p in (s.rpartition(":") for s in self.sentinels)]


@dataclass(frozen=True)
class SigningSettings:
    secret_file: str | None = None  # None: poll URLs are not signed
    ttl: int = 3600  # seconds an issued poll URL stays valid


@dataclass(frozen=True)
class PollSettings:
    """Conditional and long polls (docs/api.md, "Conditional and long polls")."""

    # The pace each answer asks for (Poll-Interval-Ms): a random value from interval to
    # interval * (1 + jitter_pct / 100), so clients that started together drift apart.
    interval_ms: int = 1000
    # The pace of an answer the app gave (a cache miss, the cache down, the app under load).
    fallback_interval_ms: int = 3000
    jitter_pct: int = 20
    # The longest `wait=` honoured (seconds); a larger one is clamped to it.
    max_wait: int = 30


@dataclass(frozen=True)
class AnnounceSettings:
    """Where the app announces every write (Redis pub/sub). Unset server: with the Redis
    backend, the cache's own Redis ([redis]); with memcached, no announcements."""

    server: str | None = None  # host:port or unix:/path
    password_file: str | None = None
    username: str | None = None
    channel: str = "fastpoll:announce"


@dataclass(frozen=True)
class AppSettings:
    # A SQLite file path, or postgresql://user@host:port/dbname (docs/api.md, "Stores").
    database: str = "fastpoll.db"
    max_body_size: int = 65536
    database_password_file: str | None = None
    # None: the write API is open to whoever reaches the app's listener, which the command line
    # refuses to start unless open_api says that is meant (a local development stack).
    api_token_file: str | None = None
    open_api: bool = False
    # How many of a user's newest unread messages the answer lists (docs/api.md, "The poll
    # answer"): bounded by [cache] item_max_bytes as a room's history is.
    answer_messages: int = 10

    @property
    def is_postgresql(self) -> bool:
        return is_postgresql_url(self.database)


@dataclass(frozen=True)
class ChannelSettings:
    """Channels (docs/channels.md): how many a poll may name, how many messages a channel's
    answer keeps (the app's alone)."""

    max: int = 16
    history: int = 20


@dataclass(frozen=True)
class Settings:
    keys: KeySettings = field(default_factory=KeySettings)
    cache: CacheSettings = field(default_factory=CacheSettings)
    memcached: MemcachedSettings = field(default_factory=MemcachedSettings)
    redis: RedisSettings = field(default_factory=RedisSettings)
    app: AppSettings = field(default_factory=AppSettings)
    signing: SigningSettings = field(default_factory=SigningSettings)
    poll: PollSettings = field(default_factory=PollSettings)
    announce: AnnounceSettings = field(default_factory=AnnounceSettings)
    channels: ChannelSettings = field(default_factory=ChannelSettings)
    log_format: str = "text"  # [log] format: text or json (one JSON object a line)
    source: str = "(defaults)"
    # Hex SHA-256 of the file's bytes as read (of b"" without a file): /healthz and /metrics
    # report it so a deploy can tell a running app whose config differs from the file.
    sha256: str = hashlib.sha256(b"").hexdigest()


@dataclass
class _Entry:
    value: str
    line: int


class _Reader:
    def __init__(self, source: str) -> None:
        self.source = source

    def error(self, line: int, msg: str) -> ConfigError:
        return ConfigError(f"{self.source}:{line}: {msg}")


# Per section: key -> may it be repeated (values appended).
_KNOWN: dict[str, dict[str, bool]] = {
    "keys": {"prefix": False, "params": False},
    "cache": {
        "backend": False,
        "timeout_ms": False,
        "content_type": False,
        "ttl": False,
        "item_max_bytes": False,
    },
    "memcached": {
        "servers": True,
        "previous_servers": True,
        "replicas": False,
        "recovery_ms": False,
    },
    "redis": {
        "server": False,
        "password_file": False,
        "db": False,
        "username": False,
        "sentinels": False,
        "master_name": False,
        "sentinel_password_file": False,
    },
    "app": {
        "database": False,
        "max_body_size": False,
        "database_password_file": False,
        "api_token_file": False,
        "open_api": False,
        "answer_messages": False,
    },
    "signing": {"secret_file": False, "ttl": False},
    "poll": {
        "interval_ms": False,
        "fallback_interval_ms": False,
        "jitter_pct": False,
        "max_wait": False,
    },
    "announce": {"server": False, "password_file": False, "username": False, "channel": False},
    "channels": {"max": False, "history": False},
    "log": {"format": False},
}


def _strip_comment(text: str) -> str:
    m = _INLINE_COMMENT_RE.search(text)
    return (text[: m.start()] if m else text).strip(_WS)


def _parse_lines(text: str, rd: _Reader) -> dict[str, dict[str, list[_Entry]]]:
    """Split the file into {section: {key: [entries]}} for the sections we read."""
    out: dict[str, dict[str, list[_Entry]]] = {}
    section: str | None = None
    # As libinih: a byte order mark opens the file only; LF alone ends a line (not the other
    # line ends str.splitlines knows), and whitespace is ASCII whitespace.
    lines = text.removeprefix("\ufeff").split("\n")
    for lineno, raw in enumerate((r.removesuffix("\r") for r in lines), start=1):
        if len(raw.encode("utf-8")) > MAX_LINE:
            raise rd.error(lineno, f"line longer than {MAX_LINE} bytes; repeat the key instead")
        line = raw.strip(_WS)
        if not line or line[0] in ";#":
            continue
        if line.startswith("["):
            end = line.find("]")
            if end < 0 or _strip_comment(line[end + 1 :]):
                raise rd.error(lineno, f"malformed section header {line!r}")
            section = line[1:end]  # nothing trimmed inside the brackets, as libinih
            if section not in _KNOWN and section not in _IGNORED_SECTIONS:
                raise rd.error(lineno, f"unknown section [{section}]")
            continue
        # The syntax holds in every section, the ones we ignore included.
        m = _KEY_VALUE_RE.match(line)
        if not m:
            raise rd.error(lineno, f"expected 'key = value', got {line!r}")
        key, value = m.group(1).strip(_WS), _strip_comment(m.group(2).lstrip(_WS))
        if section is None:
            raise rd.error(lineno, f"key '{key}' outside of any [section]")
        if section in _IGNORED_SECTIONS and (section, key) not in _READ_IN_IGNORED:
            continue
        known = _KNOWN[section]
        if key not in known:
            raise rd.error(lineno, f"unknown key '{key}' in [{section}]")
        entries = out.setdefault(section, {}).setdefault(key, [])
        if entries and not known[key]:
            first = entries[0].line
            raise rd.error(lineno, f"[{section}] {key} given twice (first at line {first})")
        entries.append(_Entry(value, lineno))
    return out


def _int(e: _Entry, rd: _Reader, name: str, lo: int, hi: int) -> int:
    if not re.fullmatch(r"[0-9]+", e.value) or not lo <= int(e.value) <= hi:
        raise rd.error(e.line, f"{name} must be an integer from {lo} to {hi}, got {e.value!r}")
    return int(e.value)


def _host_port(spec: str) -> bool:
    host, sep, port = spec.rpartition(":")
    return (
        bool(sep)
        and bool(_HOST_RE.fullmatch(host))
        and port.isdigit()
        and port.isascii()
        and 1 <= int(port) <= 65535
    )


def _keys(sec: dict[str, list[_Entry]], rd: _Reader) -> KeySettings:
    d = KeySettings()
    prefix, params = d.prefix, d.params
    if e := _one(sec, "prefix"):
        raw = e.value.encode("utf-8")
        if len(raw) > MAX_PREFIX or any(not 0x21 <= c <= 0x7E for c in raw):
            raise rd.error(e.line, "[keys] prefix must be 0-64 printable ASCII bytes, no spaces")
        prefix = raw
    if e := _one(sec, "params"):
        names = [n for n in _SPLIT_RE.split(e.value) if n]
        if len(set(names)) > MAX_PARAMS:
            raise rd.error(e.line, f"[keys] params: more than {MAX_PARAMS} parameters")
        for n in names:
            if not _PARAM_RE.fullmatch(n):
                raise rd.error(e.line, f"[keys] params: bad parameter name {n!r}")
            if n in signing.RESERVED_PARAMS:
                raise rd.error(e.line, "[keys] params: exp and sig are reserved for signed URLs")
            if n.lower() == WAIT_PARAM:  # any case: every reader of `wait` ignores its case
                raise rd.error(e.line, "[keys] params: wait is reserved for long polls")
            if n.lower() == CH_PARAM:  # any case, as wait
                raise rd.error(e.line, "[keys] params: ch is reserved for channels")
            if n.lower() in history.PARAMS:  # any case, as wait
                raise rd.error(e.line, f"[keys] params: {n} is reserved for the history read")
        # The app's answers are per user: a key without user_id would be
        # shared by every user and the app would fill it with one user's answer.
        if "user_id" not in names:
            raise rd.error(e.line, "[keys] params must include user_id (answers are per user)")
        params = tuple(sorted({n.encode() for n in names}))
    return KeySettings(prefix=prefix, params=params)


def _cache(sec: dict[str, list[_Entry]], rd: _Reader) -> CacheSettings:
    d = CacheSettings()
    backend, timeout_ms, content_type, ttl = d.backend, d.timeout_ms, d.content_type, d.ttl
    if e := _one(sec, "backend"):
        if e.value not in ("memcached", "redis"):
            raise rd.error(e.line, f"[cache] backend must be memcached or redis, got {e.value!r}")
        backend = e.value
    if e := _one(sec, "timeout_ms"):
        timeout_ms = _int(e, rd, "[cache] timeout_ms", 1, 60000)
    if e := _one(sec, "content_type"):
        if not e.value or any(not 0x20 <= ord(c) <= 0x7E for c in e.value):
            raise rd.error(e.line, "[cache] content_type must be non-empty printable ASCII")
        content_type = e.value
    if e := _one(sec, "ttl"):
        ttl = _int(e, rd, "[cache] ttl", 0, MAX_TTL)
    item_max_bytes = d.item_max_bytes
    if e := _one(sec, "item_max_bytes"):
        name = "[cache] item_max_bytes"
        item_max_bytes = _int(e, rd, name, ITEM_MIN_BYTES, ITEM_MAX_BYTES)
    return CacheSettings(backend, timeout_ms, content_type, ttl, item_max_bytes)


def _server_list(
    entries: list[_Entry], rd: _Reader, name: str, limit: int | None
) -> tuple[str, ...]:
    servers: list[str] = []
    for e in entries:
        specs = [s for s in _SPLIT_RE.split(e.value) if s]
        if not specs:  # each line, as the poll server checks it
            raise rd.error(e.line, f"[memcached] {name} is empty")
        for spec in specs:
            if not _host_port(spec):
                raise rd.error(e.line, f"[memcached] {name}: expected host:port, got {spec!r}")
            servers.append(spec)
        if limit is not None and len(servers) > limit:
            raise rd.error(e.line, f"[memcached] {name}: more than {limit} servers")
    return tuple(servers)


def _memcached(sec: dict[str, list[_Entry]], rd: _Reader, backend: str) -> MemcachedSettings:
    d = MemcachedSettings()
    entries = sec.get("servers")
    # The poll server holds at most MAX_SERVERS; it does not read previous_servers.
    servers = _server_list(entries, rd, "servers", MAX_SERVERS) if entries else d.servers
    previous: tuple[str, ...] = ()
    if entries := sec.get("previous_servers"):
        previous = _server_list(entries, rd, "previous_servers", None)
    replicas = 1 if len(servers) >= 2 else 0
    if e := _one(sec, "replicas"):
        replicas = _int(e, rd, "[memcached] replicas", 0, 1)
        # The poll server refuses the same (config.c, fp_config_finish).
        if replicas and len(servers) < 2 and backend == "memcached":
            raise rd.error(e.line, "[memcached] replicas = 1 needs at least 2 servers")
    recovery_ms = d.recovery_ms
    if e := _one(sec, "recovery_ms"):
        recovery_ms = _int(e, rd, "[memcached] recovery_ms", 0, 600000)
    return MemcachedSettings(servers, replicas, recovery_ms, previous)


def _redis_address(e: _Entry, rd: _Reader, section: str) -> str:
    """A Redis `server`: host:port or unix:/absolute/path."""
    if e.value.startswith("unix:"):
        if not e.value[5:].startswith("/"):
            raise rd.error(e.line, f"[{section}] server: unix: needs an absolute path")
        if len(e.value[5:].encode("utf-8")) > MAX_UNIX_PATH:
            msg = f"[{section}] server: unix socket path longer than {MAX_UNIX_PATH} bytes"
            raise rd.error(e.line, msg)
    elif not _host_port(e.value):
        msg = f"[{section}] server: expected host:port or unix:/path, got {e.value!r}"
        raise rd.error(e.line, msg)
    return e.value


def _readable(e: _Entry, rd: _Reader, section: str, key: str = "password_file") -> str:
    """A `password_file` whose first line is a password, as the poll server reads it (the error
    names the file, never its content)."""
    try:
        data = Path(e.value).read_bytes()
    except OSError as exc:
        msg = f"[{section}] {key}: cannot read {e.value!r}: {exc}"
        raise rd.error(e.line, msg) from None
    first = data.split(b"\n", 1)[0].removesuffix(b"\r")
    if not first:
        raise rd.error(e.line, f"[{section}] {key} {e.value!r}: the first line is empty")
    if len(first) > MAX_PASSWORD:
        msg = f"[{section}] {key} {e.value!r}: first line longer than {MAX_PASSWORD} bytes"
        raise rd.error(e.line, msg)
    return e.value


def _redis(sec: dict[str, list[_Entry]], rd: _Reader) -> RedisSettings:
    d = RedisSettings()
    server, password_file, db = d.server, d.password_file, d.db
    if e := _one(sec, "server"):
        server = _redis_address(e, rd, "redis")
    if (e := _one(sec, "password_file")) and e.value:
        password_file = _readable(e, rd, "redis")
    if e := _one(sec, "db"):
        db = _int(e, rd, "[redis] db", 0, 65535)
    username = None
    if (e := _one(sec, "username")) and e.value:
        if any(not 0x21 <= ord(c) <= 0x7E for c in e.value):
            raise rd.error(e.line, "[redis] username must be printable ASCII without spaces")
        username = e.value
        if password_file is None:  # as the poll server: AUTH needs both
            raise rd.error(e.line, "[redis] username needs [redis] password_file")
    sentinels: list[str] = []
    for e in sec.get("sentinels", []):
        for spec in (s for s in _SPLIT_RE.split(e.value) if s):
            if not _host_port(spec):
                raise rd.error(e.line, f"[redis] sentinels: expected host:port, got {spec!r}")
            sentinels.append(spec)
        if len(sentinels) > MAX_SENTINELS:
            raise rd.error(e.line, f"[redis] sentinels: more than {MAX_SENTINELS}")
    master_name = None
    if (e := _one(sec, "master_name")) and e.value:
        if len(e.value) > MAX_MASTER_NAME or any(not 0x21 <= ord(c) <= 0x7E for c in e.value):
            msg = f"[redis] master_name must be 1-{MAX_MASTER_NAME} printable ASCII, no spaces"
            raise rd.error(e.line, msg)
        master_name = e.value
    if sentinels and master_name is None:
        line = sec["sentinels"][0].line
        raise rd.error(line, "[redis] sentinels needs [redis] master_name")
    if master_name is not None and not sentinels:
        raise rd.error(sec["master_name"][0].line, "[redis] master_name needs [redis] sentinels")
    sentinel_password_file = None
    if (e := _one(sec, "sentinel_password_file")) and e.value:
        sentinel_password_file = _readable(e, rd, "redis", "sentinel_password_file")
        if not sentinels:
            raise rd.error(e.line, "[redis] sentinel_password_file needs [redis] sentinels")
    return RedisSettings(
        server, password_file, db, username, tuple(sentinels), master_name, sentinel_password_file
    )


def is_postgresql_url(database: str) -> bool:
    return database.startswith(("postgresql://", "postgres://"))


def _check_postgresql_url(url: str) -> str | None:
    """Why a postgresql:// URL is unusable, or None. libpq's multi-host form is accepted
    (postgresql://user@h1:5432,h2:5432/db?target_session_attrs=read-write): each host is
    checked on its own; urlsplit alone reads "5432,h2:5432" as one port."""
    try:
        parts = urlsplit(url)
    except ValueError as exc:
        return f"malformed URL: {exc}"
    userinfo, at, hostlist = parts.netloc.rpartition("@")
    if at and ":" in userinfo:
        return "no password in the URL (it would show in logs and ps): use database_password_file"
    for host in hostlist.split(","):
        try:
            one = urlsplit(f"//{host}")
            port = one.port
        except ValueError as exc:
            return f"malformed URL: {exc}"
        if not one.hostname:
            return "the URL needs a host: postgresql://user@host:port/dbname"
        if port is not None and not 1 <= port <= 65535:
            return "port out of range"
    if not userinfo:
        return "the URL needs a user: postgresql://user@host:port/dbname"
    if parts.path.strip("/") == "" or "/" in parts.path.strip("/"):
        return "the URL needs a database name: postgresql://user@host:port/dbname"
    return None


def read_secret_file(path: str, what: str, min_len: int = 1) -> str:
    """The first line of a secret file that is a regular file, not readable by others and
    not writable by the group (0600 or 0640, like the signing key). ValueError says why not;
    it never shows the secret."""
    try:
        data = signing.read_private_file(path, API_TOKEN_MAX + 64)
    except signing.SecretFileError as exc:
        raise ValueError(f"{what} {exc}") from None
    line = data.split(b"\n", 1)[0].removesuffix(b"\r")
    if not line:
        raise ValueError(f"{what} {path}: empty (the secret is the first line)")
    if not min_len <= len(line) <= API_TOKEN_MAX:
        raise ValueError(f"{what} {path}: the secret must be {min_len}..{API_TOKEN_MAX} bytes")
    if any(not 0x21 <= c <= 0x7E for c in line):
        raise ValueError(
            f"{what} {path}: only printable ASCII without spaces (e.g. openssl rand -hex 32)"
        )
    return line.decode("ascii")


def token_matches(expected: str, given: str) -> bool:
    """Constant-time comparison of a bearer token."""
    return hmac.compare_digest(expected.encode(), given.encode("utf-8", "surrogateescape"))


def _app(sec: dict[str, list[_Entry]], rd: _Reader) -> AppSettings:
    d = AppSettings()
    database, max_body_size = d.database, d.max_body_size
    password_file, api_token_file = d.database_password_file, d.api_token_file
    if e := _one(sec, "database"):
        if not e.value:
            raise rd.error(e.line, "[app] database must not be empty")
        if is_postgresql_url(e.value) and (why := _check_postgresql_url(e.value)):
            raise rd.error(e.line, f"[app] database: {why}")
        database = e.value
    if e := _one(sec, "max_body_size"):
        max_body_size = _int(e, rd, "[app] max_body_size", 1, 64 * 1024 * 1024)
    if (e := _one(sec, "database_password_file")) and e.value:
        if not is_postgresql_url(database):
            raise rd.error(e.line, "[app] database_password_file is for a postgresql:// database")
        try:
            read_secret_file(e.value, "[app] database_password_file")
        except ValueError as exc:
            raise rd.error(e.line, str(exc)) from None
        password_file = e.value
    if (e := _one(sec, "api_token_file")) and e.value:
        try:
            read_secret_file(e.value, "[app] api_token_file", API_TOKEN_MIN)
        except ValueError as exc:
            raise rd.error(e.line, str(exc)) from None
        api_token_file = e.value
    open_api = d.open_api
    if e := _one(sec, "open_api"):
        if e.value not in ("true", "false"):
            raise rd.error(e.line, "[app] open_api must be true or false")
        open_api = e.value == "true"
    answer_messages = d.answer_messages
    if e := _one(sec, "answer_messages"):
        answer_messages = _int(e, rd, "[app] answer_messages", 1, MAX_HISTORY)
    return AppSettings(
        database, max_body_size, password_file, api_token_file, open_api, answer_messages
    )


def _signing(sec: dict[str, list[_Entry]], rd: _Reader) -> SigningSettings:
    d = SigningSettings()
    secret_file, ttl = d.secret_file, d.ttl
    if (e := _one(sec, "secret_file")) and e.value:
        try:
            signing.load_secrets(e.value)
        except signing.SecretFileError as exc:
            raise rd.error(e.line, f"[signing] secret_file: {exc}") from None
        secret_file = e.value
    if e := _one(sec, "ttl"):
        ttl = _int(e, rd, "[signing] ttl", 1, 365 * 24 * 3600)
    return SigningSettings(secret_file, ttl)


def _poll(sec: dict[str, list[_Entry]], rd: _Reader) -> PollSettings:
    d = PollSettings()
    interval, fallback, jitter, max_wait = (
        d.interval_ms,
        d.fallback_interval_ms,
        d.jitter_pct,
        d.max_wait,
    )
    if e := _one(sec, "interval_ms"):
        interval = _int(e, rd, "[poll] interval_ms", 0, MAX_INTERVAL_MS)
    if e := _one(sec, "fallback_interval_ms"):
        fallback = _int(e, rd, "[poll] fallback_interval_ms", 0, MAX_INTERVAL_MS)
    if e := _one(sec, "jitter_pct"):
        jitter = _int(e, rd, "[poll] jitter_pct", 0, 100)
    if e := _one(sec, "max_wait"):
        max_wait = _int(e, rd, "[poll] max_wait", 0, MAX_WAIT)
    return PollSettings(interval, fallback, jitter, max_wait)


def _announce(sec: dict[str, list[_Entry]], rd: _Reader) -> AnnounceSettings:
    d = AnnounceSettings()
    server, password_file, username, channel = d.server, None, None, d.channel
    if (e := _one(sec, "server")) and e.value:
        server = _redis_address(e, rd, "announce")
    if (e := _one(sec, "password_file")) and e.value:
        password_file = _readable(e, rd, "announce")
    if (e := _one(sec, "username")) and e.value:
        if any(not 0x21 <= ord(c) <= 0x7E for c in e.value):
            raise rd.error(e.line, "[announce] username must be printable ASCII without spaces")
        if password_file is None:
            raise rd.error(e.line, "[announce] username needs [announce] password_file")
        username = e.value
    if e := _one(sec, "channel"):
        if not 1 <= len(e.value) <= 128 or any(not 0x21 <= ord(c) <= 0x7E for c in e.value):
            raise rd.error(e.line, "[announce] channel must be 1-128 printable ASCII, no spaces")
        channel = e.value
    for key in ("password_file", "username"):
        if (e := _one(sec, key)) and e.value and server is None:
            raise rd.error(e.line, f"[announce] {key} needs [announce] server")
    return AnnounceSettings(server, password_file, username, channel)


def _channels(sec: dict[str, list[_Entry]], rd: _Reader) -> ChannelSettings:
    d = ChannelSettings()
    max_, history = d.max, d.history
    if e := _one(sec, "max"):
        max_ = _int(e, rd, "[channels] max", 1, MAX_CHANNELS)
    if e := _one(sec, "history"):
        history = _int(e, rd, "[channels] history", 1, MAX_HISTORY)
    return ChannelSettings(max_, history)


def _message_max() -> int:
    """The longest listed message: {"id":N,"text":"...","data":...}."""
    text = len('{"id":,"text":""}') + _MAX_ID_DIGITS + MAX_TEXT_CHARS * MAX_CHAR_BYTES
    return text + len(',"data":') + MAX_DATA_BYTES


def channel_value_max(history: int) -> int:
    """The longest cached value of a room under [channels] history: that many messages of the
    longest text, every character one JSON writes longest, under the longest ids, as
    channels.encode_channel writes them: {"messages":[{"id":N,"text":"..."},...],"before":N}."""
    message = _message_max()
    before = len(',"before":') + _MAX_ID_DIGITS
    return len('{"messages":[]}') + history * message + (history - 1) + before


def user_value_max(listed: int) -> int:
    """The longest cached answer of a user under [app] answer_messages, as store.encode_answer
    writes it: {"unread":N,"newest":{...},"messages":[...],"before":N}."""
    message = _message_max()
    head = len('{"unread":,"newest":,') + _MAX_ID_DIGITS + message
    return head + channel_value_max(listed) - 1


def _room_fits(secs: dict[str, dict[str, list[_Entry]]], rd: _Reader, s: Settings) -> None:
    """Refuse a [channels] history whose room answer, or an [app] answer_messages whose user
    answer, cannot fit [cache] item_max_bytes: the cache would refuse the write and keep
    serving the older answer (docs/channels.md, "A room's size"). The error names the setting's
    line, or item_max_bytes' if the setting is unset."""
    item = s.cache.item_max_bytes
    for section, key, count, size, what in (
        ("channels", "history", s.channels.history, channel_value_max, "a room's answer"),
        ("app", "answer_messages", s.app.answer_messages, user_value_max, "a user's answer"),
    ):
        need = size(count) + ITEM_OVERHEAD
        if need <= item:
            continue
        fits = max(
            (n for n in range(1, MAX_HISTORY + 1) if size(n) + ITEM_OVERHEAD <= item),
            default=0,
        )
        e = _one(secs.get(section, {}), key) or _one(secs.get("cache", {}), "item_max_bytes")
        line = e.line if e else 0
        raise rd.error(
            line,
            f"[{section}] {key} = {count}: {what} can reach {need} bytes ({count} "
            f"messages of up to {MAX_TEXT_CHARS} characters, {ITEM_OVERHEAD} bytes of item "
            f"overhead), over [cache] item_max_bytes = {item}; at most {fits} fit",
        )


def _one(sec: dict[str, list[_Entry]], key: str) -> _Entry | None:
    entries = sec.get(key)
    return entries[-1] if entries else None


def _log_format(sec: dict[str, list[_Entry]], rd: _Reader) -> str:
    if (e := _one(sec, "format")) and e.value not in ("text", "json"):
        raise rd.error(e.line, f"[log] format must be text or json, got {e.value!r}")
    return e.value if e else Settings.log_format


def parse(text: str, source: str = "<string>", sha256: str | None = None) -> Settings:
    """Parse config text; raise ConfigError naming line and key on any problem."""
    rd = _Reader(source)
    secs = _parse_lines(text, rd)
    cache = _cache(secs.get("cache", {}), rd)
    settings = Settings(
        keys=_keys(secs.get("keys", {}), rd),
        cache=cache,
        memcached=_memcached(secs.get("memcached", {}), rd, cache.backend),
        redis=_redis(secs.get("redis", {}), rd),
        app=_app(secs.get("app", {}), rd),
        signing=_signing(secs.get("signing", {}), rd),
        poll=_poll(secs.get("poll", {}), rd),
        announce=_announce(secs.get("announce", {}), rd),
        channels=_channels(secs.get("channels", {}), rd),
        log_format=_log_format(secs.get("log", {}), rd),
        source=source,
        sha256=sha256 or hashlib.sha256(text.encode("utf-8")).hexdigest(),
    )
    _room_fits(secs, rd, settings)
    return settings


def load(path: str | os.PathLike[str] | None = None) -> Settings:
    """Load the file at `path`, else $FASTPOLL_CONFIG; no file at all means defaults."""
    if path is None:
        path = os.environ.get(CONFIG_ENV) or None
    if path is None:
        return Settings()
    try:
        data = Path(path).read_bytes()
        text = data.decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read config: {exc}") from None
    return parse(text, str(path), hashlib.sha256(data).hexdigest())


def read_password(settings: RedisSettings | AnnounceSettings) -> str | None:
    """First line of [redis] (or [announce]) password_file, or None."""
    return _first_line(settings.password_file)


def read_sentinel_password(settings: RedisSettings) -> str | None:
    """First line of [redis] sentinel_password_file, or None."""
    return _first_line(settings.sentinel_password_file)


def _first_line(path: str | None) -> str | None:
    if not path:
        return None
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    return lines[0] if lines else ""


def read_database_password(settings: AppSettings) -> str | None:
    """First line of [app] database_password_file, or None."""
    if not settings.database_password_file:
        return None
    return read_secret_file(settings.database_password_file, "[app] database_password_file")


def open_api_refusal(settings: AppSettings) -> str | None:
    """Why the app must not serve with these settings (no write API token and no explicit
    open_api = true), or None."""
    if settings.api_token_file or settings.open_api:
        return None
    return (
        "[app] api_token_file is not set: the write API (POST /api/messages, "
        "/api/messages/read, /api/poll-url) would accept anyone who reaches the app's "
        "listener. Set api_token_file, or open_api = true for a local development stack"
    )


def read_api_token(settings: AppSettings) -> str | None:
    """The bearer token of the write API, or None when [app] api_token_file is not set."""
    if not settings.api_token_file:
        return None
    return read_secret_file(settings.api_token_file, "[app] api_token_file", API_TOKEN_MIN)
