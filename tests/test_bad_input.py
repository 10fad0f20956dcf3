"""Bad input, straight to a poll server and through nginx, on raw sockets: malformed request
lines, header floods, oversized heads, URIs and bodies, slowloris, pipelining, binary garbage,
percent-encoded CR/LF/space/NUL, dot segments, long query strings, odd methods. Each gets a
well-formed 4xx (or falls back), and the server keeps serving everyone else. Then protocol
injection: no request makes the poll server send memcached or Redis anything but a read of one
valid key, and canary values survive every attempt.
"""

from __future__ import annotations

import random
import re
import socket
import threading
import time
from collections.abc import Iterator

import httpx
import pytest
import redis

from fastpoll_testkit.helpers import Cache, new_uid, poll_key
from fastpoll_testkit.rawhttp import exchange, request
from fastpoll_testkit.stack import Stack

REQUEST_TIMEOUT_S = 2.0  # [server] request_timeout_ms of these stacks
IDLE_TIMEOUT_S = 3.0
NGINX_HEADER_TIMEOUT_S = 3.0


@pytest.fixture(scope="module")
def bad_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    s = Stack(
        run_dir=tmp_path_factory.mktemp("bad-input"),
        n_memcached=1,
        n_pollers=1,
        extra_ini={
            "server": {
                "request_timeout_ms": str(int(REQUEST_TIMEOUT_S * 1000)),
                "idle_timeout_ms": str(int(IDLE_TIMEOUT_S * 1000)),
            }
        },
        nginx_vars={
            "fastpoll_client_header_timeout": f"{NGINX_HEADER_TIMEOUT_S:.0f}s",
            "fastpoll_client_body_timeout": f"{NGINX_HEADER_TIMEOUT_S:.0f}s",
        },
    )
    s.start()
    yield s
    s.stop()
    reports = s.sanitizer_reports()
    assert not reports, "\n".join(reports[:20])


@pytest.fixture(scope="module")
def hit_uid(bad_stack: Stack) -> int:
    uid = new_uid()
    Cache(bad_stack).set(poll_key(uid), b'{"unread":1}')
    return uid


WHERE = ["poller", "nginx"]


def port_of(stack: Stack, where: str) -> int:
    return stack.poller_ports[0] if where == "poller" else stack.http_port


def mount(where: str, target: str) -> str:
    """The same poll as a poller sees it, or through nginx (with /Poll)."""
    return target if where == "poller" else "/Poll" + target


def assert_alive(stack: Stack, uid: int) -> None:
    """Everyone else is still served: a signed poll on a new connection, both ways."""
    for where in WHERE:
        target = stack.sign(mount(where, f"/getMessages?user_id={uid}"))
        r = httpx.get(f"http://127.0.0.1:{port_of(stack, where)}{target}", timeout=5)
        assert (r.status_code, r.content) == (200, b'{"unread":1}'), where


def assert_4xx(x, what: str) -> None:
    assert x.responses, (
        f"{what}: no answer (closed={x.closed}, got {x.trailing[:80]!r})"
    )
    status = x.responses[0].status
    assert 400 <= status < 500, f"{what}: {status} {x.responses[0].body[:100]!r}"


# ---- malformed request lines, odd methods ------------------------------------------

