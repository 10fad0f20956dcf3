"""Start and stop the whole fastpoll stack on loopback.

One harness for everyone: `make up` / `make down` call its command line, and the pytest fixtures in
tests/conftest.py use the Stack class. It starts memcached (one or more nodes), Redis (with a
password; the app announces every write on it and the poll servers subscribe, so held polls are
woken at once), the fallback app, one poll server per core and nginx, each on its own port, waits
until every part answers, and records their pids. Stopping kills exactly those pids, never by name.
With db="postgresql" it also runs a throwaway PostgreSQL (initdb into its own directory, a free
loopback port) and the app on it, `apps` app processes behind the same nginx.

The app's write API is private (docs/api.md): nginx does not route it; callers use the app's own
listener with the bearer token from run_dir/api.token (Stack.api()).

    python -m fastpoll_testkit.stack up [--backend memcached|redis] [--http-port 8080]
                               [--pollers N] [--db sqlite|postgresql] [--apps N]
    python -m fastpoll_testkit.stack down
    python -m fastpoll_testkit.stack status
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import jinja2

from fastpoll_testkit.procs import free_port, memcached_argv, wait_for
from fastpoll_testkit.status import start_time

if TYPE_CHECKING:
    import httpx  # the tests' client; `make up` does not need it

ROOT = Path(__file__).resolve().parents[2]
# FP_POLL_SERVER runs every stack on another build (e.g. build/poll_server-asan); FP_POLL_WRAPPER
# puts a command in front of each poll server (e.g. valgrind). See docs/security.md.
POLL_SERVER = Path(
    os.environ.get("FP_POLL_SERVER") or ROOT / "poll_server" / "build" / "poll_server"
).resolve()
POLL_WRAPPER = shlex.split(os.environ.get("FP_POLL_WRAPPER", ""))
# What ASan, UBSan and valgrind print when they find something (sanitizer_reports()).
SANITIZER_REPORT = re.compile(
    rb"ERROR: AddressSanitizer|ERROR: LeakSanitizer|runtime error:|"
    rb"ERROR SUMMARY: [1-9]|definitely lost: [1-9]|indirectly lost: [1-9]"
)
VENV_PYTHON = ROOT / ".venv" / "bin" / "python"
DEFAULT_RUN_DIR = ROOT / "run"
# Debian 12's PostgreSQL server binaries (package postgresql-15); FP_PG_BIN for another one.
PG_BIN = Path(os.environ.get("FP_PG_BIN", "/usr/lib/postgresql/15/bin"))
PG_USER = "fastpoll"
PG_DB = "fastpoll"


def tcp_ask(port: int, request: bytes, expect: bytes) -> bool:
    with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
        s.sendall(request)
        return expect in s.recv(4096)


def memcached_ask(port: int, command: bytes) -> bytes:
    """One memcached command (`stats`, `get <key>`) to a node, its whole answer (up to END)."""
    with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
        s.sendall(command + b"\r\n")
        data = b""
        while not data.endswith(b"END\r\n"):
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    return data


def memcached_stats(port: int) -> dict[str, int]:
    """One memcached node's numeric `stats` counters."""
    stats: dict[str, int] = {}
    for line in memcached_ask(port, b"stats").decode().splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] == "STAT" and parts[2].isdigit():
            stats[parts[1]] = int(parts[2])
    return stats


def poller_servers(site: str) -> list[str]:
    """The `server` lines of nginx's poller upstream (`fastpoll_pollers`) in a rendered site
    file (nginx/fastpoll.conf.j2), without `server` and `;` ("unix:/x.sock ... backup")."""
    block = re.search(r"upstream fastpoll_pollers \{(.*?)\}", site, re.S)
    return re.findall(r"^\s*server ([^;]*);", block.group(1), re.M) if block else []


def http_status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return int(e.code)


