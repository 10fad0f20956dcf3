"""The app's log lines in the poll server's two formats ([log] format, docs/configuration.md):
text, `2026-01-31T14:05:09.123+01:00 WARNING fastpoll_app.cache[4242]: message`, or json, one
object a line, `{"time": ..., "pid": ..., "level": "warn", "logger": ..., "msg": ...}`. Either
way the time is local, ISO 8601 with its UTC offset, as poll_server/src/log.c writes it."""

from __future__ import annotations

import json
import logging
from datetime import datetime

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s[%(process)d]: %(message)s"

# The poll server's level names (debug, info, warn, error).
_LEVELS = {"WARNING": "warn", "CRITICAL": "error"}


def iso_time(created: float) -> str:
    """2026-01-31T14:05:09.123+01:00: local time, milliseconds, the offset from UTC."""
    return datetime.fromtimestamp(created).astimezone().isoformat(timespec="milliseconds")


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:  # noqa: N802
        return iso_time(record.created)


class JsonFormatter(logging.Formatter):
    """One JSON object a line; a traceback goes into msg, so the line stays one line."""

    def format(self, record: logging.LogRecord) -> str:
        msg = record.getMessage()
        if record.exc_info:
            msg = f"{msg}\n{self.formatException(record.exc_info)}"
        if record.stack_info:
            msg = f"{msg}\n{self.formatStack(record.stack_info)}"
        level = _LEVELS.get(record.levelname, record.levelname.lower())
        return json.dumps(
            {
                "time": iso_time(record.created),
                "pid": record.process,
                "level": level,
                "logger": record.name,
                "msg": msg,
            },
            ensure_ascii=False,
        )


def formatter(log_format: str) -> dict[str, str]:
    """The logging.dictConfig formatter for [log] format."""
    cls = JsonFormatter if log_format == "json" else TextFormatter
    return {"()": f"{__name__}.{cls.__name__}"}