MALFORMED = {
    "not http": b"GARBAGE\r\n\r\n",
    "method only": b"GET\r\n\r\n",
    "no version": b"GET /getMessages?user_id=1\r\n\r\n",
    "bad version": b"GET /getMessages?user_id=1 HTTP/9.9\r\nHost: x\r\n\r\n",
    "bad version text": b"GET /getMessages?user_id=1 HTTQ/1.1\r\nHost: x\r\n\r\n",
    "extra token": b"GET /getMessages?user_id=1 HTTP/1.1 x\r\nHost: x\r\n\r\n",
    "two spaces": b"GET  /getMessages?user_id=1 HTTP/1.1\r\nHost: x\r\n\r\n",
    "tab separated": b"GET\t/getMessages?user_id=1\tHTTP/1.1\r\nHost: x\r\n\r\n",
    "bare LF lines": b"GET /getMessages?user_id=1 HTTP/1.1\nHost: x\n\n",
    "NUL in line": b"GET /getMes\x00sages?user_id=1 HTTP/1.1\r\nHost: x\r\n\r\n",
    "raw CR in target": b"GET /getMessages?user_id=1\rflush_all HTTP/1.1\r\nHost: x\r\n\r\n",
    "raw space in target": b"GET /getMessages?user_id=1 flush_all HTTP/1.1\r\nHost: x\r\n\r\n",
    "8-bit target": b"GET /getMessages?user_id=\xff\xfe HTTP/1.1\r\nHost: x\r\n\r\n",
    "absolute-form": b"GET http://evil.example/getMessages?user_id=1 HTTP/1.1\r\nHost: x\r\n\r\n",
    "asterisk-form": b"OPTIONS * HTTP/1.1\r\nHost: x\r\n\r\n",
    "lower-case method": b"get /getMessages?user_id=1 HTTP/1.1\r\nHost: x\r\n\r\n",
    "header without colon": b"GET /getMessages?user_id=1 HTTP/1.1\r\nHost x\r\n\r\n",
    "header name with space": b"GET /getMessages?user_id=1 HTTP/1.1\r\nBad Name: x\r\n\r\n",
    "obsolete line folding": b"GET /getMessages?user_id=1 HTTP/1.1\r\nHost: x\r\n y\r\n\r\n",
    "bad content-length": b"POST /getMessages?user_id=1 HTTP/1.1\r\nHost: x\r\n"
    b"Content-Length: abc\r\n\r\n",
    "negative content-length": b"POST /getMessages?user_id=1 HTTP/1.1\r\nHost: x\r\n"
    b"Content-Length: -1\r\n\r\n",
    "two content-lengths": b"POST /getMessages?user_id=1 HTTP/1.1\r\nHost: x\r\n"
    b"Content-Length: 3\r\nContent-Length: 30\r\n\r\nabc",
    "CL and TE (smuggling)": b"POST /getMessages?user_id=1 HTTP/1.1\r\nHost: x\r\n"
    b"Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /x HTTP/1.1\r\n\r\n",
    "bad chunk size": b"POST /getMessages?user_id=1 HTTP/1.1\r\nHost: x\r\n"
    b"Transfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n",
}

ODD_METHODS = [
    "PUT",
    "DELETE",
    "PATCH",
    "OPTIONS",
    "TRACE",
    "CONNECT",
    "PROPFIND",
    "FOO",
    "GETX",
]


@pytest.mark.parametrize("where", WHERE)
@pytest.mark.parametrize("name", list(MALFORMED))
def test_malformed_requests_get_a_4xx(
    bad_stack: Stack, hit_uid: int, name: str, where: str
) -> None:
    data = MALFORMED[name]
    if where == "nginx":
        data = data.replace(b" /getMessages", b" /Poll/getMessages", 1)
    x = exchange(port_of(bad_stack, where), data, expect=1)
    if name == "no version" and where == "nginx":
        # nginx speaks HTTP/0.9 to such a request: a body and no head, here the poll
        # server's 403 (the URL is not signed).
        assert x.closed and b'"error"' in x.trailing, x
    elif name == "bad version" and where == "nginx":
        assert x.statuses == [505], (
            x.statuses
        )  # HTTP Version Not Supported, by definition
    else:
        assert_4xx(x, name)
    assert_alive(bad_stack, hit_uid)


@pytest.mark.parametrize("where", WHERE)
@pytest.mark.parametrize("method", ODD_METHODS)
def test_odd_methods_get_a_4xx(
    bad_stack: Stack, hit_uid: int, method: str, where: str
) -> None:
    target = bad_stack.sign(mount(where, f"/getMessages?user_id={hit_uid}"))
    x = exchange(port_of(bad_stack, where), request(method, target), expect=1)
    assert_4xx(x, method)
    if (
        where == "poller"
    ):  # the poll server itself: 405 with Allow (or 400: not a method at all)
        assert x.responses[0].status in (400, 405), x.statuses
    assert_alive(bad_stack, hit_uid)


