"""fastpoll_testkit.procs.wait_for keeps trying while the server refuses connections, whether the
check reaches it with a socket (OSError) or through an httpx client (httpx.ConnectError, which
is not an OSError): a server slow to listen on a loaded machine is not a failed start."""

from __future__ import annotations

import httpx
import pytest

from fastpoll_testkit.procs import wait_for


@pytest.mark.parametrize(
    "error", [ConnectionRefusedError("refused"), httpx.ConnectError("refused")]
)
def test_wait_for_retries_refused_connections(error: Exception) -> None:
    calls = 0

    def check() -> bool:
        nonlocal calls
        calls += 1
        if calls < 3:
            raise error
        return True

    wait_for("server", check, timeout=5)
    assert calls == 3


def test_wait_for_names_the_last_refusal_on_timeout() -> None:
    def check() -> bool:
        raise httpx.ConnectError("refused")

    with pytest.raises(RuntimeError, match="did not become healthy"):
        wait_for("server", check, timeout=0.2)
