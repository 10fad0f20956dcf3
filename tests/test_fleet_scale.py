"""The 150-poller fleet (ansible/inventories/scale150, docs/deploy.md "150 pollers"), without
booting a host:

- the connection budgets, computed by the budgets role itself: ansible-playbook runs it on this
  host (connection local) against the generated inventory, and its numbers are read back;
- the pollers play's rollout time: Ansible's own batches (the play's `serial` expression from
  site.yml, run by ansible-playbook with a probe task) and its forks (ansible.cfg), times each
  host's work: its instances restarted poll_server_restart_parallel at a time, the gate, the
  rest of the play, plus each batch's fleet gate (its bake). It fails when it exceeds 15 minutes.

The per-step costs are estimates (below), not measurements of a 150-host run: the fleet run
checks them (docs/deploy.md).
"""

from __future__ import annotations

import math
import os
import re
import subprocess
from pathlib import Path

import yaml

from fastpoll_testkit.stack import ROOT

ANSIBLE = ROOT / "ansible"
INVENTORY = ANSIBLE / "inventories" / "scale150" / "hosts.yml"
PLAYBOOK = ROOT / ".venv" / "bin" / "ansible-playbook"
# The batches the 150-poller rollout runs with (docs/deploy.md, "150 pollers").
BATCHES = '[1, "5%", "25%", "100%"]'
TARGET_S = 15 * 60
# Per step of one host's rolling restart: systemd's restart of the group (drain, start), the
# health probes, poll_server_restart_pause (2 s), Ansible's round trips for the three tasks.
RESTART_STEP_S = 5.0
# The rest of the pollers play on one host (about 60 tasks, mostly ok, at 0.5 s each).
OTHER_TASKS_S = 30.0


def env(tmp: Path) -> dict[str, str]:
    return {
        **os.environ,
        "ANSIBLE_CONFIG": str(ANSIBLE / "ansible.cfg"),
        "ANSIBLE_ROLES_PATH": str(ANSIBLE / "roles"),
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_HOME": str(tmp / "ansible-home"),
    }


def playbook(tmp: Path, plays: list[dict[str, object]], *args: str, expect_rc: int = 0) -> str:
    f = tmp / "play.yml"
    f.write_text(yaml.safe_dump(plays, sort_keys=False))
    run = subprocess.run(
        [
            str(PLAYBOOK),
            "-i",
            str(INVENTORY),
            str(f),
            "-c",
            "local",
            "-e",
            "fastpoll_release_id=test",
            *args,
        ],
        capture_output=True,
        text=True,
        env=env(tmp),
        check=False,
        timeout=600,
    )
    assert run.returncode == expect_rc, run.stdout[-4000:] + run.stderr[-2000:]
    return run.stdout


def test_inventory_is_the_generated_one(tmp_path: Path) -> None:
    run = subprocess.run(
        [str(ROOT / ".venv" / "bin" / "python"), str(INVENTORY.parent / "generate.py")],
        capture_output=True,
        text=True,
        check=True,
    )
    assert run.stdout == INVENTORY.read_text(), "regenerate hosts.yml with generate.py"
    graph = subprocess.run(
        [str(ROOT / ".venv" / "bin" / "ansible-inventory"), "-i", str(INVENTORY), "--list"],
        capture_output=True,
        text=True,
        env=env(tmp_path),
        check=True,
    ).stdout
    inv = yaml.safe_load(graph)
    sizes = {
        g: len(inv[g]["hosts"])
        for g in (
            "pollers",
            "memcached",
            "redis",
            "redis_sentinel",
            "postgresql",
            "app",
            "edge",
            "etcd",
        )
    }
    assert sizes == {
        "pollers": 150,
        "memcached": 6,
        "redis": 3,
        "redis_sentinel": 3,
        "postgresql": 3,
        "app": 8,
        "edge": 4,
        "etcd": 3,
    }
    # etcd on hosts that are neither database nor monitoring hosts
    assert not set(inv["etcd"]["hosts"]) & set(
        inv["postgresql"]["hosts"] + inv["monitoring"]["hosts"]
    )


