"""Command line: python -m fastpoll_app --config FILE [--host H] [--port N] [--workers N]."""

from __future__ import annotations

import argparse
import os
import sqlite3
import sys
from typing import Any

import uvicorn

from . import config
from .store import Store

_FORMAT = "%(asctime)s %(levelname)s %(name)s[%(process)d]: %(message)s"


def log_config(level: str) -> dict[str, Any]:
    """logging.dictConfig for uvicorn: applied in every worker process too."""
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"plain": {"format": _FORMAT}},
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
            "uvicorn.access": {"level": "INFO"},
        },
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="fastpoll_app", description=__doc__)
    p.add_argument(
        "--config",
        "-c",
        default=os.environ.get(config.CONFIG_ENV),
        help="INI file (default: $FASTPOLL_CONFIG)",
    )
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    p.add_argument("--access-log", action="store_true", help="log every request")
    p.add_argument("--check", action="store_true", help="check the config and exit")
    args = p.parse_args(argv)

    # Validate here, before any worker starts, so a bad file fails once, clearly.
    try:
        settings = config.load(args.config)
    except config.ConfigError as exc:
        print(f"fastpoll_app: {exc}", file=sys.stderr)
        return 1
    try:
        Store(settings.app.database).close()  # creates the schema; fails early on a bad path
    except sqlite3.Error as exc:
        print(f"fastpoll_app: [app] database {settings.app.database}: {exc}", file=sys.stderr)
        return 1
    if args.check:
        print(f"fastpoll_app: {args.config or '(defaults)'}: OK", file=sys.stderr)
        return 0
    if args.workers < 1:
        p.error("--workers must be at least 1")

    # Workers are separate processes: they find the file through the environment.
    if args.config:
        os.environ[config.CONFIG_ENV] = os.path.abspath(args.config)
    uvicorn.run(
        "fastpoll_app.app:create_app",
        factory=True,
        host=args.host,
        port=args.port,
        workers=args.workers,
        log_config=log_config(args.log_level),
        access_log=args.access_log,
        proxy_headers=False,
        server_header=False,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