# ---- sizes --------------------------------------------------------------------------


def sizes_cases(stack: Stack, uid: int, where: str) -> dict[str, bytes]:
    target = stack.sign(mount(where, f"/getMessages?user_id={uid}"))
    flood = "".join(f"X-Flood-{i}: {i}\r\n" for i in range(6000))
    return {
        "header flood": f"GET {target} HTTP/1.1\r\nHost: x\r\n{flood}\r\n".encode(),
        "one 64k header": request("GET", target, {"X-Big": "a" * 65536}),
        "100k URI": request(
            "GET", mount(where, "/getMessages?user_id=1&pad=" + "p" * 100_000)
        ),
        "200k body": request("POST", target, body=b"x" * 200_000),
        "chunked body too large": request(
            "POST",
            target,
            {"Transfer-Encoding": "chunked"},
            b"20000\r\n" + b"y" * 0x20000 + b"\r\n0\r\n\r\n",
        ),
    }


@pytest.mark.parametrize("where", WHERE)
def test_oversized_heads_uris_and_bodies_get_a_4xx(
    bad_stack: Stack, hit_uid: int, where: str
) -> None:
    for name, data in sizes_cases(bad_stack, hit_uid, where).items():
        x = exchange(port_of(bad_stack, where), data, expect=1, timeout=10)
        assert_4xx(x, name)
        assert x.responses[0].status in (400, 413, 414, 431, 494), (name, x.statuses)
    assert_alive(bad_stack, hit_uid)


@pytest.mark.parametrize("where", WHERE)
def test_huge_declared_body_is_refused_or_cut_off(
    bad_stack: Stack, hit_uid: int, where: str
) -> None:
    """10 MB declared, 1 KB sent, then the client waits. nginx refuses it from the header
    (413). The poll server reads and discards a too-large body before it answers 413 (so the
    client sees the 413, not a reset); this client never sends the rest, so the request's
    time limit closes the connection: bounded, no answer, no hang."""
    target = bad_stack.sign(mount(where, f"/getMessages?user_id={hit_uid}"))
    data = request("POST", target, {"Content-Length": "10000000"}, b"x" * 1000)
    x = exchange(
        port_of(bad_stack, where), data, expect=1, timeout=REQUEST_TIMEOUT_S + 8
    )
    if where == "nginx":
        assert x.statuses == [413], x.statuses
    else:
        assert x.responses == [] and x.closed, x
        assert x.seconds < REQUEST_TIMEOUT_S + 3, x.seconds
    assert_alive(bad_stack, hit_uid)


@pytest.mark.parametrize("where", WHERE)
def test_very_long_query_strings(bad_stack: Stack, hit_uid: int, where: str) -> None:
    """Up to the head limit a long query is an ordinary poll: its extra parameters are not
    keyed, so it is the user's key (signed: 200 from the cache; unsigned: 403). Beyond the
    limit it is refused."""
    junk = "&".join(f"p{i}={'v' * 20}" for i in range(100))  # 2.5 KB, twice: < 8 KB
    port = port_of(bad_stack, where)
    plain = mount(where, f"/getMessages?{junk}&user_id={hit_uid}&{junk}")
    x = exchange(port, request("GET", bad_stack.sign(plain)), expect=1)
    assert x.statuses == [200] and x.responses[0].body == b'{"unread":1}', x.statuses
    x = exchange(port, request("GET", plain), expect=1)
    assert x.statuses == [403], x.statuses
    # A keyed value that makes the key too long cannot be keyed, so cannot be signed.
    x = exchange(
        port,
        request("GET", mount(where, "/getMessages?user_id=" + "9" * 400)),
        expect=1,
    )
    assert_4xx(x, "keyed value over the key limit")
    assert_alive(bad_stack, hit_uid)


# ---- percent-encoded control bytes, dot segments ---------------------------------------

