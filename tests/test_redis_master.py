"""Role redis, tasks/master.yml: with Sentinel, which Redis is the master when no sentinel
answers. It fails closed: a master is named only when no other Redis can hold newer data
(filter_plugins/redis_master.py), and the run stops before any REPLICAOF otherwise.

The decision is unit-tested on the filter, then the role's own tasks run with ansible-playbook on
this host against real redis-server processes on free loopback ports (no sentinel), each Redis a
host of a local inventory. Every Redis started here is stopped by its pid.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from fastpoll_testkit.procs import Server, free_port, redis_argv, wait_for
from fastpoll_testkit.stack import ROOT

ROLE = ROOT / "ansible" / "roles" / "redis"
ANSIBLE_PLAYBOOK = ROOT / ".venv" / "bin" / "ansible-playbook"
PASSWORD = "test-password-0123456789"

spec = importlib.util.spec_from_file_location(
    "redis_master", ROLE / "filter_plugins" / "redis_master.py"
)
assert spec and spec.loader
redis_master = importlib.util.module_from_spec(spec)
spec.loader.exec_module(redis_master)
decide = redis_master.redis_master_decision

A, B, C = "10.0.0.21 6379", "10.0.0.22 6379", "10.0.0.23 6379"


def master(name: str, addr: str, keys: int = 0, replicas: int = 0) -> dict[str, Any]:
    return {
        "name": name,
        "addr": addr,
        "answered": True,
        "role": "master",
        "master": "",
        "replicas": replicas,
        "keys": keys,
    }


def replica(name: str, addr: str, of: str, keys: int = 0) -> dict[str, Any]:
    return {
        "name": name,
        "addr": addr,
        "answered": True,
        "role": "slave",
        "master": of,
        "replicas": 0,
        "keys": keys,
    }


def silent(name: str, addr: str, on_disk: bool) -> dict[str, Any]:
    return {"name": name, "addr": addr, "answered": False, "on_disk": on_disk}


@pytest.mark.parametrize(
    ("probes", "bootstrap", "expected"),
    [
        # a first deploy: every Redis empty, or not installed yet (no data files)
        ([master("a", A), master("b", B), master("c", C)], False, A),
        ([master("a", A), silent("b", B, False), silent("c", C, False)], False, A),
        # the one master with data; the others its replicas or empty: that one, even if not first
        (
            [replica("a", A, B, keys=5), master("b", B, keys=5, replicas=1), master("c", C)],
            False,
            B,
        ),
        ([master("a", A, keys=9), silent("b", B, False)], False, A),
        # the bug this guards against: the first host came back as a master with stale data while
        # the real master (with its replica) is elsewhere: two masters hold data
        (
            [master("a", A, keys=3), master("b", B, keys=5, replicas=1), replica("c", C, B)],
            False,
            "",
        ),
        # the real master is down (its data on disk), its replica follows it: refuse
        ([master("a", A), silent("b", B, True), replica("c", C, B, keys=5)], False, ""),
        ([master("a", A, keys=3), silent("b", B, True)], False, ""),
        # a replica of a master that does not answer, nothing on disk there: still refuse
        ([master("a", A), replica("b", B, C), silent("c", C, False)], False, ""),
        # a replica of another host than the only master with data
        ([master("a", A, keys=3), replica("b", B, C), master("c", C)], False, ""),
        # explicit
        ([master("a", A, keys=3), master("b", B, keys=5, replicas=1)], True, A),
    ],
)
def test_decision(probes: list[dict[str, Any]], bootstrap: bool, expected: str) -> None:
    got = decide(probes, A, bootstrap)
    assert got["master"] == expected, got
    if not expected:
        assert "No sentinel answers" in got["reason"] and "redis_bootstrap=true" in got["reason"]


# ---- the role's tasks, on real Redis servers -----------------------------------------------


class Redis:
    def __init__(self, tmp: Path, name: str) -> None:
        self.name, self.port, self.dir = name, free_port(), tmp / name
        self.dir.mkdir()
        argv = redis_argv(
            self.port, "--requirepass", PASSWORD, "--masterauth", PASSWORD, dir=self.dir
        )
        self.server = Server(
            f"redis {name}",
            argv,
            self.port,
            log=tmp / f"{name}.log",
            ready=lambda: self.cli("PING") == "PONG",
            timeout=30,
        ).start()

    def cli(self, *args: str) -> str:
        run = subprocess.run(
            ["redis-cli", "--no-auth-warning", "-h", "127.0.0.1", "-p", str(self.port), *args],
            env={**os.environ, "REDISCLI_AUTH": PASSWORD},
            capture_output=True,
            text=True,
            check=False,
        )
        return run.stdout.strip()

    def stop(self) -> None:
        self.server.stop()


@pytest.fixture
def redises(tmp_path: Path) -> Iterator[list[Redis]]:
    started: list[Redis] = []
    try:
        for n in ("r1", "r2"):
            started.append(Redis(tmp_path, n))
        yield started
    finally:
        for r in started:
            r.stop()


def run_master(
    tmp: Path, hosts: dict[str, dict[str, object]], extra: dict[str, object] | None = None
) -> tuple[int, str, dict[str, Any]]:
    inv = tmp / "inventory.yml"
    inv.write_text(
        yaml.safe_dump(
            {
                "all": {
                    "vars": {
                        "ansible_connection": "local",
                        "ansible_python_interpreter": str(ROOT / ".venv" / "bin" / "python"),
                        "fastpoll_redis_password": PASSWORD,
                        "fastpoll_release_id": "test",
                    },
                    "hosts": hosts,
                    "children": {"redis": {"hosts": {h: None for h in hosts}}},
                }
            }
        )
    )
    out = tmp / "decision.json"
    play = tmp / "master.yml"
    play.write_text(
        yaml.safe_dump(
            [
                {
                    "name": "Find the Redis master",
                    "hosts": "r1",
                    "gather_facts": False,
                    "tasks": [
                        {
                            "name": "The role's master.yml",
                            "ansible.builtin.include_role": {
                                "name": "redis",
                                "tasks_from": "master",
                            },
                        },
                        {
                            "name": "Keep the decision",
                            "ansible.builtin.copy": {
                                "content": "{{ redis_master_decision | to_json }}",
                                "dest": str(out),
                                "mode": "0644",
                            },
                        },
                    ],
                }
            ]
        )
    )
    env = {
        **os.environ,
        "ANSIBLE_ROLES_PATH": str(ROOT / "ansible" / "roles"),
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_HOME": str(tmp / "ansible-home"),
    }
    argv = [str(ANSIBLE_PLAYBOOK), "-i", str(inv), str(play)]
    if extra:
        (tmp / "extra.json").write_text(json.dumps(extra))
        argv += ["-e", f"@{tmp / 'extra.json'}"]
    run = subprocess.run(argv, capture_output=True, text=True, env=env, check=False, timeout=180)
    decision = json.loads(out.read_text()) if out.exists() else {}
    return run.returncode, run.stdout + run.stderr, decision


def host(r: Redis) -> dict[str, object]:
    return {
        "fastpoll_private_ip": "127.0.0.1",
        "fastpoll_redis_port": r.port,
        "redis_data_dir": str(r.dir),
    }


def test_first_deploy_names_the_first_host(tmp_path: Path, redises: list[Redis]) -> None:
    r1, r2 = redises
    rc, out, decision = run_master(tmp_path, {"r1": host(r1), "r2": host(r2)})
    assert rc == 0, out
    assert decision["master"] == f"127.0.0.1 {r1.port}", decision


def test_the_real_master_is_found_not_the_first_host(tmp_path: Path, redises: list[Redis]) -> None:
    r1, r2 = redises
    r2.cli("SET", "k", "v")
    r1.cli("REPLICAOF", "127.0.0.1", str(r2.port))
    wait_for("r1 replicating r2", lambda: "master_link_status:up" in r1.cli("INFO", "replication"))
    rc, out, decision = run_master(tmp_path, {"r1": host(r1), "r2": host(r2)})
    assert rc == 0, out
    assert decision["master"] == f"127.0.0.1 {r2.port}", decision


def test_two_masters_with_data_are_refused(tmp_path: Path, redises: list[Redis]) -> None:
    r1, r2 = redises
    r1.cli("SET", "stale", "1")
    r2.cli("SET", "k", "v")
    rc, out, _ = run_master(tmp_path, {"r1": host(r1), "r2": host(r2)})
    assert rc != 0
    flat = " ".join(out.split())
    assert "several masters hold data: r1, r2" in flat, out
    # explicitly told: the first host
    rc, out, decision = run_master(
        tmp_path, {"r1": host(r1), "r2": host(r2)}, {"redis_bootstrap": True}
    )
    assert rc == 0 and decision["master"] == f"127.0.0.1 {r1.port}", out


def test_a_silent_host_with_data_on_disk_is_refused(tmp_path: Path, redises: list[Redis]) -> None:
    r1, _ = redises
    gone = tmp_path / "r3"
    gone.mkdir()
    hosts = {
        "r1": host(r1),
        "r3": {
            "fastpoll_private_ip": "127.0.0.1",
            "fastpoll_redis_port": free_port(),
            "redis_data_dir": str(gone),
        },
    }
    rc, out, decision = run_master(tmp_path, hosts)
    assert rc == 0 and decision["master"] == f"127.0.0.1 {r1.port}", (
        out
    )  # nothing on disk: first deploy
    (gone / "dump.rdb").write_bytes(b"REDIS0011")
    rc, out, _ = run_master(tmp_path, hosts)
    assert rc != 0
    assert "r3 may hold newer data" in " ".join(out.split()), out
