"""The peers: stand-alone nginx instances the poll path is compared with, in the same run.

- return200:      nginx answers /Poll/ itself (`return 200` with the hot user's bytes): the ceiling.
- memcached_pass: nginx reads the same memcached with the same key through a keepalive upstream.
- ceiling:        nginx proxying, with the stack's proxy settings and upstream keep-alive, to
                  ceiling_back (nginx `return 200` on a unix socket): the design's ceiling.
- fastpoll_front: fastpoll's own site (nginx/fastpoll.conf.j2) in front of ceiling_back: what
                  the site's configuration costs nginx against the ceiling's (front_cost.py).

Each gets its own config rendered from loadtests/peers/*.conf.j2 into its own directory, a free
loopback port, and is stopped by the pid we started (never by name).
"""

from __future__ import annotations

import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import jinja2

from fastpoll_testkit.procs import Server, free_port
from fastpoll_testkit.stack import http_status  # the one stack harness

HERE = Path(__file__).resolve().parent

TEMPLATES = HERE / "peers"


@dataclass
class Peer:
    name: str  # a template in loadtests/peers/: return200, memcached_pass, ceiling, ...
    run_dir: Path
    tuning: dict[str, object]  # worker_processes, worker_connections, ... (same as the stack's)
    params: dict[str, object] = field(default_factory=dict)  # body / memcached / keepalive
    port: int = 0
    server: Server | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        return self.server.pid if self.server else 0

    def render(self) -> Path:
        self.port = self.port or free_port()
        for sub in ("body", "proxy", "fastcgi", "uwsgi", "scgi"):
            (self.run_dir / "tmp" / sub).mkdir(parents=True, exist_ok=True)
        env = jinja2.Environment(
            loader=jinja2.FileSystemLoader([TEMPLATES, HERE.parent / "nginx"]),
            undefined=jinja2.StrictUndefined,
            keep_trailing_newline=True,
        )
        conf = env.get_template(f"{self.name}.conf.j2").render(
            run_dir=str(self.run_dir), port=self.port, **{**self.tuning, **self.params}
        )
        path = self.run_dir / "nginx.conf"
        path.write_text(conf)
        return path

    def start(self) -> None:
        conf = self.render()
        check = subprocess.run(
            ["nginx", "-t", "-q", "-p", str(self.run_dir), "-c", str(conf)],
            capture_output=True,
            text=True,
        )
        if check.returncode != 0:
            raise RuntimeError(f"peer {self.name}: nginx -t failed:\n{check.stderr}")
        # Stopped by our pid (Server.start stops it too when it never answers).
        self.server = Server(
            f"peer {self.name}",
            ["nginx", "-p", str(self.run_dir), "-c", str(conf), "-g", "daemon off;"],
            self.port,
            log=self.run_dir / "nginx.out",
            ready=lambda: http_status(f"{self.base_url}/healthz") == 200,
            timeout=30,
            stop_signal=signal.SIGQUIT,  # graceful: workers finish, then exit
            new_session=True,
        )
        self.server.start()

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
        self.server = None


@dataclass
class AppPeer:
    """The fallback app alone, as users would have it without fastpoll: a second instance of the
    same app (same code, same database file, same number of workers) with no signed-URL check,
    on its own port. The bench polls it with ids written 0NNN, which the app answers from SQLite
    without reading or filling the cache."""

    run_dir: Path
    stack_ini: Path
    workers: int = 2
    port: int = 0
    server: Server | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        return self.server.pid if self.server else 0

    def start(self) -> None:
        import configparser

        self.port = self.port or free_port()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        ini = configparser.ConfigParser(interpolation=None, comment_prefixes=(";", "#"))
        ini.read(self.stack_ini)
        ini.remove_section("signing")
        conf = self.run_dir / "fastpoll.ini"
        with conf.open("w") as f:
            ini.write(f)
        python = HERE.parent / ".venv" / "bin" / "python"
        argv = [str(python), "-m", "fastpoll_app", "--config", str(conf), "--host", "127.0.0.1",
                "--port", str(self.port), "--workers", str(self.workers)]  # fmt: skip
        self.server = Server(
            "app peer",
            argv,
            self.port,
            log=self.run_dir / "app.log",
            ready=lambda: http_status(f"{self.base_url}/healthz") == 200,
            timeout=60,
            stop_timeout=15,  # SIGTERM: uvicorn stops its workers, then exits
            new_session=True,
        )
        self.server.start()

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
        self.server = None
