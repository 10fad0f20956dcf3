"""Helpers for tests on a running stack: direct cache access the way the app writes it, signing
HTTP clients, fresh user ids, poller metrics, primed users and load checks."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import itertools
import time
from pathlib import Path
from types import ModuleType
from typing import Any, cast

import httpx
import pylibmc
import redis

from fastpoll_testkit.loadgen import Load, LoadResult
from fastpoll_testkit.stack import Stack, memcached_stats

_uids = itertools.count(1000)


def load_script(path: Path, name: str) -> ModuleType:
    """A script without a .py suffix (one the roles install on hosts) imported as a module."""
    loader = importlib.machinery.SourceFileLoader(name, str(path))
    spec = importlib.util.spec_from_loader(name, loader)
    assert spec is not None
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


class Cache:
    """Direct access to the stack's cache, the way the app writes it (same ketama, same keys)."""

    def __init__(self, stack: Stack) -> None:
        self.stack = stack
        self.backend = stack.backend
        if self.backend == "memcached":
            servers = [f"127.0.0.1:{p}" for p in stack.memcached_ports]
            self.mc = pylibmc.Client(servers, binary=False, behaviors={"ketama": True})
        else:
            password = (stack.run_dir / "redis.pass").read_text().strip()
            self.r = redis.Redis(
                host="127.0.0.1", port=stack.redis_port, password=password
            )

    def set(self, key: str, value: bytes) -> None:
        if self.backend == "memcached":
            assert self.mc.set(key, value)
        else:
            self.r.set(key, value)

    def get(self, key: str) -> bytes | None:
        if self.backend == "memcached":
            return self.mc.get(key)
        # redis-py's stubs say bytes | str whatever decode_responses is; without it, it is bytes.
        return cast("bytes | None", self.r.get(key))

    def delete(self, key: str) -> None:
        if self.backend == "memcached":
            self.mc.delete(key)
        else:
            self.r.delete(key)

    def gets_served(self) -> int:
        """How many reads the cache servers have answered, summed over every node."""
        if self.backend == "memcached":
            return sum(
                memcached_stats(p)["cmd_get"] for p in self.stack.memcached_ports
            )
        return int(self.r.info("commandstats").get("cmdstat_get", {}).get("calls", 0))


# nginx keeps a poller's failure mark for fail_timeout (the template's 2 s), compared in whole
# seconds of its clock (ngx_time()): a mark made early in a second lasts up to 3 s. Tests that
# wait for a poller to be back in the rotation wait this long.
NGINX_FAIL_WAIT_S = 3.2


def new_uid() -> int:
    """A user id no other test has touched, so tests never share cache keys."""
    return next(_uids)


def poll_key(uid: int) -> str:
    return f"/Poll/getMessages?user_id={uid}"


class SigningTransport(httpx.HTTPTransport):
    """Signs each poll request it sends, as a client holding a URL from the app's
    POST /api/poll-url would: exp and sig appended (docs/security.md). Through nginx only
    /Poll/ targets are polls; a poll server (direct=True) takes nothing else."""

    def __init__(self, stack: Stack, direct: bool) -> None:
        super().__init__()
        self.stack = stack
        self.direct = direct

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        target = request.url.raw_path.decode("latin-1")
        if self.direct or target.startswith("/Poll/"):
            signed = self.stack.sign(target)
            if signed != target:
                request.url = request.url.copy_with(raw_path=signed.encode("latin-1"))
        return super().handle_request(request)


def http_client(
    stack: Stack, port: int | None = None, sign: bool = True, timeout: float = 10
) -> httpx.Client:
    """A client of nginx, or of the poll server on `port`; it signs its polls unless told not to."""
    base = f"http://127.0.0.1:{port}" if port else stack.base_url
    transport = SigningTransport(stack, direct=port is not None) if sign else None
    return httpx.Client(base_url=base, timeout=timeout, transport=transport)


def poller_metric(stack: Stack, name: str, timeout: float = 30) -> float:
    """One sample of poller 0's /metrics (name with its labels, as printed)."""
    text = httpx.get(f"http://127.0.0.1:{stack.admin_ports[0]}/metrics", timeout=timeout).text
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    raise AssertionError(f"no {name} on /metrics")


def start_stack(tmp: Path, backend: str, **kw: Any) -> Stack:
    stack = Stack(run_dir=tmp, backend=backend, **kw)
    stack.start()
    return stack


def prime(stack: Stack, n: int = 100) -> list[str]:
    """n users whose answers are cached (the app filled them); their signed poll URLs."""
    uids = [new_uid() for _ in range(n)]
    urls = [stack.poll_url(u) for u in uids]
    with httpx.Client(base_url=stack.base_url, timeout=10) as c:
        for url in urls:
            assert c.get(url).status_code == 200
        for url in urls:
            assert c.get(url).headers["x-poll-source"] == "cache", url
    return urls


def assert_no_failures(r: LoadResult, what: str) -> None:
    assert r.requests > 0, f"{what}: no requests ({r.summary()})"
    assert r.failed == 0, f"{what}: {r.failed} failed: {r.summary()}"


def at(load: Load, second: float) -> None:
    """Sleep until `second` seconds after the load started."""
    time.sleep(max(0.0, load.started + second - time.monotonic()))