@dataclass
class Postgres:
    """A throwaway PostgreSQL server for tests and the local stack: initdb into a directory of
    its own under /tmp (reachable by the server's user; run_dir may sit in a 0700 directory),
    password authentication for the role `fastpoll`, TCP on loopback only, no unix socket.
    As root the server runs as the `postgres` user (it refuses root); otherwise as us.
    init() and argv() prepare; the caller starts argv() and keeps its pid (Stack._spawn)."""

    port: int
    password: str
    data_dir: Path | None = None

    @property
    def run_as(self) -> str | None:
        return "postgres" if os.geteuid() == 0 else None

    @property
    def url(self) -> str:
        return f"postgresql://{PG_USER}@127.0.0.1:{self.port}/{PG_DB}"

    def init(self) -> None:
        top = Path(tempfile.mkdtemp(prefix="fastpoll-pg-", dir="/tmp"))
        if self.run_as:
            shutil.chown(top, self.run_as, self.run_as)
        pwfile = top / "pw"
        fd = os.open(pwfile, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(self.password + "\n")
        if self.run_as:
            shutil.chown(pwfile, self.run_as, self.run_as)
        self.data_dir = top / "data"
        r = subprocess.run(
            [
                str(PG_BIN / "initdb"), "-D", str(self.data_dir), "-U", PG_USER,
                "--pwfile", str(pwfile), "--auth", "scram-sha-256", "-E", "UTF8",
                "--no-locale", "--no-sync",
            ],
            user=self.run_as, capture_output=True, text=True, check=False, cwd="/",
        )  # fmt: skip
        pwfile.unlink()
        if r.returncode != 0:
            raise RuntimeError(f"initdb failed: {r.stderr[-2000:]}")

    def argv(self) -> list[str]:
        if self.data_dir is None:
            raise RuntimeError("Postgres.init() first")
        return [
            str(PG_BIN / "postgres"), "-D", str(self.data_dir), "-p", str(self.port),
            "-c", "listen_addresses=127.0.0.1", "-c", "unix_socket_directories=",
            "-c", "max_connections=200", "-c", "shared_buffers=32MB",
        ]  # fmt: skip

    def ready(self) -> bool:
        import psycopg

        try:
            with psycopg.connect(
                f"host=127.0.0.1 port={self.port} user={PG_USER} dbname=postgres",
                password=self.password,
                connect_timeout=1,
            ):
                return True
        except psycopg.OperationalError:
            return False

    def create_db(self) -> None:
        import psycopg

        with psycopg.connect(
            f"host=127.0.0.1 port={self.port} user={PG_USER} dbname=postgres",
            password=self.password,
            autocommit=True,
        ) as conn:
            conn.execute(f"CREATE DATABASE {PG_DB}")

    def remove(self) -> None:
        """The data directory; only once the server has stopped."""
        if self.data_dir is not None:
            shutil.rmtree(self.data_dir.parent, ignore_errors=True)
            self.data_dir = None


@dataclass
class Proc:
    name: str
    argv: list[str]
    pid: int = 0
    port: int = 0
    started: int = 0  # kernel start time of the pid: tells our process from a reused pid


def _nginx_templates() -> jinja2.Environment:
    """The repository's nginx templates, rendered as the harness always has (strict: a variable
    the template needs and nobody gave is an error)."""
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(ROOT / "nginx"),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
    )


