"""Unit checks of the rooms bench's event-stream client (loadtests/stream_client.py) and of the
floor peer's configuration and upstream (loadtests/peers/stream_back.c)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from loadtests.longpoll_client import parse_head
from loadtests.longpoll_nchan import MODULE
from loadtests.peers import Peer
from loadtests.rooms import FLOOR_TUNING, NchanRooms, build_stream_back
from loadtests.stream_client import ChunkedDecoder, SseParser, StreamDeliveries


def test_sse_events_split_anywhere() -> None:
    raw = (
        b'retry: 1087\nid: "79c1"\ndata: {"text":"lp1"}\n\n:\n'
        b'id: "abf8"\r\ndata: a\r\ndata: b\r\n\r\n'
        b"data:x\r\rdata: \n\n"
    )
    for step in (1, 3, len(raw)):
        p = SseParser()
        events = [e for i in range(0, len(raw), step) for e in p.feed(raw[i : i + step])]
        assert [(e.id, e.data) for e in events] == [
            (b'"79c1"', b'{"text":"lp1"}'),
            (b'"abf8"', b"a\nb"),
            (None, b"x"),
            (None, b""),
        ]
        assert p.last_id == b'"abf8"'


def test_sse_waits_for_the_blank_line() -> None:
    p = SseParser()
    assert p.feed(b"data: half") == []
    assert p.feed(b"\n") == []
    assert [e.data for e in p.feed(b"\n")] == [b"half"]


def test_chunked_decoding_split_anywhere() -> None:
    raw = b"6\r\ndata: \r\n3;ext=1\r\nabc\r\n2\r\n\n\n\r\n0\r\n\r\n"
    for step in (1, 2, 5, len(raw)):
        d = ChunkedDecoder()
        out = b"".join(d.feed(raw[i : i + step]) for i in range(0, len(raw), step))
        assert out == b"data: abc\n\n"
        assert d.done


def test_chunked_rejects_a_missing_crlf() -> None:
    with pytest.raises(ValueError):
        ChunkedDecoder().feed(b"1\r\naXY")


def test_every_marker_counts_once_and_a_skipped_one_is_a_miss() -> None:
    d = StreamDeliveries(SimpleNamespace(value=0))
    assert d.event(1, b'{"messages":[{"text":"open"}]}', 0.5) == 0
    assert d.event(1, b'[{"text":"lp1"}]', 1.0) == 1
    assert d.event(1, b'[{"text":"lp2"},{"text":"lp1"}]', 2.0) == 1  # lp1 already seen
    assert d.event(1, b'[{"text":"lp4"}]', 4.0) == 1  # lp3 never read: a miss
    assert d.event(2, b'[{"text":"lp1"}]', 1.5) == 1
    assert dict(d.times) == {1: [1.0, 1.5], 2: [2.0], 4: [4.0]}
    assert d.progress.value == 4


def test_parse_head() -> None:
    status, headers = parse_head(
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    assert status == 200
    assert headers[b"content-type"] == b"text/event-stream"
    assert headers[b"transfer-encoding"] == b"chunked"
    with pytest.raises(ValueError):
        parse_head(b"SSH-2.0\r\n\r\n")


def _nginx_t(run_dir: Path, conf: Path) -> None:
    check = subprocess.run(
        ["nginx", "-t", "-q", "-p", str(run_dir), "-c", str(conf)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert check.returncode == 0, check.stderr


@pytest.mark.skipif(shutil.which("nginx") is None, reason="make deps installs nginx")
def test_floor_config_passes_nginx_t(tmp_path: Path) -> None:
    peer = Peer("stream_floor", tmp_path / "floor", FLOOR_TUNING, {"socket": str(tmp_path / "s")})
    conf = peer.render()
    text = conf.read_text()
    assert "proxy_buffering off;" in text and "multi_accept on;" in text
    _nginx_t(peer.run_dir, conf)


@pytest.mark.skipif(shutil.which("gcc") is None, reason="make deps installs build-essential")
def test_stream_back_builds_warning_free(tmp_path: Path) -> None:
    assert build_stream_back(tmp_path).exists()  # -Wall -Wextra -Werror


@pytest.mark.skipif(not MODULE.exists(), reason="make bench-rooms installs libnginx-mod-nchan")
def test_nchan_rooms_config_has_both_subscribers(tmp_path: Path) -> None:
    peer = NchanRooms.at(tmp_path / "nchan")
    conf = peer.render()
    text = conf.read_text()
    assert "location = /lpm" in text and "nchan_subscriber eventsource;" in text
    _nginx_t(peer.run_dir, conf)
