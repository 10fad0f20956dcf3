"""Processes and ports for every test, check and drill: the one free_port, wait_port and
wait_for, and Server, the handle of a server process a test started (standard library only, so
the poll server's stand-alone checks and the webhook receiver can import it too).

kill(pid, SIGSTOP) returns before the process has stopped: the kernel wakes one thread to take
the stop and that thread tells the others. On a busy machine a memcached worker thread can go on
answering for tens of milliseconds, so a test that "hangs" a server and sends requests at once
may see them answered. freeze() returns only when every thread is stopped.
"""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO


def _all_stopped(pid: int) -> bool:
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return True  # gone: nothing left to answer
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat", encoding="ascii") as f:
                stat = f.read()
        except FileNotFoundError:
            continue  # a thread that exited
        # The state follows the parenthesised command name, which may hold spaces.
        if stat[stat.rindex(")") + 2] not in "Tt":
            return False
    return True


def freeze(pid: int, timeout: float = 5.0) -> None:
    """SIGSTOP pid and wait until all of its threads are stopped."""
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + timeout
    while not _all_stopped(pid):
        if time.monotonic() > deadline:
            raise TimeoutError(f"pid {pid} not stopped {timeout:.0f} s after SIGSTOP")
        time.sleep(0.001)


def terminate(
    popen: subprocess.Popen[bytes], timeout: float = 10.0, sig: int = signal.SIGTERM
) -> None:
    """Signal a process this test started (SIGTERM unless sig says otherwise), SIGKILL it if it
    is still there after timeout."""
    if popen.poll() is not None:
        return
    popen.send_signal(sig)
    try:
        popen.wait(timeout)
    except subprocess.TimeoutExpired:
        popen.kill()
        popen.wait()


# ---- ports ----------------------------------------------------------------------------------


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


_handed_out: set[int] = set()


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody uses on host right now, below the kernel's ephemeral range: a port from
    that range can be taken between now and the server's bind() by any outgoing connection (the
    pollers' to memcached, say), and the server then fails with EADDRINUSE. Never the same port
    twice in one process: a stack picks all its ports before its servers bind them. (Only when
    the range starts below 11000 is it a port the kernel picks.)"""
    low = _ephemeral_low()
    for _ in range(200 if low > 11000 else 0):
        port = random.randrange(10000, low)
        if port in _handed_out:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            _handed_out.add(port)
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


# ---- waiting --------------------------------------------------------------------------------


def _log_tail(logs: list[Path], lines: int = 5) -> str:
    """The last lines of the first of these logs with anything in it."""
    for log in logs:
        try:
            tail = log.read_text(errors="replace").splitlines()[-lines:]
        except OSError:
            continue
        if tail:
            return f"; {log}:\n" + "\n".join(tail)
    return ""


def _refusals() -> tuple[type[BaseException], ...]:
    """The errors of a server that does not answer yet: the socket's own (OSError), and httpx's
    for a check made through an httpx client (httpx.TransportError is not an OSError). A check
    that raises httpx's has imported it; this module does not need it."""
    httpx = sys.modules.get("httpx")
    return (OSError,) if httpx is None else (OSError, httpx.TransportError)


def wait_for(
    what: str,
    check: Callable[[], object],
    timeout: float = 30.0,
    proc: subprocess.Popen[bytes] | None = None,
    logs: list[Path] | None = None,
    interval: float = 0.05,
    retry_on: tuple[type[BaseException], ...] | None = None,
) -> float:
    """Call check() every `interval` s until it returns something true; the seconds that took.
    An exception of retry_on counts as not yet (default: a refused connection, OSError or
    httpx.TransportError; () for none: a check that raises fails at once). Raises RuntimeError
    naming `what` after timeout s, or at once when proc exits meanwhile (with the tail of the
    first of logs that has any)."""
    t0 = time.monotonic()
    deadline = t0 + timeout
    last: BaseException | None = None
    refusals = _refusals() if retry_on is None else retry_on
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(
                f"{what} exited with status {proc.returncode} while starting"
                + _log_tail(logs or [])
            )
        try:
            if check():
                return time.monotonic() - t0
        except refusals as e:
            last = e
        time.sleep(interval)
    raise RuntimeError(f"{what} did not become healthy within {timeout:.0f}s ({last})")


def wait_port(
    port: int,
    proc: subprocess.Popen[bytes] | None = None,
    timeout: float = 10.0,
    what: str = "",
    host: str = "127.0.0.1",
) -> float:
    """Wait until host:port accepts a TCP connection (see wait_for); proc: the process that is
    to listen there, whose exit meanwhile fails at once."""

    def listening() -> bool:
        socket.create_connection((host, port), timeout=0.2).close()
        return True

    return wait_for(what or f"port {port}", listening, timeout, proc=proc)


# ---- a server process -----------------------------------------------------------------------