def test_budgets_of_the_150_poller_fleet(tmp_path: Path) -> None:
    out = playbook(
        tmp_path,
        [
            {
                "name": "Budgets",
                "hosts": "all",
                "gather_facts": False,
                "roles": [{"role": "budgets"}],
            }
        ],
        "--limit",
        "poll001",
        # No database runs behind this inventory: its limits are the inventory's.
        "-e",
        "budgets_live_limits=false",
    )
    m = re.search(
        r"Connections: memcached (\d+) of (\d+) per node, Redis (\d+) of (\d+), "
        r"PostgreSQL (\d+) of (\d+), Sentinel (\d+) of (\d+) per sentinel, "
        r"fallbacks in flight (\d+) of (\d+) the app workers serve at once",
        " ".join(out.split()),
    )
    assert m, out[-3000:]
    mc, mc_max, rd, rd_max, pg, pg_max, sn, sn_max, fb, fb_max = map(int, m.groups())
    print(
        f"budgets: memcached {mc}/{mc_max} per node, Redis {rd}/{rd_max}, PostgreSQL {pg}/{pg_max},"
        f" Sentinel {sn}/{sn_max}, fallbacks in flight {fb}/{fb_max}"
    )
    # 4,800 instances x 1 + 32 workers x 41 + 32; x 2 for Redis; 32 x 20 + 8; on a sentinel
    # 4,800 x 3 + 32 x 42 + 32; 150 pollers x 8 fallbacks against 32 workers x 40 threads.
    assert (mc, rd, pg) == (4800 + 32 * 41 + 32, 2 * 4800 + 32 * 41 + 32, 32 * 20 + 8)
    assert (sn, fb, fb_max) == (4800 * 3 + 32 * 42 + 32, 150 * 8, 32 * 40)
    assert mc <= mc_max and rd <= rd_max and pg <= pg_max and sn <= sn_max and fb <= fb_max


def test_a_fleet_whose_fallbacks_or_failover_exceed_the_app_or_a_sentinel_is_refused(
    tmp_path: Path,
) -> None:
    """The defaults (64 fallbacks per nginx host, 10,000 clients per sentinel) on 150 pollers:
    refused, naming both numbers; a poller with no cap makes the fallbacks unbounded."""
    plays = [{"name": "Budgets", "hosts": "all", "gather_facts": False, "roles": ["budgets"]}]
    base = ["--limit", "poll001", "-e", "budgets_live_limits=false"]
    out = " ".join(
        playbook(
            tmp_path,
            plays,
            *base,
            "-e",
            '{"nginx_fallback_max_conns": 64, "redis_sentinel_maxclients": 10000}',
            expect_rc=2,
        ).split()
    )
    assert "15776 on each sentinel during a failover (4800 x 3 + 32 x 42 + 32; " \
        "redis_sentinel_maxclients 10000)" in out, out[-3000:]
    assert "9600 fallbacks in flight to the app tier (nginx_fallback_max_conns summed over 150 " \
        "pollers) where its workers serve 1280 at once (32 x 40)" in out, out[-3000:]
    out = " ".join(
        playbook(
            tmp_path, plays, *base, "-e", '{"nginx_fallback_max_conns": 0}', expect_rc=2
        ).split()
    )
    assert "unbounded fallbacks in flight to the app tier (nginx_fallback_max_conns 0 on " \
        "poll001, poll002," in out, out[-3000:]


