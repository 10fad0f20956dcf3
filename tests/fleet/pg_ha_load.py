"""Publish and poll load across a PostgreSQL failover, for tests/fleet/scenarios/postgres-ha.sh.

Load mode: publishers (one user each) POST "pgha <user> <seq>" with an Idempotency-Key through the
app hosts in turn, one at a time per user, each answer recorded (start, end, status, replayed); a
publish not answered 201 is sent again with the same key (as a site's backend does) until it is,
and only then the next one. Pollers GET the given signed poll paths through both pollers. It runs
until the events file has a `stop` line (or --max-seconds) and writes every observation to --out
as JSON.

Check mode (--check OUT --events FILE --stored FILE): FILE lists "user<TAB>text" of the rows the
database holds after the failover. Prints the figures and exits 1 when an acknowledged (201)
publish is missing or stored twice, publishes did not succeed again within --max-gap seconds of
the kill (the events file's `kill`, or `disrupt` for a disruption that should cost nothing),
more than --max-failed attempts were not answered 201, or more than 1 % of the polls were not
answered 2xx.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from collections import Counter

from fastpoll_testkit.drill import DrillLoad, arguments, read_events


class Load(DrillLoad):
    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__(args)
        self.polls: list[tuple[float, int]] = []
        self.publishes: list[tuple[int, str, float, float, int, bool]] = []

    def publisher(self, user: int) -> None:
        seq, attempt, status = 0, 0, 201
        while not self.stop.is_set():
            if status == 201:
                seq += 1
            attempt += 1
            text = f"pgha {user} {seq}"
            t0 = time.time()
            status, r = self.publish(
                self.apps[attempt % len(self.apps)], user, text, f"pgha-{user}-{seq}"
            )
            replayed = r is not None and r.getheader("Idempotent-Replayed") == "true"
            with self.lock:
                self.publishes.append((user, text, t0, time.time(), status, replayed))
            time.sleep(0.05 if status == 201 else 0.2)

    def poller(self, i: int) -> None:
        n = 0
        while not self.stop.is_set():
            n += 1
            host = self.pollers[(n + i) % len(self.pollers)]
            path = self.paths[n % len(self.paths)]
            try:
                status = self.get(host, path)[0]
            except OSError:
                status = 0
            with self.lock:
                self.polls.append((time.time(), status))
            time.sleep(0.02)

    def run(self, out: str) -> None:
        threads = [threading.Thread(target=self.watch)]
        threads += [threading.Thread(target=self.publisher, args=(u,)) for u in self.users]
        threads += [threading.Thread(target=self.poller, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        with open(out, "w") as f:
            json.dump({"polls": self.polls, "publishes": self.publishes}, f)
        print(f"pg_ha_load: {len(self.polls)} polls, {len(self.publishes)} publishes")


def check(args: argparse.Namespace) -> int:
    with open(args.check) as f:
        data = json.load(f)
    events = read_events(args.events)
    kill = events["kill"] if "kill" in events else events["disrupt"]
    stored: Counter[str] = Counter()
    with open(args.stored) as f:
        for line in f:
            _, _, text = line.rstrip("\n").partition("\t")
            stored[text] += 1
    pubs = data["publishes"]
    acked = [p for p in pubs if p[4] == 201]
    lost = [p[1] for p in acked if stored[p[1]] == 0]
    twice = [t for t, n in stored.items() if n > 1 and t.startswith("pgha ")]
    # The gap: from the kill to the first 201 of an attempt started after the first failed one
    # (publishes started just after the kill, before the primary died, are acknowledged).
    failed_after = [p[2] for p in pubs if p[4] != 201 and p[2] >= kill]
    since = min(failed_after) if failed_after else kill
    after = sorted(p[3] for p in acked if p[2] >= since)
    gap = (after[0] - kill) if after else float("inf")
    last_before = max((p[3] for p in acked if p[3] <= kill), default=float("nan"))
    failed_pubs = sum(1 for p in pubs if p[4] != 201)
    replayed = sum(1 for p in acked if p[5])
    # Sent again with the same key after a failed attempt, and then acknowledged.
    failed_texts = {p[1] for p in pubs if p[4] != 201}
    retried_acked = sum(1 for p in acked if p[1] in failed_texts)
    polls = data["polls"]
    bad_polls = sum(1 for _, s in polls if not 200 <= s < 300)
    during = [s for t, s in polls if kill <= t <= kill + max(gap, 1.0)]
    bad_during = sum(1 for s in during if not 200 <= s < 300)
    print(
        f"{len(acked)} publishes acknowledged (201), {len(lost)} lost, {len(twice)} stored twice; "
        f"publishes failing for {gap:.1f} s after the kill (last 201 {kill - last_before:.1f} s "
        f"before it; {failed_pubs} attempts not 201, {retried_acked} publishes acknowledged on a "
        f"retry with the same key, {replayed} of them as a replay); polls: {len(polls)}, "
        f"{bad_polls} not 2xx "
        f"({len(during)} during the failover, {bad_during} not 2xx)"
    )
    problems = []
    if lost:
        problems.append(f"acknowledged publishes lost: {lost[:10]}")
    if twice:
        problems.append(f"publishes stored twice: {twice[:10]}")
    if gap > args.max_gap:
        problems.append(f"publishes did not succeed again within {args.max_gap:g} s ({gap:.1f} s)")
    if args.max_failed >= 0 and failed_pubs > args.max_failed:
        problems.append(f"{failed_pubs} publish attempts not 201 (at most {args.max_failed})")
    if not acked or not polls:
        problems.append("no load")
    elif bad_polls > len(polls) / 100:
        problems.append(f"{bad_polls} of {len(polls)} polls not 2xx")
    for p in problems:
        print(f"FAIL: {p}")
    return 1 if problems else 0


def main() -> int:
    ap = arguments(max_seconds=120)
    ap.add_argument("--stored", default="")
    ap.add_argument("--max-gap", type=float, default=30)
    ap.add_argument("--max-failed", type=int, default=-1, help="-1: any number")
    args = ap.parse_args()
    if args.check:
        return check(args)
    Load(args).run(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