ENCODED = [
    "/getMessages?user_id=1%0D%0Aflush_all",
    "/getMessages?user_id=1%0Aflush_all",
    "/getMessages?user_id=1%0D",
    "/getMessages?user_id=1%20get%20x",
    "/getMessages?user_id=1+2",
    "/getMessages?user_id=1%00",
    "/getMessages?user_id=%00",
    "/getMessages?user_id=1%7F",
    "/getMessages?user_id=1%",
    "/getMessages?user_id=1%G0",
    "/getMessages?user%5Fid=1%0D%0Adelete%20x",
    "/get%0D%0AMessages?user_id=1",
    "/get%0AMessages?user_id=1",
    "/get%20Messages?user_id=1",
    "/get%00Messages?user_id=1",
    "/getMessages%0D%0Aflush_all?user_id=1",
    "/getMessages?user_id=1&user_id=2",
]

DOTS = [
    "/a/../getMessages?user_id=1",
    "/./getMessages?user_id=1",
    "/getMessages/..?user_id=1",
    "/%2e%2e/getMessages?user_id=1",
    "/a/%2E%2E/getMessages?user_id=1",
    "/../../../etc/passwd",
    "/..%2f..%2fetc/passwd",
]


@pytest.mark.parametrize("where", WHERE)
def test_encoded_control_bytes_and_dot_segments_get_a_4xx(
    bad_stack: Stack, hit_uid: int, where: str
) -> None:
    cache = Cache(bad_stack)
    before = cache.gets_served()
    for target in ENCODED + DOTS:
        t = mount(where, target)
        signed = bad_stack.sign(t)
        # A request with no valid key cannot be signed; through nginx, a path nginx
        # normalises (dot segments) may become a valid one: then it is that one's poll.
        x = exchange(port_of(bad_stack, where), request("GET", signed), expect=1)
        assert x.responses, target
        st = x.responses[0].status
        assert 400 <= st < 500 or (st == 200 and where == "nginx" and signed != t), (
            target,
            st,
        )
    if where == "poller":
        assert cache.gets_served() == before, "an invalid key reached the cache"
    assert_alive(bad_stack, hit_uid)


# ---- pipelining, garbage ----------------------------------------------------------------


@pytest.mark.parametrize("where", WHERE)
def test_pipelined_requests_answered_in_order(
    bad_stack: Stack, hit_uid: int, where: str
) -> None:
    hit = bad_stack.sign(mount(where, f"/getMessages?user_id={hit_uid}"))
    miss = bad_stack.sign(mount(where, f"/getMessages?user_id={new_uid()}"))
    unsigned = mount(where, f"/getMessages?user_id={hit_uid}")
    data = b"".join(
        [
            request("GET", hit),
            request("HEAD", hit),
            request("GET", unsigned),
            request("POST", hit, body=b"a=1&b=2"),
            request("GET", miss),
            request("GET", hit, {"Connection": "close"}),
        ]
    )
    x = exchange(port_of(bad_stack, where), data, expect=6, head_for={1})
    miss_status = 404 if where == "poller" else 200  # nginx: the app answers the miss
    assert x.statuses == [200, 200, 403, 200, miss_status, 200], x.statuses
    assert [r.body for r in x.responses[:2]] == [b'{"unread":1}', b""]
    assert x.responses[1].header("content-length") == "12"


@pytest.mark.parametrize("where", WHERE)
def test_pipelined_bad_request_ends_the_connection_cleanly(
    bad_stack: Stack, hit_uid: int, where: str
) -> None:
    hit = bad_stack.sign(mount(where, f"/getMessages?user_id={hit_uid}"))
    data = request("GET", hit) + b"GARBAGE\r\n\r\n" + request("GET", hit)
    x = exchange(port_of(bad_stack, where), data, timeout=5)
    assert x.statuses[:2] == [200, 400], x.statuses
    assert x.closed
    assert_alive(bad_stack, hit_uid)


