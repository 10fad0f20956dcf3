"""The Ansible role refuses to deploy an app host without the write API's bearer token:
before, it wrote api_token_file only when fastpoll_api_token was defined, and the app
served an open write API. The check runs alone (its own task file), against localhost."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import REPO_ROOT

TASKS = REPO_ROOT / "ansible" / "roles" / "fallback_app" / "tasks" / "api_token.yml"
PLAYBOOK = f"""
- hosts: localhost
  connection: local
  gather_facts: false
  tasks:
    - ansible.builtin.include_tasks: {TASKS}
"""


def _play(tmp_path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    binary = Path(sys.executable).parent / "ansible-playbook"
    if not binary.exists():
        pytest.skip("ansible-playbook not installed (make .venv/.ansible)")
    play = tmp_path / "play.yml"
    play.write_text(PLAYBOOK)
    env = {**os.environ, "ANSIBLE_LOCAL_TEMP": str(tmp_path), "ANSIBLE_NOCOLOR": "1"}
    return subprocess.run(
        [str(binary), "-i", "localhost,", str(play), *extra],
        capture_output=True, text=True, timeout=120, env=env, check=False,
    )  # fmt: skip


def test_no_token_no_deploy(tmp_path: Path) -> None:
    r = _play(tmp_path)
    assert r.returncode != 0
    assert "fastpoll_api_token is not set for localhost" in r.stdout, r.stdout
    r = _play(tmp_path, "-e", "fastpoll_api_token=")
    assert r.returncode != 0 and "fastpoll_api_token is not set" in r.stdout, r.stdout


def test_a_token_passes(tmp_path: Path) -> None:
    r = _play(tmp_path, "-e", "fastpoll_api_token=0123456789abcdef0123")
    assert r.returncode == 0, r.stdout + r.stderr