@dataclass
class Stack:
    """The local stack. Ports default to free ones; `make up` passes fixed ones."""

    run_dir: Path
    backend: str = "memcached"
    n_pollers: int = field(default_factory=lambda: os.cpu_count() or 1)
    n_memcached: int = 1
    http_port: int = 0
    app_workers: int = 2
    cache_timeout_ms: int = 100
    poll_server: Path = POLL_SERVER
    poller_wrapper: list[str] = field(default_factory=lambda: list(POLL_WRAPPER))
    # Signed poll URLs (docs/security.md): on, as in production. Off only for peers-only
    # benchmark runs; the secret is generated per run_dir (0600), never taken from the repo.
    signing: bool = True
    # Extra memcached flags, e.g. ["-vv"]: it then logs every command it receives.
    memcached_args: list[str] = field(default_factory=list)
    # memcached -c. The benchmark raises it: nginx memcached_pass, its peer, holds one
    # connection to memcached per request in flight.
    memcached_conns: int = 4096
    # Pollers also listen on a unix socket (poller_socket()) and nginx reaches them through
    # it (no TCP loopback stack on that hop), as the Ansible deploy does; their TCP ports stay
    # for direct use. FP_POLLER_UNIX=0 makes every stack use TCP on that hop instead.
    poller_unix: bool = field(default_factory=lambda: os.environ.get("FP_POLLER_UNIX", "1") == "1")
    socket_dir: Path | None = None  # made by poller_socket(), removed by stop()
    # The app's database: "sqlite" (a file in run_dir, as `make up` runs it) or "postgresql"
    # (a throwaway server, see Postgres); `apps` app processes share it behind nginx.
    db: str = "sqlite"
    apps: int = 1
    # App i runs the fallback_app package found in this directory instead of the installed one:
    # an earlier release beside the new one, as during a rolling upgrade (git archive REV
    # fallback_app | tar -x -C DIR gives DIR/fallback_app: pass that).
    app_trees: dict[int, Path] = field(default_factory=dict)
    app_ports: list[int] = field(default_factory=list)
    pg_port: int = 0
    pg_dir: Path | None = None
    # Writes announced on the stack's Redis (docs/configuration.md, [announce]): with memcached,
    # [announce] server is that Redis; with the Redis backend it is the cache's own. A held poll
    # is then answered within milliseconds of a publish, not at the poll server's re-check.
    # False: no [announce] with memcached (the poll server relies on its re-check alone).
    announce: bool = True
    extra_ini: dict[str, dict[str, str]] = field(default_factory=dict)
    # Extra command-line flags of poller i, after the harness's own (e.g. {0: ["-s", LIST]}:
    # a poller on another server list, as during a membership change).
    poller_args: dict[int, list[str]] = field(default_factory=dict)
    nginx_vars: dict[str, object] = field(default_factory=dict)  # overrides for the templates
    procs: dict[str, Proc] = field(default_factory=dict)
    memcached_ports: list[int] = field(default_factory=list)
    poller_ports: list[int] = field(default_factory=list)
    redis_port: int = 0
    app_port: int = 0
    # Admin listeners (docs/operations.md): each poller's /metrics and /healthz on its own
    # loopback port, nginx's stub_status on another. admin=False runs without them (the
    # benchmark's "metrics off"; the counters themselves are compiled in unless -DFP_NO_STATS).
    admin: bool = True
    admin_ports: list[int] = field(default_factory=list)
    nginx_status_port: int = 0
    # nginx access log in the `fastpoll` format, to run_dir/nginx/access.log (off: speed).
    access_log: bool = False
    _popen: dict[str, subprocess.Popen] = field(default_factory=dict, repr=False)
    _secret: bytes | None = field(default=None, repr=False)

    # ---- configuration -------------------------------------------------------------------

    @property
    def ini_path(self) -> Path:
        return self.run_dir / "fastpoll.ini"

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def _allocate_ports(self) -> None:
        self.http_port = self.http_port or free_port()
        self.memcached_ports = self.memcached_ports or [
            free_port() for _ in range(self.n_memcached)
        ]
        self.redis_port = self.redis_port or free_port()
        self.app_ports = self.app_ports or [free_port() for _ in range(self.apps)]
        self.app_port = self.app_ports[0]
        if self.db == "postgresql":
            self.pg_port = self.pg_port or free_port()
        self.poller_ports = self.poller_ports or [free_port() for _ in range(self.n_pollers)]
        if self.admin:
            self.admin_ports = self.admin_ports or [free_port() for _ in self.poller_ports]
            self.nginx_status_port = self.nginx_status_port or free_port()

    @property
    def effective_cache_timeout_ms(self) -> int:
        """[cache] timeout_ms as written. Under a wrapper (valgrind runs a poll server 20-50x
        slower) a 100 ms read can be missed by the poller's own event loop, not by the cache:
        the node would be taken for silent and kept out for recovery_ms. At least 500 ms then,
        the most that still lets the idle probe (every 500 ms) see a hang."""
        if self.poller_wrapper:
            return max(self.cache_timeout_ms, 500)
        return self.cache_timeout_ms

    def ini_sections(self) -> dict[str, dict[str, str]]:
        sections = {
            "server": {"listen": "127.0.0.1", "port": str(self.poller_ports[0])},
            "keys": {"prefix": "/Poll", "params": "user_id"},
            "cache": {
                "backend": self.backend,
                "timeout_ms": str(self.effective_cache_timeout_ms),
                "content_type": "application/json",
                "ttl": "300",
            },
            "memcached": {"servers": " ".join(f"127.0.0.1:{p}" for p in self.memcached_ports)},
            "redis": {
                "server": f"127.0.0.1:{self.redis_port}",
                "password_file": str(self.run_dir / "redis.pass"),
            },
            "log": {"level": "info"},
            "app": {
                "database": str(self.run_dir / "fastpoll.db"),
                "api_token_file": str(self.api_token_path),
            },
        }
        if self.db == "postgresql":
            sections["app"]["database"] = f"postgresql://{PG_USER}@127.0.0.1:{self.pg_port}/{PG_DB}"
            sections["app"]["database_password_file"] = str(self.run_dir / "pg.pass")
        if self.signing:
            sections["signing"] = {"secret_file": str(self.secret_path), "ttl": "3600"}
        if self.poller_unix:
            # nginx's workers run as nobody when we are root; the socket directory is ours.
            sections["server"]["unix_mode"] = "0666"
        if self.announce and self.backend == "memcached":
            sections["announce"] = {
                "server": f"127.0.0.1:{self.redis_port}",
                "password_file": str(self.run_dir / "redis.pass"),
            }
        for section, values in self.extra_ini.items():
            sections.setdefault(section, {}).update(values)
        return sections

    def write_config(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        pw = self.run_dir / "redis.pass"
        if not pw.exists():
            pw.write_text(secrets.token_hex(16) + "\n")
        pw.chmod(0o600)
        for path in (self.api_token_path, self.run_dir / "pg.pass"):
            if not path.exists():  # created 0600, never wider; random per run_dir
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                with os.fdopen(fd, "w") as f:
                    f.write(secrets.token_hex(32) + "\n")
        if self.signing and not self.secret_path.exists():
            # Created 0600 (never wider, not even for a moment), random per run_dir.
            fd = os.open(self.secret_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_hex(32) + "\n")
        lines = ["; written by fastpoll_testkit.stack for the local stack"]
        for section, values in self.ini_sections().items():
            lines.append(f"\n[{section}]")
            lines.extend(f"{k} = {v}" for k, v in values.items())
        self.ini_path.write_text("\n".join(lines) + "\n")
        self._render_nginx()

    def render_site_template(self, **extra: object) -> str:
        """nginx/fastpoll.conf.j2 rendered with this stack's variables, its nginx_vars, then
        extra: the stack's own site, or with fastpoll_part "http" / "locations" the snippets a
        site's existing nginx includes (docs/integrate.md), aimed at this stack's pollers and
        apps."""
        ngx = self.run_dir / "nginx"
        variables: dict[str, object] = {
            "fastpoll_listen": f"127.0.0.1:{self.http_port}",
            "fastpoll_pollers": [
                f"unix:{self.poller_socket(i)}" if self.poller_unix else f"127.0.0.1:{p}"
                for i, p in enumerate(self.poller_ports)
            ],
            "fastpoll_apps": [f"127.0.0.1:{p}" for p in self.app_ports],
            # The browser client and its demo page (client/), under /fastpoll-client/.
            "fastpoll_client_root": str(ROOT / "client"),
            # The template's "auto" active pollers follow the host's cores.
            "fastpoll_cores": os.cpu_count() or 1,
            # The pollers' own max_wait, as the Ansible roles share one variable: nginx's
            # held-poll read timeout (10 s above it) must never cut a wait the poller still
            # honours (a timeout there marks the poller failed).
            "fastpoll_poll_max_wait": int(
                self.ini_sections().get("poll", {}).get("max_wait", "30")
            ),
            # ... and their stream heartbeat: @poll_stream's read timeout is above it.
            "fastpoll_stream_heartbeat_ms": int(
                self.ini_sections().get("stream", {}).get("heartbeat_ms", "15000")
            ),
            **({"fastpoll_status_port": self.nginx_status_port} if self.nginx_status_port else {}),
            **({"fastpoll_access_log": str(ngx / "access.log")} if self.access_log else {}),
            **self.nginx_vars,
            **extra,
        }
        return _nginx_templates().get_template("fastpoll.conf.j2").render(**variables)

    def _render_nginx(self) -> None:
        ngx = self.run_dir / "nginx"
        for sub in ("body", "proxy", "fastcgi", "uwsgi", "scgi"):
            (ngx / "tmp" / sub).mkdir(parents=True, exist_ok=True)
        run_as = None
        if os.geteuid() == 0:  # workers drop to nobody; let them use the temp dirs
            run_as = "nobody nogroup"
            for d in [ngx / "tmp", *(ngx / "tmp").iterdir()]:
                shutil.chown(d, "nobody", "nogroup")
        site = self.render_site_template()
        (ngx / "fastpoll.conf").write_text(site)
        main = (
            _nginx_templates()
            .get_template("nginx-local.conf.j2")
            .render(**{"run_dir": str(ngx), "run_as_user": run_as, **self.nginx_vars})
        )
        (ngx / "nginx.conf").write_text(main)

    # ---- processes -----------------------------------------------------------------------

    def _spawn(
        self,
        name: str,
        argv: list[str],
        port: int = 0,
        env: dict | None = None,
        user: str | None = None,
    ) -> Proc:
        log = open(self.run_dir / f"{name}.log", "ab")  # noqa: SIM115 -- owned by the child
        popen = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # survives `make up` returning; not hit by terminal ^C
            env={**os.environ, **(env or {})},
            user=user,
            cwd="/" if user else None,
        )
        log.close()
        proc = Proc(
            name=name,
            argv=argv,
            pid=popen.pid,
            port=port,
            started=start_time(popen.pid),
        )
        self.procs[name] = proc
        self._popen[name] = popen
        return proc

    def start_memcached(self, i: int) -> None:
        port = self.memcached_ports[i]
        argv = memcached_argv(port, "-c", str(self.memcached_conns), *self.memcached_args)
        name = f"memcached-{i}"
        self._spawn(name, argv, port)
        wait_for(
            name,
            lambda: tcp_ask(port, b"version\r\n", b"VERSION"),
            proc=self._popen[name],
            logs=[self.run_dir / f"{name}.log"],
        )

    def start_redis(self) -> None:
        password = (self.run_dir / "redis.pass").read_text().strip()
        conf = self.run_dir / "redis.conf"
        # The password goes in a 0600 file, not on the command line (ps would show it).
        conf.write_text(
            f'port {self.redis_port}\nbind 127.0.0.1\nsave ""\nappendonly no\n'
            f"dir {self.run_dir}\nrequirepass {password}\n"
        )
        conf.chmod(0o600)
        self._spawn("redis", ["redis-server", str(conf)], self.redis_port)
        auth = f"AUTH {password}\r\nPING\r\n".encode()
        wait_for(
            "redis",
            lambda: tcp_ask(self.redis_port, auth, b"+PONG"),
            proc=self._popen["redis"],
            logs=[self.run_dir / "redis.log"],
        )

    def start_postgres(self) -> None:
        """A fresh server and database for this run, then the app's schema (migrate)."""
        password = (self.run_dir / "pg.pass").read_text().strip()
        pg = Postgres(self.pg_port, password)
        pg.init()
        self.pg_dir = pg.data_dir
        self._run_postgres(pg)
        pg.create_db()
        # With earlier releases among the apps (app_trees), the database is theirs first, as
        # before an upgrade: each one's migrate, then this tree's.
        for tree in [*self.app_trees.values(), None]:
            migrate = subprocess.run(
                [str(VENV_PYTHON), "-m", "fastpoll_app", "migrate", "--config", str(self.ini_path)],
                capture_output=True,
                text=True,
                check=False,
                env={**os.environ, **({"PYTHONPATH": str(tree)} if tree else {})},
            )
            if migrate.returncode != 0:
                raise RuntimeError(f"fastpoll_app migrate failed: {migrate.stderr}")

    def _run_postgres(self, pg: Postgres) -> None:
        self._spawn("postgres", pg.argv(), self.pg_port, user=pg.run_as)
        wait_for(
            "postgres",
            pg.ready,
            proc=self._popen["postgres"],
            logs=[self.run_dir / "postgres.log"],
        )

    def restart_postgres(self, down_s: float = 0.0) -> None:
        """Fast shutdown of the running PostgreSQL, `down_s` seconds down, then the same server
        again on its data directory and port (the fault drills; start_postgres makes a new one)."""
        if self.pg_dir is None:
            raise RuntimeError("no PostgreSQL in this stack")
        pg = Postgres(self.pg_port, (self.run_dir / "pg.pass").read_text().strip(), self.pg_dir)
        self.stop_proc("postgres", signal.SIGINT, timeout=30)
        time.sleep(down_s)
        self._run_postgres(pg)

    @staticmethod
    def app_name(i: int) -> str:
        return "app" if i == 0 else f"app-{i}"

    def start_app(self, i: int = 0) -> None:
        port = self.app_ports[i]
        name = self.app_name(i)
        argv = [
            str(VENV_PYTHON),
            "-m",
            "fastpoll_app",
            "--config",
            str(self.ini_path),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            str(self.app_workers),
        ]
        # The workers' metrics files live in run_dir, not in a temporary directory of the
        # app's own that an app stopped with SIGKILL (the fault drills) would leave behind.
        # PGAPPNAME: PostgreSQL's pg_stat_activity names the app a session belongs to.
        env = {
            "PROMETHEUS_MULTIPROC_DIR": str(self.run_dir / f"{name}-metrics"),
            "PGAPPNAME": name,
        }
        if i in self.app_trees:
            env["PYTHONPATH"] = str(self.app_trees[i])
        self._spawn(name, argv, port, env=env)
        url = f"http://127.0.0.1:{port}/healthz"
        wait_for(
            name,
            lambda: http_status(url) == 200,
            timeout=60,
            proc=self._popen[name],
            logs=[self.run_dir / f"{name}.log"],
        )

    # ---- the app's private write API -------------------------------------------------------

    @property
    def api_token_path(self) -> Path:
        return self.run_dir / "api.token"

    @property
    def api_token(self) -> str:
        return self.api_token_path.read_text().strip()

    def app_url(self, i: int = 0) -> str:
        """App i's own listener: the site's backend calls the write API here, not via nginx."""
        return f"http://127.0.0.1:{self.app_ports[i]}"

    def api(self, i: int = 0, timeout: float = 10) -> httpx.Client:
        """A client of app i's own listener that sends the bearer token, as the site's backend
        does: `with stack.api() as api: api.post("/api/messages", json={...})`."""
        import httpx

        return httpx.Client(
            base_url=self.app_url(i),
            timeout=timeout,
            headers={"Authorization": f"Bearer {self.api_token}"},
        )

    def poller_socket(self, i: int) -> Path:
        """Poller i's unix socket (used when poller_unix is set). The sockets live in a
        directory of their own under /tmp: nginx's workers (nobody, when we are root) must be
        able to reach them, run_dir may sit in a 0700 directory (pytest's), and a socket path
        is limited to 107 bytes."""
        if self.socket_dir is None:
            self.socket_dir = Path(tempfile.mkdtemp(prefix="fastpoll-", dir="/tmp"))
            self.socket_dir.chmod(0o711)  # reachable, not listable
        return self.socket_dir / f"poller-{i}.sock"

    def start_poller(self, i: int, binary: Path | None = None) -> None:
        port = self.poller_ports[i]
        name = f"poller-{i}"
        argv = [
            *self.poller_wrapper,
            str(binary or self.poll_server),
            "-c",
            str(self.ini_path),
            "-p",
            str(port),
        ]
        if self.poller_unix:
            argv += ["-l", f"127.0.0.1 unix:{self.poller_socket(i)}"]
        if self.admin_ports:
            argv += ["-A", str(self.admin_ports[i])]
        argv += self.poller_args.get(i, [])
        self._spawn(name, argv, port)
        # Any HTTP answer means it is serving: "/" is a valid key that is simply not cached
        # (403 when poll URLs are signed: this one is not).
        url = f"http://127.0.0.1:{port}/"
        wait_for(
            name,
            lambda: http_status(url) in (200, 403, 404, 503),
            proc=self._popen[name],
            logs=[self.run_dir / f"{name}.log"],
        )

    def announces_on_own_redis(self) -> bool:
        """Announcements go through the Redis this stack starts (not a server a test gave)."""
        ini = self.ini_sections()
        server = ini.get("announce", {}).get("server")
        if (
            server is None
            and ini["cache"]["backend"] == "redis"
            and "sentinels" not in ini["redis"]
        ):
            server = ini["redis"]["server"]  # the cache's own Redis
        return server == f"127.0.0.1:{self.redis_port}"

    def wait_subscribed(self, timeout: float = 15.0) -> None:
        """Until every poller is subscribed to the stack's own announcements, so a held poll
        is woken by the first publish (no-op without admin listeners or with another server)."""
        if not self.admin_ports or not self.announces_on_own_redis():
            return

        def subscribed(port: int) -> bool:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
                return b"\nfastpoll_announce_subscribed 1\n" in b"\n" + r.read()

        for i, port in enumerate(self.admin_ports[: len(self.poller_ports)]):
            wait_for(
                f"poller-{i} subscribed to announcements",
                functools.partial(subscribed, port),
                timeout=timeout,
                proc=self._popen.get(f"poller-{i}"),
                logs=[self.run_dir / f"poller-{i}.log"],
            )

    def _nginx_test(self) -> Path:
        """`nginx -t` on the rendered config; returns its path."""
        conf = self.run_dir / "nginx" / "nginx.conf"
        check = subprocess.run(
            ["nginx", "-t", "-q", "-p", str(conf.parent), "-c", str(conf)],
            check=False,
            capture_output=True,
            text=True,
        )
        if check.returncode != 0:
            raise RuntimeError(f"nginx -t failed:\n{check.stderr}")
        return conf

    def start_nginx(self) -> None:
        conf = self._nginx_test()
        argv = ["nginx", "-p", str(conf.parent), "-c", str(conf), "-g", "daemon off;"]
        self._spawn("nginx", argv, self.http_port)
        url = f"{self.base_url}/healthz"
        wait_for(
            "nginx",
            lambda: http_status(url) == 200,
            proc=self._popen["nginx"],
            logs=[conf.parent / "error.log", self.run_dir / "nginx.log"],
        )

    def start(self) -> None:
        self._allocate_ports()
        self.write_config()
        try:
            for i in range(len(self.memcached_ports)):
                self.start_memcached(i)
            self.start_redis()
            if self.db == "postgresql":
                self.start_postgres()
            for i in range(len(self.app_ports)):
                self.start_app(i)
            for i in range(len(self.poller_ports)):
                self.start_poller(i)
            self.wait_subscribed()
            self.start_nginx()
        except BaseException:
            self.stop()
            raise
        self.save_state()

    def reload_nginx(self) -> None:
        """Render the templates again (after a change to nginx_vars), check, and SIGHUP nginx:
        the master starts new workers, the old ones finish their requests."""
        self._render_nginx()
        self._nginx_test()
        os.kill(self.procs["nginx"].pid, signal.SIGHUP)

    # ---- signed poll URLs ------------------------------------------------------------------

    @property
    def secret_path(self) -> Path:
        return self.run_dir / "signing.key"

    def sign(self, target: str, ttl: int = 3600) -> str:
        """The target with exp and sig appended, as the app's POST /api/poll-url would issue it.

        Takes a target for nginx ("/Poll/getMessages?...") or for a poll server directly
        ("/getMessages?..."). Unchanged when signing is off or the target has no valid key
        (such a request cannot be signed: it gets 403)."""
        if not self.signing:
            return target
        from fastpoll_app.keys import InvalidKey, derive_key  # the venv's app package
        from fastpoll_app.signing import load_secrets, signed_query

        keys = self.ini_sections()["keys"]
        params = [p.encode() for p in re.split(r"[\s,]+", keys["params"]) if p]
        raw = target.encode("latin-1")
        inner = raw[len(b"/Poll") :] if raw.startswith(b"/Poll/") else raw
        try:
            key = derive_key(keys["prefix"].encode(), inner, params)
        except InvalidKey:
            return target
        if self._secret is None:
            self._secret = load_secrets(self.secret_path)[0]
        secret = self._secret
        query = signed_query(secret, key, int(time.time()) + ttl).decode()
        return f"{target}{'&' if '?' in target else '?'}{query}"

    def poll_url(self, uid: int, ttl: int = 3600) -> str:
        """A signed poll URL of user uid, through nginx."""
        return self.sign(f"/Poll/getMessages?user_id={uid}", ttl)

    def poller_log_lines(self) -> Iterator[tuple[str, bytes]]:
        """Every line of the poll servers' logs, with its log's name (running or stopped)."""
        for log in sorted(self.run_dir.glob("poller-*.log")):
            for line in log.read_bytes().splitlines():
                yield log.name, line

    def sanitizer_reports(self) -> list[str]:
        """Lines of the poll servers' logs where ASan, UBSan or valgrind reported something."""
        return [
            f"{name}: {line.decode(errors='replace')}"
            for name, line in self.poller_log_lines()
            if SANITIZER_REPORT.search(line)
        ]

    def stop_proc(self, name: str, sig: int = signal.SIGTERM, timeout: float = 10.0) -> int | None:
        """Stop one process we started, by pid. Returns its exit status if we could reap it."""
        proc = self.procs.pop(name, None)
        if proc is None:
            return None
        popen = self._popen.pop(name, None)
        if popen is not None:
            if popen.poll() is None:
                popen.send_signal(sig)
                try:
                    return popen.wait(timeout)
                except subprocess.TimeoutExpired:
                    popen.kill()
                    return popen.wait()
            return popen.returncode
        _stop_pid(proc, sig, timeout)
        return None

    def stop(self) -> None:
        # nginx first, so no client is sent to a part that is going away.
        # PostgreSQL last (after the apps) and with SIGINT: its fast shutdown (SIGTERM waits
        # for every client to leave).
        for name in sorted(
            self.procs,
            key=lambda n: (n != "nginx", n == "postgres", n.startswith("memcached"), n),
        ):
            self.stop_proc(name, signal.SIGINT if name == "postgres" else signal.SIGTERM)
        if self.pg_dir is not None:
            shutil.rmtree(self.pg_dir.parent, ignore_errors=True)
            self.pg_dir = None
        if self.socket_dir is not None:
            # Empty by now: each poller unlinks its socket on exit.
            shutil.rmtree(self.socket_dir, ignore_errors=True)
            self.socket_dir = None
        state = self.run_dir / "stack.json"
        if state.exists():
            state.unlink()

    # ---- state for `make down` -----------------------------------------------------------

    def save_state(self) -> None:
        state = {
            "backend": self.backend,
            "http_port": self.http_port,
            # For the status command (fastpoll_testkit.status): where the admin endpoints are.
            "admin_ports": {f"poller-{i}": p for i, p in enumerate(self.admin_ports)},
            "nginx_status_port": self.nginx_status_port,
            "app_port": self.app_port,
            "app_ports": self.app_ports,
            "db": self.db,
            "pg_dir": str(self.pg_dir) if self.pg_dir else None,
            "socket_dir": str(self.socket_dir) if self.socket_dir else None,
            "procs": {
                n: {"pid": p.pid, "port": p.port, "argv": p.argv, "started": p.started}
                for n, p in self.procs.items()
            },
        }
        (self.run_dir / "stack.json").write_text(json.dumps(state, indent=1))

    @classmethod
    def load(cls, run_dir: Path) -> Stack:
        state = json.loads((run_dir / "stack.json").read_text())
        run_dir = run_dir.resolve()
        stack = cls(run_dir=run_dir, backend=state["backend"], http_port=state["http_port"])
        if state.get("socket_dir"):
            stack.socket_dir = Path(state["socket_dir"])
        if state.get("pg_dir"):
            stack.pg_dir = Path(state["pg_dir"])
        stack.db = state.get("db", "sqlite")
        for name, p in state["procs"].items():
            stack.procs[name] = Proc(
                name=name,
                argv=p["argv"],
                pid=p["pid"],
                port=p["port"],
                started=p["started"],
            )

        def ports(prefix: str) -> list[int]:
            named = [
                (int(n.split("-")[1]), p.port)
                for n, p in stack.procs.items()
                if n.startswith(prefix + "-")
            ]
            return [port for _, port in sorted(named)]

        # What ini_sections() and sign() read, as start() would have set it.
        stack.poller_ports = ports("poller")
        stack.memcached_ports = ports("memcached")
        stack.app_port = state.get("app_port") or 0
        stack.app_ports = state.get("app_ports") or [stack.app_port]
        stack.apps = len(stack.app_ports)
        if "postgres" in stack.procs:
            stack.pg_port = stack.procs["postgres"].port
        if "redis" in stack.procs:
            stack.redis_port = stack.procs["redis"].port
        return stack


