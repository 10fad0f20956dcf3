"""The INI reader: defaults, values, and errors that name key and line."""

from __future__ import annotations

from pathlib import Path

import pytest

from fastpoll_app import config
from fastpoll_app.config import ConfigError, parse


def test_defaults() -> None:
    s = parse("")
    assert s.keys.prefix == b"/Poll"
    assert s.keys.params == (b"user_id",)
    assert s.cache.backend == "memcached"
    assert s.cache.timeout_ms == 100
    assert s.cache.content_type == "application/json"
    assert s.cache.ttl == 300
    assert s.memcached.servers == ("127.0.0.1:11211",)
    assert s.redis.server == "127.0.0.1:6379"
    assert s.redis.password_file is None
    assert s.redis.db == 0
    assert s.app.database == "fastpoll.db"
    assert s.app.max_body_size == 65536


def test_full_file_with_comments_and_foreign_sections() -> None:
    s = parse(
        """
; whole-line comment
# another
[server]
listen = 0.0.0.0      ; poll server only: ignored here
whatever = 1
[log]
level = debug
[keys]
prefix = fp:          ; inline comment
params = user_id, channel
[cache]
backend = redis       # hash comment
timeout_ms = 250
content_type = application/json; charset=utf-8
ttl = 0
[memcached]
servers = 10.0.0.1:11211 10.0.0.2:11212
servers = 10.0.0.3:11213
[redis]
server = unix:/run/redis.sock
db = 3
[app]
database = /var/lib/fastpoll/db.sqlite
max_body_size = 1024
"""
    )
    assert s.keys.prefix == b"fp:"
    assert s.keys.params == (b"channel", b"user_id")
    assert s.cache.backend == "redis"
    assert s.cache.timeout_ms == 250
    assert s.cache.content_type == "application/json; charset=utf-8"
    assert s.cache.ttl == 0
    assert s.memcached.servers == ("10.0.0.1:11211", "10.0.0.2:11212", "10.0.0.3:11213")
    assert s.redis.unix_path == "/run/redis.sock"
    assert s.redis.db == 3
    assert s.app.database == "/var/lib/fastpoll/db.sqlite"
    assert s.app.max_body_size == 1024


