"""No client can take a poller out of nginx's rotation (docs/security.md,
"What a client can make nginx do to a poller").

nginx marks a poller failed (max_fails=1: skipped for fail_timeout) when proxying to it fails or
times out. The plain-poll route reads with a 5 s timeout and retries on a timeout, so a poll the
poller holds there (a `wait` nginx and the poller read differently) used to time out, mark the
poller failed and be retried on the next one: two such requests and every plain poll of the
next seconds went to the app. Here every odd input a client controls (the `wait` ambiguities,
long and strange targets and If-None-Match values, methods, bodies) is sent through nginx on a
real stack with two pollers; none may leave an upstream failure in nginx's error log, and plain
polls keep coming from the cache.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from fastpoll_testkit.helpers import http_client, new_uid
from fastpoll_testkit.rawhttp import exchange, request
from fastpoll_testkit.stack import Stack

# What nginx writes when proxying to a poller failed, timed out or was counted as a failure.
UPSTREAM_FAILURES = (
    "upstream server temporarily disabled",
    "upstream timed out",
    "no live upstreams",
    "upstream prematurely closed",
    "upstream sent invalid",
    "while reading response header from upstream",
    "while sending request to upstream",
)
# The body of nginx's own refusal of an ambiguous or malformed wait (nginx/fastpoll.conf.j2).
WAIT_REFUSED = b'{"error":"wait must be given at most once, as 1-6 decimal digits"}\n'


@pytest.fixture(scope="module")
def edge(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """Two pollers: one marked failed is the other's whole share."""
    s = Stack(run_dir=tmp_path_factory.mktemp("never-failed"), n_pollers=2)
    s.start()
    yield s
    s.stop()


def error_log_size(stack: Stack) -> int:
    return (stack.run_dir / "nginx" / "error.log").stat().st_size


def upstream_failures(stack: Stack, since: int) -> list[str]:
    """Lines nginx's error log gained since offset `since` that tell of an upstream failure."""
    with open(stack.run_dir / "nginx" / "error.log", "rb") as f:
        f.seek(since)
        log = f.read().decode(errors="replace")
    return [line for line in log.splitlines() if any(f in line for f in UPSTREAM_FAILURES)]


def cached_user(stack: Stack, client: httpx.Client) -> tuple[int, str]:
    """A user whose answer is in the cache (the app filled it), and its signed poll URL."""
    uid = new_uid()
    url = stack.poll_url(uid)
    assert client.get(url).status_code == 200
    assert client.get(url).headers["x-poll-source"] == "cache"
    return uid, url


def assert_plain_polls_from_cache(stack: Stack, client: httpx.Client, url: str) -> None:
    sources = [client.get(url).headers.get("x-poll-source") for _ in range(40)]
    assert sources == ["cache"] * 40, sources


# Each is appended to a signed poll URL and sent with `If-None-Match: *` (the cached answer
# matches it: a poller that took it as a long poll would hold it).
AMBIGUOUS_WAITS = [
    "&WAIT=0&wait=30",  # the report: nginx read the first, the poller the last
    "&wait=0&WAIT=30",
    "&Wait=30&wait",
    "&wait&wait=30",
    "&wait=30&wait=30",
]


