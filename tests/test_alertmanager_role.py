"""The alertmanager role's receivers and inhibitions (docs/operations.md, "Alerting";
ansible/roles/alertmanager/README.md), checked with the real tools and no host booted:

- its refusal of pages or a Watchdog that go nowhere: the role's own assert tasks run by
  ansible-playbook on localhost, with the variables given by -e;
- the rendered alertmanager.yml with PagerDuty's and Opsgenie's native configs, by
  `amtool check-config`, and its routes by `amtool config routes test`;
- the inhibitions, which amtool cannot evaluate, on a real Alertmanager on a free loopback port
  with the rendered config: an SLO page holds back the poll path's tickets and nothing else, and
  never a page (PostgresDown goes out while ErrorBudgetBurn pages). It is stopped by its pid.
"""

from __future__ import annotations

import json
import os
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from fastpoll_testkit.monitoring import Running, binary, render_template, scrape_when_up
from fastpoll_testkit.procs import free_port, wait_for
from fastpoll_testkit.stack import ROOT

ROLE = ROOT / "ansible" / "roles" / "alertmanager"
ANSIBLE_PLAYBOOK = ROOT / ".venv" / "bin" / "ansible-playbook"


def defaults() -> dict[str, Any]:
    d: dict[str, Any] = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    return d


def rendered(tmp: Path, **variables: object) -> Path:
    f = tmp / "alertmanager.yml"
    f.write_text(
        render_template(ROLE / "templates", "alertmanager.yml.j2", **{**defaults(), **variables})
    )
    return f