class Server:
    """A server process this test started: start() spawns argv and waits until ready() holds
    (default: until port accepts connections; neither: no wait; an early exit shows the tail of
    the first of logs with anything in it, default [log]), and may be called again after
    stop() (the same argv: the same port). stop() signals the pid (SIGCONT first: a frozen
    process would not take the signal), stop_signal (SIGTERM) then SIGKILL after stop_timeout,
    and returns the exit status. Never by name. Its stdout and stderr go to log (appended; with
    stdout=False only its stderr), else nowhere."""

    def __init__(
        self,
        name: str,
        argv: list[str],
        port: int = 0,
        *,
        log: Path | None = None,
        ready: Callable[[], object] | None = None,
        timeout: float = 10.0,
        logs: list[Path] | None = None,
        stop_signal: int = signal.SIGTERM,
        stop_timeout: float = 10.0,
        env: dict[str, str] | None = None,
        cwd: str | Path | None = None,
        user: str | None = None,
        new_session: bool = False,
        stdout: bool = True,
    ) -> None:
        self.name, self.argv, self.port, self.log = name, argv, port, log
        self.ready, self.timeout = ready, timeout
        self.logs = logs if logs is not None else [log] if log is not None else []
        self.stop_signal, self.stop_timeout = stop_signal, stop_timeout
        self.env, self.cwd, self.user, self.new_session = env, cwd, user, new_session
        self.stdout = stdout
        self._popen: subprocess.Popen[bytes] | None = None

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def popen(self) -> subprocess.Popen[bytes]:
        """The process of the last start (RuntimeError before the first)."""
        if self._popen is None:
            raise RuntimeError(f"{self.name} was never started")
        return self._popen

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def running(self) -> bool:
        return self._popen is not None and self._popen.poll() is None

    def spawn(self) -> subprocess.Popen[bytes]:
        """Start it without waiting."""
        if self.log is None:
            self._popen = self._spawn(subprocess.DEVNULL)
        else:
            with open(self.log, "ab") as out:
                self._popen = self._spawn(out)
        return self._popen

    def _spawn(self, out: IO[bytes] | int) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            self.argv,
            stdin=subprocess.DEVNULL,
            stdout=out if self.stdout else subprocess.DEVNULL,
            stderr=out,
            env=self.env,
            cwd=self.cwd,
            user=self.user,
            start_new_session=self.new_session,
        )

    def wait_ready(self) -> float:
        """Seconds until it was ready (see the class)."""
        if self.ready is not None:
            return wait_for(self.name, self.ready, self.timeout, proc=self.popen, logs=self.logs)
        if self.port:
            return wait_port(self.port, self.popen, self.timeout, self.name)
        return 0.0

    def start(self) -> Server:
        """Spawn and wait until ready; one that never gets ready is stopped before the error."""
        self.spawn()
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def freeze(self) -> None:
        """SIGSTOP, returning once every thread has stopped (freeze())."""
        freeze(self.pid)

    def thaw(self) -> None:
        """SIGCONT, if it is still there."""
        if self.running:
            os.kill(self.pid, signal.SIGCONT)

    def stop(self) -> int | None:
        """Stop it (see the class); its exit status (None: never started)."""
        popen = self._popen
        if popen is None:
            return None
        if popen.poll() is None:
            os.kill(popen.pid, signal.SIGCONT)
            terminate(popen, self.stop_timeout, self.stop_signal)
        return popen.returncode


def memcached_argv(port: int, *extra: str, binary: str = "memcached") -> list[str]:
    """A memcached on 127.0.0.1:port, TCP only, 64 MB (a later -m in extra wins); as nobody
    when we are root."""
    argv = [binary, "-l", "127.0.0.1", "-p", str(port), "-U", "0", "-m", "64", *extra]
    return argv + ["-u", "nobody"] if os.geteuid() == 0 else argv


def redis_argv(
    port: int, *extra: str, dir: Path | str | None = None, binary: str = "redis-server"
) -> list[str]:
    """A redis-server on 127.0.0.1:port that never writes its data (no save, no AOF)."""
    argv = [binary, "--bind", "127.0.0.1", "--port", str(port), "--save", "", "--appendonly", "no"]
    return argv + (["--dir", str(dir)] if dir is not None else []) + list(extra)


def start_memcached(
    *extra: str,
    binary: str = "memcached",
    log: Path | None = None,
    ready: Callable[[], object] | None = None,
) -> Server:
    """A memcached of its own on a free port (memcached_argv), started."""
    port = free_port()
    argv = memcached_argv(port, *extra, binary=binary)
    return Server(f"memcached-{port}", argv, port, log=log, ready=ready).start()


def start_redis(
    *extra: str,
    dir: Path | str | None = None,
    binary: str = "redis-server",
    log: Path | None = None,
    ready: Callable[[], object] | None = None,
) -> Server:
    """A redis-server of its own on a free port (redis_argv), started."""
    port = free_port()
    argv = redis_argv(port, *extra, dir=dir, binary=binary)
    return Server(f"redis-{port}", argv, port, log=log, ready=ready).start()
