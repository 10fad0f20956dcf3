"""Filter redis_master_decision: which Redis is the master when no sentinel answers (role redis,
tasks/master.yml). Fails closed: a master is named only when no other Redis can hold newer data.

Each probe describes one Redis host as this run saw it:

    {"name": "data2", "addr": "10.0.0.22 6379", "answered": true,
     "role": "master" | "slave", "master": "10.0.0.21 6379" (a replica's master),
     "replicas": 0 (connected replicas), "keys": 0 (keys in every database),
     "on_disk": false (a host that did not answer: an RDB or AOF file in Redis's directory)}

The answer is {"master": "ip port" or "", "reason": "..."}; "" means refuse, reason says why.
"""

from __future__ import annotations

from typing import Any

DOC = 'docs/runbook.md, "Redis: no sentinel answers"'


def _live(p: dict[str, Any]) -> bool:
    """A master that holds data or feeds replicas: it may be the real master."""
    return (
        bool(p.get("answered"))
        and p.get("role") == "master"
        and (int(p.get("keys", 0)) > 0 or int(p.get("replicas", 0)) > 0)
    )


def _empty_master(p: dict[str, Any]) -> bool:
    return (
        bool(p.get("answered"))
        and p.get("role") == "master"
        and int(p.get("keys", 0)) == 0
        and int(p.get("replicas", 0)) == 0
    )


def _describe(p: dict[str, Any]) -> str:
    if not p.get("answered"):
        return f"{p['name']} did not answer" + (" and has data on disk" if p.get("on_disk") else "")
    if p.get("role") == "master":
        return f"{p['name']} is a master with {p.get('keys', 0)} keys and {p.get('replicas', 0)} replicas"
    return f"{p['name']} replicates {p.get('master') or '?'}"


def redis_master_decision(
    probes: list[dict[str, Any]], first: str, bootstrap: bool = False
) -> dict[str, str]:
    if bootstrap:
        return {"master": first, "reason": f"redis_bootstrap: the first Redis host, {first}"}
    seen = "; ".join(_describe(p) for p in probes)
    refuse = (
        "No sentinel answers, and the Redis hosts do not show one safe master ({seen}): {why}. "
        "Nothing was changed. Bring the sentinels back (or find the master by hand) and run "
        "again; on a first deploy of empty hosts only, -e redis_bootstrap=true makes the first "
        "Redis host the master (" + DOC + ")."
    )
    unknown = [p for p in probes if not p.get("answered") and p.get("on_disk")]
    if unknown:
        why = ", ".join(p["name"] for p in unknown) + " may hold newer data (it does not answer)"
        return {"master": "", "reason": refuse.format(seen=seen, why=why)}
    live = [p for p in probes if _live(p)]
    if len(live) > 1:
        why = "several masters hold data: " + ", ".join(p["name"] for p in live)
        return {"master": "", "reason": refuse.format(seen=seen, why=why)}
    if len(live) == 1:
        m = live[0]
        others = [p for p in probes if p is not m and p.get("answered")]
        strays = [
            p
            for p in others
            if not (_empty_master(p) or (p.get("role") == "slave" and p.get("master") == m["addr"]))
        ]
        if strays:
            why = ", ".join(_describe(p) for p in strays) + f", not {m['name']}'s replica"
            return {"master": "", "reason": refuse.format(seen=seen, why=why)}
        return {
            "master": m["addr"],
            "reason": f"the only Redis that holds data or replicas: {m['name']}",
        }
    replicas = [p for p in probes if p.get("answered") and p.get("role") != "master"]
    if replicas:
        why = ", ".join(_describe(p) for p in replicas) + ", whose master does not answer"
        return {"master": "", "reason": refuse.format(seen=seen, why=why)}
    # Every Redis that answers is an empty master without replicas, and none that is silent has
    # data on disk: a first deploy.
    return {
        "master": first,
        "reason": f"a first deploy (every Redis empty): the first Redis host, {first}",
    }


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"redis_master_decision": redis_master_decision}