@pytest.mark.parametrize(
    ("text", "line", "words"),
    [
        ("[cache]\nbakend = redis\n", 2, "unknown key 'bakend'"),
        ("\n[keys]\nprefix = /P\nparam = x\n", 4, "unknown key 'param'"),
        ("[memcache]\nservers = a:1\n", 1, "unknown section [memcache]"),
        ("prefix = /P\n", 1, "outside of any [section]"),
        ("[keys\n", 1, "malformed section"),
        ("[keys]\njunk\n", 2, "expected 'key = value'"),
        ("[cache]\nbackend = mysql\n", 2, "backend"),
        ("[cache]\nttl = -1\n", 2, "ttl"),
        ("[cache]\nttl = 2592001\n", 2, "ttl"),
        ("[cache]\ntimeout_ms = 0\n", 2, "timeout_ms"),
        ("[cache]\ntimeout_ms = 10ms\n", 2, "timeout_ms"),
        ("[cache]\nttl = 1\nttl = 2\n", 3, "given twice (first at line 2)"),
        ("[keys]\nprefix = /Poll/\xe9\n", 2, "prefix"),
        ("[keys]\nprefix = " + "x" * 65 + "\n", 2, "prefix"),
        ("[keys]\nparams = user_id bad/name\n", 2, "bad parameter name"),
        ("[keys]\nparams = channel\n", 2, "must include user_id"),
        ("[memcached]\nservers = localhost\n", 2, "host:port"),
        ("[memcached]\nservers = host:0\n", 2, "host:port"),
        ("[memcached]\nservers = host:99999\n", 2, "host:port"),
        ("[memcached]\nservers =\n", 2, "servers is empty"),
        ("[redis]\nserver = unix:relative.sock\n", 2, "absolute path"),
        ("[redis]\nserver = nohost\n", 2, "host:port"),
        ("[redis]\npassword_file = /nonexistent/pw\n", 2, "password_file"),
        ("[redis]\ndb = x\n", 2, "db"),
        ("[redis]\nusername = fp\n", 2, "username needs [redis] password_file"),
        ("[redis]\nsentinels = 127.0.0.1:26379\n", 2, "needs [redis] master_name"),
        ("[redis]\n\nmaster_name = m\n", 3, "needs [redis] sentinels"),
        ("[redis]\nmaster_name = m\nsentinels = a:1 nohost\n", 3, "sentinels: expected host:port"),
        ("[app]\nmax_body_size = 0\n", 2, "max_body_size"),
        ("[app]\ndatabase =\n", 2, "database"),
        ("[memcached]\nservers = " + "h:1 " * 50 + "\n", 2, "longer than 198 bytes"),
    ],
)
def test_errors_name_line_and_key(text: str, line: int, words: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse(text, "x.ini")
    msg = str(info.value)
    assert msg.startswith(f"x.ini:{line}: "), msg
    assert words in msg, msg


def test_sentinels() -> None:
    s = parse("[redis]\nsentinels = 10.0.0.1:26379, 10.0.0.2:26379\nmaster_name = fp\n")
    assert s.redis.sentinels == ("10.0.0.1:26379", "10.0.0.2:26379")
    assert s.redis.sentinel_addrs == [("10.0.0.1", 26379), ("10.0.0.2", 26379)]
    assert s.redis.master_name == "fp"


def test_password_file(tmp_path: Path) -> None:
    pw = tmp_path / "pw"
    pw.write_text("s3cret\nignored\n")
    s = parse(f"[redis]\npassword_file = {pw}\n")
    assert config.read_password(s.redis) == "s3cret"


def test_load_from_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    f = tmp_path / "fastpoll.ini"
    f.write_text("[cache]\nttl = 7\n")
    monkeypatch.setenv(config.CONFIG_ENV, str(f))
    assert config.load().cache.ttl == 7
    monkeypatch.delenv(config.CONFIG_ENV)
    assert config.load().cache.ttl == 300


def test_load_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        config.load(tmp_path / "nope.ini")


def test_example_config_parses() -> None:
    from .conftest import REPO_ROOT

    example = REPO_ROOT / "etc" / "fastpoll.ini.example"
    if not example.exists():
        pytest.skip("etc/fastpoll.ini.example not written yet")
    config.load(example)


# A room's answer must fit the cache's item size ([cache] item_max_bytes, docs/channels.md).


def _refusal(text: str) -> str:
    with pytest.raises(ConfigError) as exc:
        parse(text, "f.ini")
    return str(exc.value)


def test_item_max_bytes_default_and_range() -> None:
    assert parse("").cache.item_max_bytes == 1048576
    assert parse("[cache]\nitem_max_bytes = 524288\n").cache.item_max_bytes == 524288
    for bad in ("0", "1023", "1048577", "1m", ""):
        msg = _refusal(f"[cache]\nitem_max_bytes = {bad}\n")
        assert msg.startswith("f.ini:2:") and "item_max_bytes" in msg, msg


def test_a_room_larger_than_the_item_size_is_refused_at_start() -> None:
    # 200 (or 1,000) of the largest messages cannot fit memcached's 1 MiB item.
    for history in (200, 1000):
        msg = _refusal(f"[keys]\nprefix = /Poll\n[channels]\nhistory = {history}\n")
        assert msg.startswith("f.ini:4:"), msg
        assert "[channels] history" in msg and "[cache] item_max_bytes" in msg, msg
    # A smaller item size refuses the default history, naming its own line.
    msg = _refusal("[cache]\nbackend = redis\nitem_max_bytes = 65536\n")
    assert msg.startswith("f.ini:3:") and "[cache] item_max_bytes" in msg, msg


def test_the_largest_room_accepted_fits_the_item_size() -> None:
    """The largest history accepted, filled with the largest messages the API takes (every
    character one that JSON writes longest, the largest data) under the largest ids, fits the
    item size with memcached's per-item overhead; one more message is refused."""
    from fastpoll_app import channels

    for item in (1048576, 262144, 30000):
        ok = 1
        while ok < config.MAX_HISTORY:
            try:
                parse(f"[cache]\nitem_max_bytes = {item}\n[channels]\nhistory = {ok + 1}\n")
            except ConfigError:
                break
            ok += 1
        worst = [largest_message()] * ok
        size = len(channels.encode_channel(worst, 2**63 - 1))
        assert size + config.ITEM_OVERHEAD <= item
        assert size + len(channels.encode_channel(worst[:1])) + 1 + config.ITEM_OVERHEAD > item
    assert parse("").channels.history == 20  # the defaults fit


def test_answer_messages_default_range_and_refusals() -> None:
    assert parse("").app.answer_messages == 10
    assert parse("[app]\nanswer_messages = 3\n").app.answer_messages == 3
    for bad in ("0", "-1", "x", "", "1001"):
        msg = _refusal(f"[app]\ndatabase = x.db\nanswer_messages = {bad}\n")
        assert msg.startswith("f.ini:3:") and "[app] answer_messages" in msg, msg


def test_the_largest_user_answer_accepted_fits_the_item_size() -> None:
    """As a room's: the largest [app] answer_messages accepted, every listed message (and the
    newest again) of the largest text under the largest ids, with "before", fits the item
    size; one more is refused, naming answer_messages' line (or item_max_bytes')."""
    from fastpoll_app.store import encode_answer

    big = 2**63 - 1
    for item in (1048576, 262144, 60000):
        ok = 1
        while ok < config.MAX_HISTORY:
            try:
                head = f"[cache]\nitem_max_bytes = {item}\n[channels]\nhistory = 1\n"
                parse(f"{head}[app]\nanswer_messages = {ok + 1}\n")
            except ConfigError as exc:
                assert str(exc).startswith("<string>:6:") and "answer_messages" in str(exc)
                break
            ok += 1
        worst = [largest_message()] * ok
        size = len(encode_answer(big, worst, big))
        assert size + config.ITEM_OVERHEAD <= item
        assert size + len(channels_one()) + 1 + config.ITEM_OVERHEAD > item
    msg = _refusal("[cache]\nbackend = redis\nitem_max_bytes = 100000\n[channels]\nhistory = 2\n")
    assert msg.startswith("f.ini:3:") and "[app] answer_messages = 10" in msg, msg


def largest_message() -> tuple[int, str, str]:
    """The largest message the API takes: the largest id, text and data (a JSON string of
    MAX_DATA_BYTES bytes, quotes included)."""
    from fastpoll_app import app, channels

    data = channels.encode_data("x" * (app.MAX_DATA_BYTES - 2))
    assert len(data.encode()) == app.MAX_DATA_BYTES
    return (2**63 - 1, "\x01" * app.MAX_TEXT_CHARS, data)


def channels_one() -> bytes:
    """One listed message, the largest, as an answer writes it."""
    from fastpoll_app import channels

    return channels.encode_channel([largest_message()])


def test_no_character_is_longer_in_a_rooms_answer_than_the_bound_assumes() -> None:
    import json.encoder

    from fastpoll_app import channels

    # Every character, as the JSON encoder of a room's answer writes it (ensure_ascii=False).
    chars = [chr(c) for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF]
    longest = max(len(json.encoder.encode_basestring(c).encode()) - 2 for c in chars)
    assert longest == config.MAX_CHAR_BYTES == 6
    # ... and encode_channel writes each as that encoder does.
    one = len(channels.encode_channel([(1, "")]))
    text = "".join(chars)
    assert len(channels.encode_channel([(1, text)])) - one == sum(
        len(json.encoder.encode_basestring(c).encode()) - 2 for c in chars
    )
