"""Stand-alone processes for tests without the whole stack: a poll server and its memcached or
Redis started by the test itself on free loopback ports, stopped by pid at the end."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from fastpoll_testkit.procs import Server, free_port, memcached_argv, wait_for
from fastpoll_testkit.stack import POLL_SERVER, POLL_WRAPPER, SANITIZER_REPORT, tcp_ask


@dataclass
class Poller:
    proc: Server
    port: int
    admin: int
    ini: Path

    def status(self, uid: int, timeout: float = 5) -> int:
        return self.get(uid, timeout).status_code

    def get(self, uid: int, timeout: float = 5) -> httpx.Response:
        return httpx.get(
            f"http://127.0.0.1:{self.port}/getMessages?user_id={uid}", timeout=timeout
        )

    def metrics(self) -> str:
        return httpx.get(f"http://127.0.0.1:{self.admin}/metrics", timeout=5).text

    def metric(self, series: str) -> float:
        for line in self.metrics().splitlines():
            if line.startswith(series + " "):
                return float(line.rsplit(" ", 1)[1])
        raise AssertionError(f"no {series} in /metrics")

    def log(self) -> str:
        assert self.proc.log is not None
        return self.proc.log.read_text(errors="replace")


@dataclass
class Procs:
    """Processes this test started, stopped by pid at the end."""

    dir: Path
    started: list[Server] = field(default_factory=list)

    def spawn(self, name: str, argv: list[str]) -> Server:
        """Start argv, its output to name.log; the caller waits for it (p.popen)."""
        p = Server(name, argv, log=self.dir / f"{name}.log", new_session=True)
        self.started.append(p)
        p.spawn()
        return p

    def memcached(self, *extra: str) -> int:
        port = free_port()
        p = self.spawn(f"memcached-{port}", memcached_argv(port, *extra))
        wait_for(
            "memcached", lambda: tcp_ask(port, b"version\r\n", b"VERSION"), proc=p.popen
        )
        return port

    def redis(self, *conf_lines: str) -> int:
        port = free_port()
        conf = self.dir / f"redis-{port}.conf"
        conf.write_text(
            f'port {port}\nbind 127.0.0.1\nsave ""\nappendonly no\ndir {self.dir}\n'
            + "".join(line + "\n" for line in conf_lines)
        )
        p = self.spawn(f"redis-{port}", ["redis-server", str(conf)])
        # any answer (an ACL test turns the default user off: -NOAUTH)
        wait_for("redis", lambda: tcp_ask(port, b"PING\r\n", b"\r\n"), proc=p.popen)
        return port

    def sentinel(
        self,
        master_port: int,
        master_name: str,
        *conf_lines: str,
        quorum: int = 2,
        port: int | None = None,
        auth_pass: str = "",
        requirepass: str = "",
    ) -> int:
        """A Redis Sentinel (redis-server --sentinel, what Debian's redis-sentinel runs) watching
        the master on 127.0.0.1:master_port as master_name; `conf_lines` follow its `sentinel
        monitor` line (down-after-milliseconds, ...). auth_pass: the master's password;
        requirepass: the one the sentinel asks of its clients. Its config file is its own (Sentinel
        rewrites it). Returns its port (`port`, or a free one) once it answers PING."""
        port = port or free_port()
        conf = self.dir / f"sentinel-{port}.conf"
        conf.write_text(
            f"port {port}\nbind 127.0.0.1\ndir {self.dir}\n"
            + (f"requirepass {requirepass}\n" if requirepass else "")
            + f"sentinel monitor {master_name} 127.0.0.1 {master_port} {quorum}\n"
            + (f"sentinel auth-pass {master_name} {auth_pass}\n" if auth_pass else "")
            + "".join(line + "\n" for line in conf_lines)
        )
        p = self.spawn(f"sentinel-{port}", ["redis-server", str(conf), "--sentinel"])
        # +PONG, or -NOAUTH when it asks its clients for a password: up either way
        wait_for(
            "sentinel",
            lambda: tcp_ask(port, b"PING\r\n", b"\r\n"),
            proc=p.popen,
            logs=[self.dir / f"{p.name}.log"],
        )
        return port

    def poller(
        self,
        ini: dict[str, dict[str, str]],
        prefix: list[str] | None = None,
        wait: bool = True,
    ) -> Poller:
        port, admin = free_port(), free_port()
        ini = {k: dict(v) for k, v in ini.items()}
        ini.setdefault("server", {}).setdefault("listen", "127.0.0.1")
        ini["server"]["port"] = str(port)
        ini.setdefault("admin", {}).update({"port": str(admin)})
        ini.setdefault("keys", {"prefix": "/Poll", "params": "user_id"})
        path = self.dir / f"poller-{port}.ini"
        text = "".join(
            f"[{s}]\n" + "".join(f"{k} = {v}\n" for k, v in kv.items())
            for s, kv in ini.items()
        )
        path.write_text(text)
        argv = [*(prefix or []), *POLL_WRAPPER, str(POLL_SERVER), "-c", str(path)]
        p = self.spawn(f"poller-{port}", argv)
        poller = Poller(p, port, admin, path)
        if wait:
            wait_for(
                "poll server",
                lambda: poller.status(-1) in (200, 404, 503),
                proc=p.popen,
                logs=[self.dir / f"{p.name}.log"],
            )
        return poller

    def stop(self) -> None:
        for p in reversed(self.started):
            p.stop()  # SIGCONT first: a frozen one would not take SIGTERM

    def sanitizer_reports(self) -> list[str]:
        return [
            f"{p.log.name}: {line.decode(errors='replace')}"
            for p in self.started
            if p.name.startswith("poller") and p.log is not None and p.log.exists()
            for line in p.log.read_bytes().splitlines()
            if SANITIZER_REPORT.search(line)
        ]


def own_procs(tmp_path: Path) -> Iterator[Procs]:
    """The body of a `procs` fixture (test_sentinel.py has one too)."""
    ps = Procs(tmp_path)
    yield ps
    ps.stop()
    reports = ps.sanitizer_reports()
    assert not reports, "\n".join(reports[:20])


def key(uid: int) -> str:
    return f"/Poll/getMessages?user_id={uid}"


def redis_cmd(port: int, *args: str) -> bytes:
    cmd = f"*{len(args)}\r\n".encode() + b"".join(
        f"${len(a.encode())}\r\n{a}\r\n".encode() for a in args
    )
    with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
        s.sendall(cmd)
        return s.recv(65536)
