"""Command line:

python -m fastpoll_app --config FILE [--host H] [--port N] [--workers N] [--check]
python -m fastpoll_app migrate [--config FILE]   (create or upgrade the database's schema)
python -m fastpoll_app migrate --contract        (every app host runs this release: drop what
                                                  kept the previous one correct beside it)
python -m fastpoll_app migrate --expand          (before rolling back to such a release)
python -m fastpoll_app --version                 (the installed package's version)
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import uvicorn

from . import config, logformat

# Read by prometheus_client when it is first imported: set it before anything imports
# fastpoll_app.metrics (store, service, app do), so every worker shares one directory.
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"


def log_config(level: str, log_format: str = "text") -> dict[str, Any]:
    """logging.dictConfig for uvicorn: applied in every worker process too. log_format:
    [log] format, text or json (fastpoll_app/logformat.py)."""
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"plain": logformat.formatter(log_format)},
        "filters": {"mask_sig": {"()": "fastpoll_app.accesslog.MaskSignature"}},
        "handlers": {
            "stderr": {
                "class": "logging.StreamHandler",
                "formatter": "plain",
                "stream": "ext://sys.stderr",
            }
        },
        "root": {"handlers": ["stderr"], "level": level.upper()},
        "loggers": {
            "uvicorn": {"level": level.upper()},
            "uvicorn.access": {"level": "INFO", "filters": ["mask_sig"]},
        },
    }


def metrics_dir() -> tuple[Path, bool]:
    """The directory the workers keep their metrics in, emptied; and whether it is ours to
    remove at exit. $PROMETHEUS_MULTIPROC_DIR if set (e.g. systemd's RuntimeDirectory), else
    a private temporary one."""
    given = os.environ.get(MULTIPROC_ENV)
    path = Path(given) if given else Path(tempfile.mkdtemp(prefix="fastpoll-app-metrics-"))
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    for f in path.glob("*.db"):  # a previous run's values must not be summed in
        f.unlink()
    os.environ[MULTIPROC_ENV] = str(path)
    return path, not given


def version() -> str:
    """The installed distribution's version (its metadata, as pip shows it)."""
    try:
        return importlib.metadata.version("fastpoll-app")
    except importlib.metadata.PackageNotFoundError:  # run from a tree that was never installed
        from . import __version__

        return f"{__version__} (not installed)"


def _add_config_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--config",
        "-c",
        default=os.environ.get(config.CONFIG_ENV),
        help="INI file (default: $FASTPOLL_CONFIG)",
    )


def _load(path: str | None) -> config.Settings | None:
    """The settings, or None after printing the error (key and line) once."""
    try:
        return config.load(path)
    except config.ConfigError as exc:
        print(f"fastpoll_app: {exc}", file=sys.stderr)
        return None


def migrate(argv: list[str]) -> int:
    """Bring the database named by [app] database to this app's schema; idempotent."""
    p = argparse.ArgumentParser(prog="fastpoll_app migrate", description=migrate.__doc__)
    _add_config_arg(p)
    phase = p.add_mutually_exclusive_group()
    phase.add_argument(
        "--contract",
        action="store_true",
        help="after a rolling upgrade, once no app host runs the previous release: PostgreSQL "
        "holds each user's order on its slot only (a batch's locks bounded)",
    )
    phase.add_argument(
        "--expand",
        action="store_true",
        help="before rolling back to a release that locks user ids: hold both again",
    )
    args = p.parse_args(argv)
    settings = _load(args.config)
    if settings is None:
        return 1
    from .store import (
        ORDERS_COMPAT,
        ORDERS_SLOT,
        SCHEMA_VERSION,
        PgStore,
        StoreError,
        open_store,
    )

    try:
        store = open_store(settings.app, check_schema=False)
        try:
            was = store.migrate()
            scheme = ORDERS_SLOT if args.contract else ORDERS_COMPAT
            phased = args.contract or args.expand
            changed = phased and isinstance(store, PgStore) and store.hold_orders(scheme)
        finally:
            store.close()
    except StoreError as exc:
        print(f"fastpoll_app: [app] database {settings.app.database}: {exc}", file=sys.stderr)
        return 1
    if was == SCHEMA_VERSION:
        print(f"fastpoll_app: schema already at version {SCHEMA_VERSION}", file=sys.stderr)
    else:
        print(f"fastpoll_app: schema migrated {was} -> {SCHEMA_VERSION}", file=sys.stderr)
    if phased:
        done = ("contracted" if args.contract else "expanded") if changed else "already so"
        print(f"fastpoll_app: {done}: orders held as {scheme}", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["migrate"]:
        return migrate(argv[1:])
    p = argparse.ArgumentParser(prog="fastpoll_app", description=__doc__)
    p.add_argument("--version", action="version", version=f"fastpoll_app {version()}")
    _add_config_arg(p)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    p.add_argument("--access-log", action="store_true", help="log every request")
    p.add_argument("--check", action="store_true", help="check the config and exit")
    args = p.parse_args(argv)

    # Validate here, before any worker starts, so a bad file fails once, clearly.
    settings = _load(args.config)
    if settings is None:
        return 1
    if args.workers < 1:
        p.error("--workers must be at least 1")
    path, ours = (None, False) if args.check else metrics_dir()
    try:
        return _run(args, settings)
    finally:
        if ours and path is not None:
            shutil.rmtree(path, ignore_errors=True)


def _run(args: argparse.Namespace, settings: config.Settings) -> int:
    from .protocol import NoDelayH11Protocol
    from .store import StoreError, open_store  # imports the metrics: once their dir is set

    try:
        # SQLite: creates or upgrades the schema. PostgreSQL: connects and checks that
        # `migrate` was run. Either fails here, once, with the reason.
        open_store(settings.app).close()
    except StoreError as exc:
        print(f"fastpoll_app: [app] database {settings.app.database}: {exc}", file=sys.stderr)
        return 1
    if why := config.open_api_refusal(settings.app):
        print(f"fastpoll_app: {settings.source}: {why}", file=sys.stderr)
        return 1
    if args.check:
        print(f"fastpoll_app: {args.config or '(defaults)'}: OK", file=sys.stderr)
        return 0

    # Workers are separate processes: they find the file through the environment.
    if args.config:
        os.environ[config.CONFIG_ENV] = os.path.abspath(args.config)
    uvicorn.run(
        # The app, its header names spelled as the poll server's (X-Poll-Source, ETag).
        "fastpoll_app.headercase:create_app",
        factory=True,
        host=args.host,
        port=args.port,
        workers=args.workers,
        log_config=log_config(args.log_level, settings.log_format),
        access_log=args.access_log,
        proxy_headers=False,
        server_header=False,
        date_header=False,  # the app's own Date header (headercase.py), spelled so
        http=NoDelayH11Protocol,
        # Above nginx's keepalive_timeout to the app (55 s, nginx/fastpoll.conf.j2): nginx, not
        # the app, closes an idle connection, so it never sends on one the app just closed.
        timeout_keep_alive=65,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
