"""fastpoll_client: the Python SDK of fastpoll's private write API (docs/api.md, "Python SDK").

from fastpoll_client import Client

with Client("http://127.0.0.1:8000", token) as fp:
    msg = fp.publish(42, "hi")            # retried safely: one Idempotency-Key per call
    url = fp.poll_url(42)                 # the user's signed poll URL, for the browser
    fp.mark_read(42, up_to_id=msg.id)
"""

from ._client import (
    BadRequest,
    BatchItem,
    ChannelMessage,
    Client,
    Conflict,
    FastpollError,
    MarkRead,
    Message,
    NotFound,
    PollUrl,
    Unauthorized,
    Unavailable,
)

__version__ = "0.1.0"

__all__ = [
    "BadRequest",
    "BatchItem",
    "ChannelMessage",
    "Client",
    "Conflict",
    "FastpollError",
    "MarkRead",
    "Message",
    "NotFound",
    "PollUrl",
    "Unauthorized",
    "Unavailable",
]
