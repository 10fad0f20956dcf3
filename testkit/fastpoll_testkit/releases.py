"""Earlier releases of the app, for the tests that run them beside this tree's (a rolling
upgrade): tests/test_mixed_versions.py and the contract checker's `app-previous-release` fault.

RELEASES names the last release before each schema change; PREVIOUS is the release before this
tree, the one a rolling upgrade to this tree runs beside. Every release moves PREVIOUS to itself;
every schema change adds the release before it to RELEASES."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from fastpoll_testkit.stack import ROOT

RELEASES = {
    "before-channels": "cc9fbe0",  # schema 2: owners are users only
    "before-channel-outbox": "b78c6df",  # schema 3: a room's outbox row among the users'
    "before-data": "a956ac3",  # schema 5: a message is its text alone
}
PREVIOUS = "a956ac3"
# What PREVIOUS's API has of what this tree's has, where a client must wait for every host to
# run this tree (docs/deploy.md): the contract's workload uses the rest only beside it.
PREVIOUS_HAS: frozenset[str] = frozenset()  # not "data": a message is its text alone


def git_dir() -> Path:
    """The repository the releases are read from: this tree's, or FP_GIT_DIR's for a tree
    exported without one (the defects tool's copies)."""
    return Path(os.environ.get("FP_GIT_DIR") or ROOT)


def extract(rev: str, into: Path) -> Path:
    """The release's fallback_app package directory (for Stack.app_trees)."""
    archive = subprocess.run(
        ["git", "-C", str(git_dir()), "archive", rev, "fallback_app"],
        check=True,
        capture_output=True,
    ).stdout
    into.mkdir(parents=True, exist_ok=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into / "fallback_app"
