"""The one nginx template's choice of active poll servers (nginx/fastpoll.conf.j2,
`fastpoll_active_pollers`): "auto" sends to one poller per 3 cores, rounded up, and keeps the
rest as `backup`; 0 makes every poller active; N the first N. Rendered as the harness and the
Ansible nginx role render it, without starting anything."""

from __future__ import annotations

from pathlib import Path

import jinja2
import pytest

from fastpoll_testkit.stack import poller_servers

NGINX = Path(__file__).resolve().parent.parent / "nginx"


def upstream(**extra: object) -> list[str]:
    """The `server` lines of upstream fastpoll_pollers, rendered with extra variables."""
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(NGINX), undefined=jinja2.StrictUndefined
    )
    site = env.get_template("fastpoll.conf.j2").render(
        fastpoll_listen="127.0.0.1:8080",
        fastpoll_apps=["127.0.0.1:8000"],
        **extra,
    )
    servers = poller_servers(site)
    assert servers, site
    return servers


def pollers(n: int) -> list[str]:
    return [f"unix:/run/fastpoll/poller-{i}.sock" for i in range(n)]


@pytest.mark.parametrize(
    ("cores", "n", "active"),
    [(1, 1, 1), (2, 2, 1), (3, 3, 1), (4, 4, 2), (6, 6, 2), (8, 8, 3), (16, 16, 6), (2, 1, 1)],
)
def test_auto_is_one_active_poller_per_three_cores(cores: int, n: int, active: int) -> None:
    servers = upstream(fastpoll_pollers=pollers(n), fastpoll_cores=cores)
    assert len(servers) == n
    assert [s.endswith(" backup") for s in servers] == [i >= active for i in range(n)], servers


def test_auto_without_cores_and_zero_make_every_poller_active() -> None:
    for extra in ({}, {"fastpoll_active_pollers": 0, "fastpoll_cores": 2}):
        servers = upstream(fastpoll_pollers=pollers(4), **extra)
        assert not [s for s in servers if s.endswith(" backup")], (extra, servers)


def test_a_number_makes_the_first_n_active() -> None:
    servers = upstream(fastpoll_pollers=pollers(4), fastpoll_active_pollers="3", fastpoll_cores=2)
    assert [s.endswith(" backup") for s in servers] == [False, False, False, True], servers
