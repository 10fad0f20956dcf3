"""@fastpoll/client (sdk/node) against a real stack: fastpoll_testkit's Stack (nginx, a poll
server, memcached, the app on SQLite) is started here and the SDK's own suite
(sdk/node/test, node --test on the built dist/) is run on it with `npm test`; it must pass.
Build first: `make sdk-node` runs npm ci and npm run build, then this file."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from fastpoll_testkit.procs import free_port
from fastpoll_testkit.stack import Stack

NODE_SDK = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    s = Stack(
        run_dir=tmp_path_factory.mktemp("sdk-node-stack"),
        n_pollers=1,
        app_workers=1,
        announce=False,
    )
    s.start()
    yield s
    s.stop()


def test_node_sdk_suite_passes_on_a_real_stack(stack: Stack) -> None:
    npm = shutil.which("npm")
    assert npm, "npm is not installed (make sdk-node installs Debian's nodejs and npm)"
    assert (NODE_SDK / "dist" / "index.js").is_file(), "not built: run make sdk-node"
    env = os.environ | {
        "FASTPOLL_APP_URL": stack.app_url(),
        "FASTPOLL_TOKEN": stack.api_token,
        "FASTPOLL_PUBLIC_URL": stack.base_url,
        # A free port nothing listens on: a connection refused, never made.
        "FASTPOLL_DEAD_URL": f"http://127.0.0.1:{free_port()}",
    }
    run = subprocess.run(
        [npm, "test"],
        cwd=NODE_SDK,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    report = run.stdout + run.stderr
    assert run.returncode == 0, report
    # Every test ran and passed (node --test's summary), none skipped.
    assert "# fail 0" in report and "# pass 8" in report, report
