"""Unit checks of the output parsers, on outputs captured from the real tools."""

from __future__ import annotations

from pathlib import Path

import pytest

from fastpoll_testkit.loadgen import ToolError, _dur_s, parse_ab, parse_wrk

HERE = Path(__file__).resolve().parent


DATA = HERE / "data"


def test_durations() -> None:
    assert _dur_s("452.00us") == pytest.approx(452e-6)
    assert _dur_s("1.07ms") == pytest.approx(1.07e-3)
    assert _dur_s("1.21s") == pytest.approx(1.21)
    assert _dur_s("2.00m") == pytest.approx(120.0)
    with pytest.raises(ToolError):
        _dur_s("12 parsecs")


def test_wrk_plain() -> None:
    r = parse_wrk((DATA / "wrk_plain.txt").read_text())
    assert r.conns == 50
    assert r.requests == 56678
    assert r.duration_s == pytest.approx(1.0)
    assert r.rps == pytest.approx(56544.61)
    assert r.p50_ms == pytest.approx(0.552)
    assert r.p99_ms == pytest.approx(6.43)
    assert r.max_ms == pytest.approx(11.04)
    assert r.errors == {"connect": 0, "read": 0, "write": 0, "timeout": 0}
    assert r.failed == 0 and r.check is None


def test_wrk_fpbench_line_wins() -> None:
    r = parse_wrk((DATA / "wrk_fpbench.txt").read_text())
    assert r.requests == 67240
    assert r.duration_s == pytest.approx(1.078832)
    assert r.rps == pytest.approx(67240 / 1.078832)
    assert r.p50_ms == pytest.approx(0.452)
    assert r.p999_ms == pytest.approx(19.258)
    assert r.check == {
        "n_hit": 67273,
        "n_miss": 0,
        "miss_reused": 0,
        "bad_status": 0,
        "bad_body": 0,
        "bad_source": 0,
    }
    assert r.failed == 0


def test_wrk_errors_count_as_failed() -> None:
    r = parse_wrk((DATA / "wrk_errors.txt").read_text())
    assert r.conns == 15000
    assert r.errors == {"connect": 0, "read": 17, "write": 0, "timeout": 250}
    assert r.non2xx == 42
    assert r.failed == 17 + 250 + 42
    assert r.p99_ms == pytest.approx(1210.0)


def test_wrk_garbage() -> None:
    with pytest.raises(ToolError):
        parse_wrk("unable to connect to 127.0.0.1:1 Connection refused\n")


def test_ab() -> None:
    r = parse_ab((DATA / "ab_c50.txt").read_text())
    assert (r.conns, r.requests) == (50, 5000)
    assert r.rps == pytest.approx(11771.30)
    assert r.duration_s == pytest.approx(0.425)
    assert r.p50_ms == 4 and r.p99_ms == 10 and r.max_ms == 13
    assert r.failed == 0 and r.non2xx == 0


def test_ab_failures() -> None:
    r = parse_ab((DATA / "ab_failed.txt").read_text(), keepalive=True)
    assert r.keepalive
    assert r.errors == {
        "failed": 12,
        "write": 1,
        "connect": 0,
        "receive": 0,
        "length": 12,
        "exceptions": 0,
    }
    assert r.non2xx == 3
    assert r.failed == 12 + 1 + 3
