"""What fastpoll's site configuration costs nginx in front, against the ceiling's proxy location.

Run by `make bench` (the "hop" group) with the run's peers: the ceiling (nginx proxying /Poll/
with the stack's proxy settings to ceiling_back, nginx `return 200` on a unix socket) and
fastpoll_front (nginx/fastpoll.conf.j2, as `make up` renders it, with ceiling_back as its one
poll server). Both fronts proxy the same poll URL to the same upstream, so the difference in
their CPU per request is what the site's own configuration costs: the `wait` map (regular
expressions over the query), the `if`s and the error pages, the signed-URL log map where a log
is on. wrk -t2 -c50 keep-alive on one signed URL, plain and with `wait=`, in interleaved rounds.
"""

from __future__ import annotations

import statistics
from pathlib import Path

from loadtests.derive import Row
from loadtests.hop_cost import proxied_run
from loadtests.peers import Peer


def measure(
    ceiling: Peer,
    back: Peer,
    front: Peer,
    front_port: int,
    query: str,
    work: Path,
    seconds: float = 3.0,
    rounds: int = 3,
) -> list[Row]:
    """One row per round, kind (plain, held) and system: req/s, the front nginx's CPU µs per
    request (master and workers), the upstream's and the client's. query: a signed poll query
    (the URL is never checked here: ceiling_back answers every path)."""
    work.mkdir(parents=True, exist_ok=True)
    targets = {}
    for kind, q in (("plain", query), ("held", f"{query}&wait=30")):
        targets[kind] = work / f"front-{kind}.txt"
        targets[kind].write_text(q + "\n")
    rows: list[Row] = []
    for rnd in range(rounds):
        for kind in ("plain", "held"):
            for system, peer, port in (
                ("ceiling", ceiling, ceiling.port),
                ("fastpoll_site", front, front_port),
            ):
                env = {
                    "FP_PATH": "/Poll/getMessages",
                    "FP_TARGETS": str(targets[kind]),
                    "FP_USERS": "1",
                }
                run = proxied_run(peer.pid, back.pid, port, 50, seconds, env)
                rows.append({"round": rnd, "kind": kind, "system": system, **run})
    return rows


def summary(rows: list[Row]) -> dict[str, dict[str, float]]:
    """Per kind: the median front µs per request of each system and their difference."""
    out: dict[str, dict[str, float]] = {}
    for kind in ("plain", "held"):
        med = {
            s: statistics.median(
                float(r["front_us"]) for r in rows if r["kind"] == kind and r["system"] == s
            )
            for s in ("ceiling", "fastpoll_site")
            if any(r["kind"] == kind and r["system"] == s for r in rows)
        }
        if len(med) == 2:
            out[kind] = {
                "ceiling_us": round(med["ceiling"], 1),
                "fastpoll_site_us": round(med["fastpoll_site"], 1),
                "extra_us": round(med["fastpoll_site"] - med["ceiling"], 1),
            }
    return out
