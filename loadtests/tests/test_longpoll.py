"""Smoke checks of loadtests/longpoll*.py without load: the client's HTTP reader, the matching of
publishes to deliveries, wrk's summary line, and the Nchan peer's configuration (nginx -t)."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

import pytest

from fastpoll_testkit.loadgen import ToolError
from loadtests.longpoll import parse_fplp
from loadtests.longpoll_client import Deliveries, marker_of, quantile_ms, read_response
from loadtests.longpoll_nchan import MODULE, NchanPeer

HERE = Path(__file__).resolve().parent


def read(raw: bytes) -> tuple[int, dict[bytes, bytes], bytes, int, bytes]:
    async def go() -> tuple[int, dict[bytes, bytes], bytes, int, bytes]:
        reader = asyncio.StreamReader()
        reader.feed_data(raw)
        reader.feed_eof()
        r = await read_response(reader)
        return r.status, r.headers, r.body, r.nbytes, await reader.read()

    return asyncio.run(go())


def test_reads_a_content_length_answer_and_leaves_the_next() -> None:
    one = b'HTTP/1.1 200 OK\r\nETag: "ab"\r\nContent-Length: 5\r\n\r\nhello'
    status, headers, body, nbytes, rest = read(one + b"HTTP/1.1 304 Not Modified\r\n\r\n")
    assert (status, headers[b"etag"], body, nbytes) == (200, b'"ab"', b"hello", len(one))
    assert rest.startswith(b"HTTP/1.1 304")


def test_reads_chunked_and_bodiless_answers() -> None:
    chunked = (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"
    )
    status, _, body, nbytes, rest = read(chunked)
    assert (status, body, nbytes, rest) == (200, b"abcde", len(chunked), b"")
    status, headers, body, _, _ = read(b"HTTP/1.1 304 Not Modified\r\nEtag: 0\r\n\r\n")
    assert (status, headers[b"etag"], body) == (304, b"0", b"")


def test_rejects_a_bad_status_line() -> None:
    with pytest.raises(ValueError):
        read(b"HTTX/1.1 200 OK\r\n\r\n")


def test_a_newer_answer_delivers_the_older_publishes() -> None:
    d = Deliveries()
    d.published(7, marker_of(1), 10.0)
    d.published(7, marker_of(12), 10.5)
    d.published(8, marker_of(2), 10.2)
    # "lp1" must not match inside "lp12": markers are quoted JSON strings.
    assert d.answer(7, b'{"newest":{"text":"lp12"}}', 11.0) == 2
    assert d.superseded == 1
    assert d.answer(8, b'{"newest":{"text":"bench 8"}}', 11.0) == 0  # not this message yet
    assert d.undelivered() == 1
    assert [round(x, 3) for x in d.latencies_s] == [1.0, 0.5]
    assert quantile_ms(d.latencies_s, 0.5) == 1000.0
    assert quantile_ms([], 0.5) is None


def test_parse_fplp() -> None:
    line = (
        'FPLP {"requests":10,"bytes":1840,"duration_us":2000000,"connect":0,"read":0,'
        '"write":0,"status":0,"timeout":0,"n200":0,"n304":10,"nother":0,"p50_us":900,"p99_us":4000}'
    )
    d = parse_fplp("Running 2s test\n" + line + "\n")
    assert (d["requests"], d["bytes"], d["n304"]) == (10, 1840, 10)
    with pytest.raises(ToolError):
        parse_fplp("no summary")


@pytest.mark.skipif(not MODULE.exists(), reason="make bench-longpoll installs libnginx-mod-nchan")
def test_nchan_config_passes_nginx_t(tmp_path: Path) -> None:
    peer = NchanPeer.at(tmp_path / "nchan")
    conf = peer.render()
    text = conf.read_text()
    assert "nchan_subscriber longpoll;" in text and "nchan_subscriber intervalpoll;" in text
    check = subprocess.run(
        ["nginx", "-t", "-q", "-p", str(peer.run_dir), "-c", str(conf)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert check.returncode == 0, check.stderr