def _is_ours(proc: Proc) -> bool:
    """The pid still runs the process we started: same pid, same kernel start time (pids get
    reused; command lines do not identify it, nginx rewrites its own)."""
    return proc.started != 0 and start_time(proc.pid) == proc.started


def _stop_pid(proc: Proc, sig: int, timeout: float) -> None:
    if not _is_ours(proc):
        return
    os.kill(proc.pid, sig)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and _is_ours(proc):
        time.sleep(0.05)
    if _is_ours(proc):
        os.kill(proc.pid, signal.SIGKILL)
    return


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("command", choices=["up", "down", "status"])
    ap.add_argument("--run-dir", type=Path, default=DEFAULT_RUN_DIR)
    ap.add_argument(
        "--backend",
        choices=["memcached", "redis"],
        default=os.environ.get("FP_BACKEND", "memcached"),
    )
    ap.add_argument("--http-port", type=int, default=int(os.environ.get("FP_HTTP_PORT", "8080")))
    ap.add_argument("--pollers", type=int, default=int(os.environ.get("FP_POLLERS", "0")) or None)
    ap.add_argument(
        "--memcached-nodes",
        type=int,
        default=int(os.environ.get("FP_MEMCACHED_NODES", "1")),
    )
    ap.add_argument(
        "--poller-unix",
        action="store_true",
        default=os.environ.get("FP_POLLER_UNIX", "0") == "1",
        help="nginx reaches the pollers through unix sockets (in /tmp/fastpoll-*/)",
    )
    ap.add_argument(
        "--no-signing",
        action="store_true",
        default=os.environ.get("FP_SIGNING", "1") == "0",
        help="poll URLs unsigned (peers-only benchmarks); the product signs them",
    )
    ap.add_argument(
        "--db",
        choices=["sqlite", "postgresql"],
        default=os.environ.get("FP_DB", "sqlite"),
        help="the app's database (postgresql: a throwaway server in /tmp/fastpoll-pg-*/)",
    )
    ap.add_argument("--apps", type=int, default=int(os.environ.get("FP_APPS", "1")))
    args = ap.parse_args()
    # Absolute: nginx gets -p and -c, and a relative -c would be read relative to -p.
    args.run_dir = args.run_dir.resolve()
    state = args.run_dir / "stack.json"

    if args.command == "down":
        if not state.exists():
            print("fastpoll: nothing to stop (no run/stack.json)")
            return 0
        stack = Stack.load(args.run_dir)
        names = ", ".join(stack.procs)
        stack.stop()
        print(f"fastpoll: stopped {names}")
        return 0

    if args.command == "status":
        if not state.exists():
            print("fastpoll: not running")
            return 1
        stack = Stack.load(args.run_dir)
        down = [n for n, p in stack.procs.items() if not _is_ours(p)]
        for name, p in stack.procs.items():
            print(f"{name:12} pid {p.pid:7} port {p.port:5} {'DOWN' if name in down else 'up'}")
        return 1 if down else 0

    if state.exists():
        print(
            "fastpoll: already up (run/stack.json exists); `make down` first",
            file=sys.stderr,
        )
        return 1
    stack = Stack(
        run_dir=args.run_dir,
        backend=args.backend,
        http_port=args.http_port,
        n_memcached=args.memcached_nodes,
        signing=not args.no_signing,
        poller_unix=args.poller_unix,
        access_log=os.environ.get("FP_ACCESS_LOG", "0") == "1",
        db=args.db,
        apps=args.apps,
    )
    if args.pollers:
        stack.n_pollers = args.pollers
    stack.start()
    print(f"fastpoll is up ({stack.backend} backend), logs and config in {args.run_dir}/")
    print(f"  entry point (nginx)  {stack.base_url}/")
    print(f"  poll                 {stack.base_url}{stack.poll_url(1)}")
    auth = f'-H "Authorization: Bearer $(cat {stack.api_token_path})"'
    if stack.signing:
        print(
            f"  signed poll URL      curl -X POST {auth} -H 'Content-Type: application/json' "
            f"-d '{{\"user_id\": 1}}' {stack.app_url()}/api/poll-url  (valid 1 h)"
        )
    print(
        f"  publish              curl -X POST {auth} -H 'Content-Type: application/json' "
        f'-d \'{{"user_id": 1, "text": "hi"}}\' {stack.app_url()}/api/messages'
    )
    print(f"  poll servers         {', '.join(f'127.0.0.1:{p}' for p in stack.poller_ports)}")
    print(
        f"  fallback app         {', '.join(stack.app_url(i) for i in range(stack.apps))}  "
        f"({stack.db}; metrics: /metrics; write API token in {stack.api_token_path})"
    )
    if stack.admin_ports:
        print(
            "  poller metrics       "
            + ", ".join(f"127.0.0.1:{p}/metrics" for p in stack.admin_ports)
        )
        print(f"  nginx stub_status    http://127.0.0.1:{stack.nginx_status_port}/nginx_status")
    if stack.access_log:
        print(f"  nginx access log     {args.run_dir}/nginx/access.log")
    print("  health of it all     make status")
    print(f"  memcached            {', '.join(f'127.0.0.1:{p}' for p in stack.memcached_ports)}")
    redis_pass = f"{args.run_dir}/redis.pass"
    role = "the cache and announcements" if stack.backend == "redis" else "announcements"
    print(f"  redis                127.0.0.1:{stack.redis_port} ({role}; password in {redis_pass})")
    print("stop it with `make down`")
    return 0


if __name__ == "__main__":
    sys.exit(main())