@pytest.mark.parametrize("where", WHERE)
def test_binary_garbage(bad_stack: Stack, hit_uid: int, where: str) -> None:
    rnd = random.Random(5)
    port = port_of(bad_stack, where)
    for n in range(20):
        junk = bytes(rnd.randrange(256) for _ in range(rnd.randrange(1, 2000)))
        x = exchange(port, junk + b"\r\n\r\n", expect=1)
        assert_4xx(x, f"garbage #{n}")
    tls_hello = bytes.fromhex("16030100a5010000a10303") + bytes(
        rnd.randrange(256) for _ in range(160)
    )
    x = exchange(port, tls_hello + b"\r\n\r\n", expect=1)
    assert_4xx(x, "TLS ClientHello")
    # No line end at all: refused once it outgrows the head limit.
    x = exchange(
        port, bytes(rnd.randrange(1, 10) for _ in range(200_000)), expect=1, timeout=10
    )
    assert_4xx(x, "200 KB without a line end")
    assert_alive(bad_stack, hit_uid)


# ---- slowloris --------------------------------------------------------------------------


def slowloris(port: int, n: int, interval: float, limit: float) -> dict[int, float]:
    """n connections, each sending one more byte of a request head every `interval` seconds,
    never finishing it. Returns, per connection, when the server closed it (seconds)."""
    socks = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(n)]
    for s in socks:
        s.setblocking(False)
    head = b"GET /getMessages?user_id=1 HTTP/1.1\r\nHost: x\r\nX-Slow: "
    closed: dict[int, float] = {}
    t0 = time.monotonic()
    i = 0
    while len(closed) < n and time.monotonic() - t0 < limit:
        for k, s in enumerate(socks):
            if k in closed:
                continue
            try:
                s.send(head[i : i + 1] if i < len(head) else b"a")
                if s.recv(4096) == b"":
                    closed[k] = time.monotonic() - t0
            except BlockingIOError:
                pass
            except OSError:
                closed[k] = time.monotonic() - t0
        i += 1
        time.sleep(interval)
    for s in socks:
        s.close()
    return closed


@pytest.mark.parametrize("where", WHERE)
def test_slowloris_is_cut_off_and_others_are_served(
    bad_stack: Stack, hit_uid: int, where: str
) -> None:
    """100 connections, a byte every 0.5 s: never idle, so only a limit on the whole request
    closes them: request_timeout_ms on the poll server, client_header_timeout on nginx."""
    port = port_of(bad_stack, where)
    limit_s = REQUEST_TIMEOUT_S if where == "poller" else NGINX_HEADER_TIMEOUT_S
    served: list[int] = []
    stop = threading.Event()

    def others() -> None:
        target = bad_stack.sign(mount(where, f"/getMessages?user_id={hit_uid}"))
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=5) as c:
            while not stop.is_set():
                served.append(c.get(target).status_code)
                time.sleep(0.05)

    t = threading.Thread(target=others)
    t.start()
    try:
        closed = slowloris(port, 100, interval=0.5, limit=limit_s + 10)
    finally:
        stop.set()
        t.join()
    assert len(closed) == 100, f"{100 - len(closed)} slow connections still open"
    # Closed by the total limit (they were never idle for 0.5 s), not much later.
    assert max(closed.values()) < limit_s + 3, sorted(closed.values())[-5:]
    assert min(closed.values()) > limit_s * 0.5, sorted(closed.values())[:5]
    assert served and set(served) == {200}, served[:20]


def test_slowloris_on_a_keepalive_connection(bad_stack: Stack, hit_uid: int) -> None:
    """One good request, then the next one trickles: the poll server closes it within
    idle_timeout_ms + request_timeout_ms of the answer."""
    target = bad_stack.sign(f"/getMessages?user_id={hit_uid}")
    with socket.create_connection(
        ("127.0.0.1", bad_stack.poller_ports[0]), timeout=5
    ) as s:
        s.sendall(request("GET", target))
        assert s.recv(4096).startswith(b"HTTP/1.1 200")
        t0 = time.monotonic()
        s.settimeout(0.5)
        gone = None
        while time.monotonic() - t0 < IDLE_TIMEOUT_S + REQUEST_TIMEOUT_S + 10:
            try:
                s.send(b"G")
                if s.recv(4096) == b"":
                    gone = time.monotonic() - t0
                    break
            except TimeoutError:
                continue
            except OSError:
                gone = time.monotonic() - t0
                break
    assert gone is not None and gone < IDLE_TIMEOUT_S + REQUEST_TIMEOUT_S + 3, gone


