"""The access log (`--access-log`) writes a signed poll URL as nginx's log does: the
request-target up to its first `sig=` parameter and `sig=-` in its place (nginx/fastpoll.conf.j2,
map $fastpoll_log_target). A signed URL is a bearer token until it expires: it must not sit in
a log file."""

from __future__ import annotations

import logging
import re

# nginx's "~^(?<fp_head>[^?]*\?(?:[^&]*&)*?)sig=" -> "${fp_head}sig=-": the rest is dropped.
_SIG = re.compile(r"([^?]*\?(?:[^&]*&)*?)sig=.*", re.DOTALL)


def mask_target(target: str) -> str:
    m = _SIG.match(target)
    return f"{m.group(1)}sig=-" if m else target


class MaskSignature(logging.Filter):
    """On uvicorn's access logger, whose record args are (client, method, target, version,
    status)."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and len(args) >= 3 and isinstance(args[2], str):
            record.args = (*args[:2], mask_target(args[2]), *args[3:])
        return True