def amtool(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([binary("amtool"), *argv], capture_output=True, text=True, check=False)


# ---- the refusal: the role's assert tasks, run by Ansible ----------------------------------


def run_assert(tmp: Path, variables: dict[str, object]) -> subprocess.CompletedProcess[str]:
    play = tmp / "assert.yml"
    play.write_text(
        yaml.safe_dump(
            [
                {
                    "name": "The alertmanager role's receiver check",
                    "hosts": "localhost",
                    "gather_facts": False,
                    "tasks": [
                        {
                            "name": "Run it",
                            "ansible.builtin.include_role": {
                                "name": "alertmanager",
                                "tasks_from": "assert",
                                "defaults_from": "main",
                            },
                        }
                    ],
                }
            ]
        )
    )
    extra = tmp / "extra.json"
    # Role fastpoll (a dependency) reads the release's id from the build; none is needed here.
    extra.write_text(json.dumps({"fastpoll_release_id": "test", **variables}))
    env = {
        **os.environ,
        "ANSIBLE_ROLES_PATH": str(ROOT / "ansible" / "roles"),
        "ANSIBLE_LOCALHOST_WARNING": "false",
        "ANSIBLE_INVENTORY_UNPARSED_WARNING": "false",
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_HOME": str(tmp / "ansible-home"),
    }
    return subprocess.run(
        [str(ANSIBLE_PLAYBOOK), "-i", "localhost,", "-c", "local", str(play), "-e", f"@{extra}"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
        timeout=120,
    )


@pytest.mark.parametrize(
    ("variables", "refused", "named"),
    [
        ({}, True, ["alertmanager_page_webhook_url", "alertmanager_watchdog_webhook_url",
                    "alertmanager_allow_no_pager", "drop pages and the Watchdog"]),
        ({"alertmanager_page_webhook_url": "https://hooks.example/page"}, True,
         ["drop the Watchdog", "alertmanager_watchdog_webhook_url"]),
        ({"alertmanager_watchdog_webhook_url": "https://hc.example/ping"}, True,
         ["drop pages:", "alertmanager_page_pagerduty_routing_key"]),
        ({"alertmanager_allow_no_pager": True}, False, []),
        ({"alertmanager_page_pagerduty_routing_key": "r" * 32,
          "alertmanager_watchdog_webhook_url": "https://hc.example/ping"}, False, []),
        ({"alertmanager_page_opsgenie_api_key": "k" * 36,
          "alertmanager_watchdog_webhook_url": "https://hc.example/ping"}, False, []),
        ({"alertmanager_page_webhook_url": "https://hooks.example/page",
          "alertmanager_watchdog_webhook_url": "https://hc.example/ping"}, False, []),
    ],
)  # fmt: skip
def test_pages_that_go_nowhere_are_refused(
    tmp_path: Path, variables: dict[str, object], refused: bool, named: list[str]
) -> None:
    run = run_assert(tmp_path, variables)
    out = run.stdout + run.stderr
    assert (run.returncode != 0) == refused, out
    for words in named:
        assert words in " ".join(out.split()), (words, out)


def test_the_default_render_still_checks_but_has_no_integration(tmp_path: Path) -> None:
    """What the assert guards against: with its defaults the config is valid and every
    receiver is empty (amtool accepts it, and it would notify no one)."""
    f = rendered(tmp_path)
    run = amtool("check-config", str(f))
    assert run.returncode == 0, run.stdout + run.stderr
    receivers = yaml.safe_load(f.read_text())["receivers"]
    assert [r["name"] for r in receivers] == ["page", "ticket", "watchdog"]
    assert all(set(r) == {"name"} for r in receivers), receivers


# ---- PagerDuty and Opsgenie beside the webhooks ---------------------------------------------


def with_integrations(tmp: Path) -> Path:
    keys = tmp / "keys"
    keys.mkdir()
    for name in ("page-pagerduty", "page-opsgenie", "ticket-pagerduty", "ticket-opsgenie"):
        (keys / f"{name}.key").write_text("0123456789abcdef0123456789abcdef\n")
    return rendered(
        tmp,
        alertmanager_secrets_dir=str(keys),
        alertmanager_page_webhook_url="https://hooks.example/page",
        alertmanager_page_pagerduty_routing_key="secret",
        alertmanager_page_opsgenie_api_key="secret",
        alertmanager_ticket_pagerduty_routing_key="secret",
        alertmanager_ticket_opsgenie_api_key="secret",
        alertmanager_opsgenie_api_url="https://api.eu.opsgenie.com/",
        alertmanager_watchdog_webhook_url="https://hc.example/ping",
    )


def test_pagerduty_and_opsgenie_configs_pass_amtool(tmp_path: Path) -> None:
    f = with_integrations(tmp_path)
    run = amtool("check-config", str(f))
    assert run.returncode == 0, run.stdout + run.stderr
    text = f.read_text()
    assert "secret" not in text  # the keys are in files, not in alertmanager.yml
    page = next(r for r in yaml.safe_load(text)["receivers"] if r["name"] == "page")
    assert page["pagerduty_configs"][0]["routing_key_file"].endswith("/page-pagerduty.key")
    assert page["opsgenie_configs"][0]["api_key_file"].endswith("/page-opsgenie.key")
    assert page["opsgenie_configs"][0]["priority"] == "P1"
    assert page["webhook_configs"][0]["url"] == "https://hooks.example/page"


@pytest.mark.parametrize(
    ("labels", "receiver"),
    [
        ({"alertname": "PostgresDown", "host": "db1", "severity": "page"}, "page"),
        ({"alertname": "ErrorBudgetBurn", "slo": "poll-availability", "severity": "page"}, "page"),
        ({"alertname": "PollerDown", "host": "poll1", "severity": "ticket"}, "ticket"),
        ({"alertname": "Watchdog", "severity": "none"}, "watchdog"),
    ],
)
def test_routes_with_integrations(tmp_path: Path, labels: dict[str, str], receiver: str) -> None:
    f = with_integrations(tmp_path)
    run = amtool(
        "config", "routes", "test", f"--config.file={f}", f"--verify.receivers={receiver}",
        *(f"{k}={v}" for k, v in labels.items()),
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr


# ---- the inhibitions, on a real Alertmanager ------------------------------------------------

SLO_PAGE = {"alertname": "ErrorBudgetBurn", "severity": "page", "slo": "poll-availability",
            "job": "mtail", "route": "poll"}  # fmt: skip
ALERTS: list[dict[str, str]] = [
    SLO_PAGE,
    # pages: never held back
    {"alertname": "PostgresDown", "severity": "page", "job": "postgres", "host": "db1"},
    {"alertname": "CacheServerUnreachable", "severity": "page", "server": "10.0.0.21:11211"},
    {"alertname": "ErrorBudgetBurn", "severity": "page", "slo": "poll-latency", "job": "mtail",
     "route": "poll"},
    # the poll path's tickets: held back by the SLO page
    {"alertname": "PollerDown", "severity": "ticket", "job": "fastpoll_poller", "host": "poll1",
     "poller": "8101"},
    {"alertname": "AppDown", "severity": "ticket", "job": "fastpoll_app", "host": "app1"},
    {"alertname": "ErrorBudgetBurn", "severity": "ticket", "slo": "poll-latency", "job": "mtail",
     "route": "poll"},
    # tickets off the poll path: not held back
    {"alertname": "DiskSpaceLow", "severity": "ticket", "job": "node", "host": "db1",
     "mountpoint": "/var"},
    {"alertname": "BackupTooOld", "severity": "ticket", "job": "node", "host": "backup1"},
]  # fmt: skip
HELD = {("PollerDown", "ticket"), ("AppDown", "ticket"), ("ErrorBudgetBurn", "ticket")}


def test_an_slo_page_mutes_no_page_and_only_the_poll_path(tmp_path: Path) -> None:
    f = with_integrations(tmp_path)
    assert amtool("check-config", str(f)).returncode == 0
    port = free_port()
    am = Running(
        [binary("alertmanager"), f"--config.file={f}", f"--storage.path={tmp_path / 'data'}",
         f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address="],
        tmp_path / "alertmanager.log",
    )  # fmt: skip
    try:
        base = f"http://127.0.0.1:{port}"
        scrape_when_up(f"{base}/-/ready", am, "alertmanager")
        now = datetime.now(UTC)
        body = [
            {"labels": labels, "startsAt": now.isoformat(),
             "endsAt": (now + timedelta(minutes=10)).isoformat()}
            for labels in ALERTS
        ]  # fmt: skip
        r = httpx.post(f"{base}/api/v2/alerts", json=body, timeout=10)
        assert r.status_code == 200, r.text

        def states() -> dict[tuple[str, str, str], list[str]]:
            got = httpx.get(f"{base}/api/v2/alerts", timeout=10).json()
            return {
                (a["labels"]["alertname"], a["labels"]["severity"], a["labels"].get("slo", "")):
                    a["status"]["inhibitedBy"]
                for a in got
            }  # fmt: skip

        # Alertmanager evaluates inhibitions as alerts arrive; wait until all are listed and
        # the expected ones show as inhibited.
        def settled() -> bool:
            s = states()
            return len(s) == len(ALERTS) and all(
                bool(v) == ((k[0], k[1]) in HELD) for k, v in s.items()
            )

        wait_for("every alert listed, the poll path's tickets inhibited", settled, timeout=30)
        s = states()
        assert s[("PostgresDown", "page", "")] == []
        assert s[("ErrorBudgetBurn", "page", "poll-latency")] == []
        assert s[("CacheServerUnreachable", "page", "")] == []
        assert s[("DiskSpaceLow", "ticket", "")] == []
        assert s[("BackupTooOld", "ticket", "")] == []
        assert s[("PollerDown", "ticket", "")] and s[("AppDown", "ticket", "")]
    finally:
        am.stop()