# ---- protocol injection -------------------------------------------------------------------

INJECTIONS = [
    "/getMessages?user_id=1%0D%0Aflush_all",
    "/getMessages?user_id=1%0D%0Aflush_all%0D%0A",
    "/getMessages?user_id=1%0D%0Adelete%20{canary}",
    "/getMessages?user_id=1%0D%0Adelete%20{canary}%0D%0Aget%20x",
    "/getMessages?user_id=1%0Aset%20{canary}%200%200%201%0Ax",
    "/getMessages?user_id=1%20%0D%0Aflush_all",
    "/getMessages?user_id=1%00%0D%0Aflush_all",
    "/getMessages?user_id=1+flush_all",
    "/getMessages%0D%0Aflush_all?user_id=1",
    "/getMessages%0D%0Adelete%20{canary}?user_id=1",
    "/getMessages?user_id=1&user_id=%0D%0Aflush_all",
    "/getMessages?user%5Fid=%0D%0Aflush_all",
    "/getMessages?user_id=1%0D%0AFLUSHALL%0D%0A",
    "/getMessages?user_id=*3%0D%0A$3%0D%0ADEL%0D%0A",
    "/getMessages?user_id=1%0D%0ADEL%20{canary}",
    "/getMessages?user_id=" + "%0D%0Aflush_all" * 20,
]

CANARY_VALUE = b"canary-must-survive"