@pytest.mark.parametrize("extra", AMBIGUOUS_WAITS)
def test_ambiguous_wait_is_refused_by_nginx_and_marks_no_poller(edge: Stack, extra: str) -> None:
    since = error_log_size(edge)
    with http_client(edge, sign=False, timeout=30) as c:
        _, url = cached_user(edge, c)
        answers: list[tuple[int, bytes, float]] = []

        def ambiguous() -> None:
            t0 = time.monotonic()
            r = c.get(url + extra, headers={"If-None-Match": "*"})
            answers.append((r.status_code, r.content, time.monotonic() - t0))

        # As many at once as there are pollers and nginx workers to mark.
        threads = [threading.Thread(target=ambiguous) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for status, body, seconds in answers:
            assert (status, body) == (400, WAIT_REFUSED), (extra, status, body, seconds)
            assert seconds < 2.0, (extra, seconds)
        assert_plain_polls_from_cache(edge, c, url)
    assert upstream_failures(edge, since) == []


def test_one_wait_in_any_case_is_held(edge: Stack) -> None:
    """`WAIT=1` alone is the wait: held for its second on the held route, then 304."""
    since = error_log_size(edge)
    with http_client(edge, sign=False, timeout=30) as c:
        _, url = cached_user(edge, c)
        t0 = time.monotonic()
        r = c.get(url + "&WAIT=1", headers={"If-None-Match": "*"})
        held = time.monotonic() - t0
        assert r.status_code == 304 and 0.9 <= held < 4.0, (r.status_code, held)
        assert_plain_polls_from_cache(edge, c, url)
    assert upstream_failures(edge, since) == []


def odd_requests(stack: Stack, url: str) -> list[tuple[str, bytes]]:
    """Requests a client fully controls, each with what it is."""
    inm = {"If-None-Match": "*"}
    target_7k = url + "&x=" + "a" * 7000
    return [
        ("long target", request("GET", target_7k)),
        (
            "long If-None-Match",
            request("GET", url, {"If-None-Match": '"' + "b" * 7000 + '"'}),
        ),
        (
            "long target and long If-None-Match",
            request(
                "GET",
                url + "&x=" + "a" * 4000,
                {"If-None-Match": '"' + "b" * 6000 + '"'},
            ),
        ),
        ("many parameters", request("GET", url + "&a=1" * 1500, inm)),
        (
            "control byte in If-None-Match",
            request("GET", url, {"If-None-Match": '"\x01"'}),
        ),
        ("DEL in If-None-Match", request("GET", url, {"If-None-Match": '"\x7f"'})),
        ("high bytes in the query", request("GET", url + "&x=\xff\xfe", inm)),
        ("percent-encoded NUL", request("GET", url + "&x=%00", inm)),
        (
            "encoded slash and dots",
            request("GET", "/Poll/%2e%2e/getMessages%2f?user_id=1"),
        ),
        ("double slash", request("GET", "/Poll//getMessages?user_id=1")),
        (
            "wait in the path",
            request("GET", "/Poll/getMessages;wait=30?user_id=1", inm),
        ),
        ("POST with a body", request("POST", url, inm, b"x" * 60000)),
        (
            "chunked POST",
            request(
                "POST",
                url,
                {"Transfer-Encoding": "chunked"},
                b"5\r\nhello\r\n0\r\n\r\n",
            ),
        ),
        ("HEAD held", request("HEAD", url + "&wait=1", inm)),
        ("health check with a wait", request("GET", "/healthz?wait=30", inm)),
        ("OPTIONS", request("OPTIONS", url, inm)),
        ("DELETE", request("DELETE", url, inm)),
        (
            "Expect: 100-continue",
            request("POST", url, {"Expect": "100-continue"}, b"{}"),
        ),
        (
            "HTTP/1.0 held",
            request("GET", url + "&wait=1", inm).replace(b"HTTP/1.1", b"HTTP/1.0"),
        ),
    ]


def test_no_client_input_marks_a_poller_failed(edge: Stack) -> None:
    since = error_log_size(edge)
    with http_client(edge, sign=False, timeout=30) as c:
        _, url = cached_user(edge, c)
        for what, data in odd_requests(edge, url):
            ex = exchange(edge.http_port, data, timeout=8, expect=1)
            # An answer, never nginx's own 502/504 (a poller that failed), and quickly: nothing
            # a client sends makes a plain poll wait for nginx's read timeout.
            assert ex.responses, (what, ex)
            assert ex.responses[0].status not in (502, 504), (what, ex.responses[0])
            assert ex.seconds < 4.5, (what, ex.seconds)
        # A held poll the client abandons: nginx closes its connection to the poller, which is
        # not a failure either.
        ex = exchange(
            edge.http_port,
            request("GET", url + "&wait=30", {"If-None-Match": "*"}),
            timeout=0.5,
        )
        assert ex.responses == []
        assert_plain_polls_from_cache(edge, c, url)
    assert upstream_failures(edge, since) == []


def test_rendered_nginx_has_the_pollers_max_wait_and_marks_routes(tmp_path: Path) -> None:
    """nginx cuts a held poll at its max_wait + 10 s, and that timeout marks the poller failed:
    a stack whose pollers honour longer waits renders nginx with the same max_wait."""
    s = Stack(run_dir=tmp_path, n_pollers=1, extra_ini={"poll": {"max_wait": "45"}})
    s._allocate_ports()
    s.write_config()
    site = (tmp_path / "nginx" / "fastpoll.conf").read_text()
    assert "proxy_read_timeout 55s;" in site
    # Each route tells the poller which it is: a poll marked plain is never held.
    plain, held = site.split("location @poll_held {")
    assert "proxy_set_header X-Fastpoll-Route plain;" in plain.split("location @fallback")[0]
    assert "proxy_set_header X-Fastpoll-Route held;" in held.split("location @fallback")[0]