def rollout(tmp: Path, batches: str, parallel: int | None = None) -> tuple[float, list[int], int]:
    site = yaml.safe_load((ANSIBLE / "site.yml").read_text())
    play = next(p for p in site if p.get("hosts") == "pollers" and "serial" in p)
    out = playbook(
        tmp,
        [
            {
                "name": "The pollers play's batches",
                "hosts": "pollers",
                "gather_facts": False,
                "serial": play["serial"],
                "max_fail_percentage": play["max_fail_percentage"],
                "tasks": [
                    {
                        "name": "Batch",
                        "run_once": True,
                        "ansible.builtin.debug": {
                            "msg": "BATCH {{ ansible_play_batch | length }}"
                            " FORKS {{ ansible_forks }}"
                        },
                    }
                ],
            }
        ],
        "-e",
        f'{{"fastpoll_poller_batches": {batches}}}',
    )
    found = re.findall(r"BATCH (\d+) FORKS (\d+)", out)
    sizes = [int(b) for b, _ in found]
    forks = int(found[0][1])
    assert sum(sizes) == 150
    hostvars = yaml.safe_load(INVENTORY.read_text())["all"]["vars"]
    instances = 32
    par = parallel or int(hostvars.get("poll_server_restart_parallel", 1))
    roles = ANSIBLE / "roles"
    gate = yaml.safe_load((roles / "rollout_gate" / "defaults" / "main.yml").read_text())
    # The window after the restart, and the wait for its log lines (the log flush, 5 s, + 1).
    gate_s = float(gate["rollout_gate_seconds"]) + 5 + 1
    per_host = math.ceil(instances / par) * RESTART_STEP_S + gate_s + OTHER_TASKS_S
    # Then the fleet gate, once per batch: its bake and the wait for the bake's last polls to
    # reach Prometheus (role slo_gate; the inventory has monitoring hosts).
    slo = yaml.safe_load((roles / "slo_gate" / "defaults" / "main.yml").read_text())
    slo_s = float(hostvars.get("slo_gate_bake_seconds", slo["slo_gate_bake_seconds"])) + float(
        hostvars.get("slo_gate_scrape_wait_seconds", slo["slo_gate_scrape_wait_seconds"])
    )
    assert yaml.safe_load(INVENTORY.read_text())["all"]["children"]["monitoring"]["hosts"]
    total = sum(math.ceil(b / forks) * per_host + slo_s for b in sizes)
    return total, sizes, forks


def test_the_150_poller_rollout_fits_15_minutes(tmp_path: Path) -> None:
    total, sizes, forks = rollout(tmp_path, BATCHES)
    print(f"rollout: batches {sizes}, forks {forks}: {total:.0f} s ({total / 60:.1f} min)")
    assert total <= TARGET_S, (total, sizes, forks)
    # The old settings (the default ramp, each instance alone) would not.
    old, _, _ = rollout(tmp_path, '[1, "10%", "25%", "100%"]', parallel=1)
    assert old > TARGET_S


def test_the_pre_flight_names_a_host_that_does_not_answer(tmp_path: Path) -> None:
    """site.yml's first play (tags: always) on a host that answers and one that refuses ssh (a
    closed loopback port): the run stops there, naming the silent host; with only the host that
    answers, the pre-flight passes."""
    site = yaml.safe_load((ANSIBLE / "site.yml").read_text())
    preflight = tmp_path / "preflight.yml"
    preflight.write_text(yaml.safe_dump(site[:1], sort_keys=False))
    hosts = {
        "here": {"ansible_connection": "local"},
        "gone": {"ansible_host": "127.0.0.254", "ansible_port": 1, "ansible_ssh_timeout": 2},
    }
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(yaml.safe_dump({"all": {"hosts": hosts}}))

    def run(*limit: str) -> subprocess.CompletedProcess[str]:
        argv = [str(PLAYBOOK), "-i", str(inventory), str(preflight), *limit]
        return subprocess.run(
            argv, capture_output=True, text=True, env=env(tmp_path), check=False, timeout=120
        )

    refused = run()
    assert refused.returncode != 0
    assert "These hosts do not answer: gone. Nothing was changed." in refused.stdout
    assert "--limit '!gone'" in refused.stdout
    passed = run("--limit", "here")
    assert passed.returncode == 0, passed.stdout[-2000:]