@pytest.fixture(
    scope="module",
    params=[
        ("memcached", True),
        ("memcached", False),
        ("redis", True),
        ("redis", False),
    ],
    ids=["memcached-signed", "memcached-unsigned", "redis-signed", "redis-unsigned"],
)
def injection_stack(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    """Signed and unsigned: unsigned, the key rules alone must stop the injection."""
    backend, signing = request.param
    s = Stack(
        run_dir=tmp_path_factory.mktemp(f"inject-{backend}"),
        backend=backend,
        n_memcached=2,
        n_pollers=1,
        signing=signing,
        memcached_args=["-vv"],  # memcached logs every command it receives
    )
    s.start()
    yield s
    s.stop()
    reports = s.sanitizer_reports()
    assert not reports, "\n".join(reports[:20])


class RedisMonitor:
    """Every command Redis receives, from MONITOR, on a thread."""

    def __init__(self, stack: Stack) -> None:
        password = (stack.run_dir / "redis.pass").read_text().strip()
        self.r = redis.Redis(host="127.0.0.1", port=stack.redis_port, password=password)
        self.commands: list[str] = []
        self._mon = self.r.monitor()
        self._mon.connection.send_command("MONITOR")
        assert self._mon.connection.read_response() in (b"OK", "OK")
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            for event in self._mon.listen():
                self.commands.append(event["command"])
        except (redis.ConnectionError, OSError, ValueError):
            pass

    def stop(self) -> None:
        self.r.ping()  # a last command to flush the stream
        time.sleep(0.3)
        self._mon.connection.disconnect()
        self._thread.join(timeout=5)


# Connection set-up (hiredis, redis-py, pylibmc) and the tests' own statistics.
CONNECTION_COMMANDS = {"auth", "hello", "select", "client", "ping", "info", "monitor"}
CONNECTION_COMMANDS |= {"version", "stats", "command"}
CONNECTION_COMMANDS |= {"mn"}  # the poll server asks memcached whether it speaks meta commands
# The announcement subscriber's liveness check: SUBSCRIBE to its channel again, every
# [server] announce_ping_ms (poll_server/src/announce.c)
CONNECTION_COMMANDS |= {"subscribe"}
SAFE_KEY = re.compile(
    r"/Poll/[!-~]{0,245}"
)  # prefix, then printable ASCII without spaces


def test_protocol_injection_leaves_every_cached_value_in_place(
    injection_stack: Stack,
) -> None:
    stack = injection_stack
    cache = Cache(stack)
    canaries = [f"canary-{i}" for i in range(5)] + [
        poll_key(new_uid()) for _ in range(5)
    ]
    for c in canaries:
        cache.set(c, CANARY_VALUE)
    monitor = RedisMonitor(stack) if stack.backend == "redis" else None
    try:
        for target in INJECTIONS:
            t = target.format(canary=canaries[0])
            for where in WHERE:
                for method in ("GET", "HEAD", "POST"):
                    m = mount(where, t)
                    x = exchange(
                        port_of(stack, where),
                        request(method, m, body=b"x" if method == "POST" else b""),
                        expect=1,
                        head_for={0} if method == "HEAD" else None,
                    )
                    assert x.responses, (where, t)
                    # unsigned: invalid keys are 404 -> the app, which refuses them (400)
                    assert 400 <= x.responses[0].status < 500, (
                        where,
                        method,
                        t,
                        x.statuses,
                    )
        # A valid read still works, so the checks below saw a live connection.
        hit = stack.sign(f"/getMessages?user_id={canaries[5].rsplit('=', 1)[1]}")
        r = httpx.get(f"http://127.0.0.1:{stack.poller_ports[0]}{hit}", timeout=5)
        assert (r.status_code, r.content) == (200, CANARY_VALUE)
    finally:
        if monitor:
            monitor.stop()
    for c in canaries:
        assert cache.get(c) == CANARY_VALUE, f"{c} was changed or deleted"

    if stack.backend == "memcached":
        commands = memcached_commands(stack)
        reads = [c for c in commands if c.startswith(("get ", "mg "))]
    else:
        assert monitor is not None
        commands = monitor.commands
        reads = [c for c in commands if c.startswith("GET ")]
    assert reads, "no read reached the cache: the wire log is not working"
    for c in commands:
        verb, _, rest = c.partition(" ")
        if (
            verb.lower() == "get"
        ):  # the poll server's (and the tests') reads: one safe key each
            assert SAFE_KEY.fullmatch(rest) or rest in canaries, f"unsafe read {c!r}"
        elif verb == "mg":  # the poll server's meta reads: "mg <safe key> v k f"
            key, _, flags = rest.partition(" ")
            assert flags == "v k f", f"unexpected meta read {c!r}"
            # fastpoll:probe: with replicas, an idle node is read once a second (a fixed key)
            assert (
                SAFE_KEY.fullmatch(key) or key in canaries or key == "fastpoll:probe"
            ), f"unsafe read {c!r}"
        elif verb.lower() in ("set", "add"):  # this test's canaries, the app's fills
            key = rest.split(" ", 1)[0]
            assert SAFE_KEY.fullmatch(key) or key in canaries, f"unexpected write {c!r}"
        else:  # connection set-up and the tests' own statistics; nothing else
            assert verb.lower() in CONNECTION_COMMANDS, c
        assert not re.search(r"flush|delete|\bdel\b", c, re.IGNORECASE), c


def memcached_commands(stack: Stack) -> list[str]:
    """What every memcached node received, from its -vv log ("<fd command")."""
    out: list[str] = []
    for i in range(len(stack.memcached_ports)):
        for line in (
            (stack.run_dir / f"memcached-{i}.log")
            .read_text(errors="replace")
            .splitlines()
        ):
            m = re.match(r"<\d+ (.*)", line)
            if m and not m.group(1).startswith(
                ("new ", "connection closed", "server listening")
            ):
                out.append(m.group(1))
    return out


@pytest.mark.parametrize("where", WHERE)
def test_keepalive_request_then_large_post(
    bad_stack: Stack, hit_uid: int, where: str
) -> None:
    """A poll, then on the same connection a POST whose body is larger than the head limit
    (within the body limit): both answered. A read watermark left over from the first request's
    wait once stalled the second body (answer never came; found under valgrind as a leak)."""
    hit = bad_stack.sign(mount(where, f"/getMessages?user_id={hit_uid}"))
    body = bytes(range(256)) * 80  # 20 KB
    data = request("GET", hit) + request("POST", hit, body=body)
    x = exchange(
        port_of(bad_stack, where), data, expect=2, timeout=REQUEST_TIMEOUT_S + 3
    )
    assert x.statuses == [200, 200], (x.statuses, x.closed)
    assert [r.body for r in x.responses] == [b'{"unread":1}'] * 2
