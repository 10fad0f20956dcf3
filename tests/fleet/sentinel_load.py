"""Poll and publish load across a Redis failover, for tests/fleet/scenarios/redis-sentinel.sh.

Load mode: plain polls (no If-None-Match) on the first two users' signed paths against both
pollers, publishes of "sntl <seq>" to the other users through the app hosts every 0.25 s, and one
held poll (wait=20 with the current ETag) per such user, each recording which publishes its answers
carry and when. It runs until the events file says `stop` (or --max-seconds) and writes every
observation to --out as JSON.

Check mode (--check OUT --events FILE): splits the run at the events redis-sentinel.sh wrote (kill,
promoted, restarted, replica: wall-clock seconds) and prints the figures; exits 1 when a poll
answered 5xx or failed to connect (more than 1 % of the polls), a publish did not answer 201, no
poll was a cache hit after the failover, or a publish after the failover did not wake its held
poll within 5 s, or the median wake took over 1 s (the announcements, not the re-check, must wake
them: the poll servers subscribe on the new master).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import threading
import time

from fastpoll_testkit.drill import DrillLoad, arguments, read_events

SEQ = re.compile(rb"sntl (\d+)")


class Load(DrillLoad):
    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__(args)
        self.polls: list[tuple[float, int, str]] = []
        self.publishes: list[tuple[int, int, float, float, int, str]] = []
        self.wakes: list[tuple[int, float, str]] = []
        self.held_errors: list[tuple[float, str]] = []

    def poller(self, i: int) -> None:
        n = 0
        while not self.stopped():
            host = self.pollers[(i + n) % len(self.pollers)]
            path = self.paths[n % 2]
            n += 1
            try:
                status, _, source, _ = self.get(host, path, {}, 5)
            except OSError as exc:
                status, source = 0, type(exc).__name__
            with self.lock:
                self.polls.append((time.time(), status, source))
            time.sleep(0.05)

    def publisher(self) -> None:
        seq = 0
        held = self.users[2:]
        while not self.stopped():
            seq += 1
            user = held[seq % len(held)]
            app = self.apps[seq % len(self.apps)]
            sent = time.time()
            status, r = self.publish(app, user, f"sntl {seq}")
            cache = (r.getheader("X-Cache-Publish") or "-") if r is not None else "failed"
            with self.lock:
                self.publishes.append((seq, user, sent, time.time(), status, cache))
            time.sleep(max(0.0, 0.25 - (time.time() - sent)))

    def holder(self, k: int) -> None:
        path = self.paths[2 + k]
        host = self.pollers[k % len(self.pollers)]
        tag = ""
        seen: set[int] = set()
        while not self.stopped():
            try:
                if tag:
                    status, etag, source, body = self.get(
                        host, path + "&wait=20", {"If-None-Match": tag}, 30
                    )
                else:
                    status, etag, source, body = self.get(host, path, {}, 10)
            except OSError as exc:
                with self.lock:
                    self.held_errors.append((time.time(), type(exc).__name__))
                time.sleep(0.2)
                continue
            now = time.time()
            if status == 200:
                new = {int(m) for m in SEQ.findall(body)} - seen
                seen |= new
                with self.lock:
                    self.wakes.extend((s, now, source) for s in new)
                tag = etag
            elif status != 304:
                with self.lock:
                    self.held_errors.append((now, str(status)))
                time.sleep(0.2)

    def run(self, out: str) -> None:
        threads = [threading.Thread(target=self.watch)]
        threads += [threading.Thread(target=self.poller, args=(i,)) for i in range(4)]
        threads.append(threading.Thread(target=self.publisher))
        holders = [
            threading.Thread(target=self.holder, args=(k,)) for k in range(len(self.users) - 2)
        ]
        for t in threads + holders:
            t.daemon = True
            t.start()
        for t in threads:
            t.join(200)
        # A held poll may wait up to 20 s for a publish that no longer comes: not waited for.
        for t in holders:
            t.join(1)
        with self.lock, open(out, "w") as f:
            json.dump(
                {
                    "polls": self.polls,
                    "publishes": self.publishes,
                    "wakes": self.wakes,
                    "held_errors": self.held_errors,
                },
                f,
            )
        print(
            f"load: {len(self.polls)} polls, {len(self.publishes)} publishes, "
            f"{len(self.wakes)} held-poll deliveries"
        )


def pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def check(out: str, events_file: str) -> int:
    with open(out) as f:
        data = json.load(f)
    ev = read_events(events_file)
    kill, promoted, restarted, replica = (
        ev["kill"],
        ev["promoted"],
        ev["restarted"],
        ev["replica"],
    )
    polls: list[list[float | int | str]] = data["polls"]
    failures: list[str] = []
    statuses: dict[str, int] = {}
    for _, st, _ in polls:
        statuses[str(st)] = statuses.get(str(st), 0) + 1
    non2xx = sum(v for k, v in statuses.items() if not k.startswith("2"))
    bad = sum(v for k, v in statuses.items() if k.startswith("5") or k == "0")

    def window(a: float, b: float) -> str:
        w = [p for p in polls if a <= float(p[0]) < b]
        hits = sum(1 for p in w if p[2] == "cache")
        app = sum(1 for p in w if p[2] == "app")
        return f"{len(w)} polls, {hits} cache, {app} app"

    after_hits = sum(1 for p in polls if float(p[0]) >= promoted and p[2] == "cache")
    pubs: list[list[float | int | str]] = data["publishes"]
    pub_bad = [p for p in pubs if p[4] != 201]
    pending_after = [p for p in pubs if float(p[2]) >= kill and p[5] != "ok"]
    last_pending = max((float(p[3]) for p in pending_after), default=kill)
    # A poll answer carries the user's newest message only: a publish is delivered by the first
    # answer to its held poll that carries it or a later publish of the same user.
    user_of = {int(p[0]): int(p[1]) for p in pubs}
    wakes_of: dict[int, list[tuple[float, int]]] = {}
    for s, t, _ in data["wakes"]:
        wakes_of.setdefault(user_of.get(int(s), -1), []).append((float(t), int(s)))
    for w in wakes_of.values():
        w.sort()

    def delivered(seq: int) -> float | None:
        for t, s in wakes_of.get(user_of[seq], []):
            if s >= seq:
                return t
        return None

    def lat(a: float, b: float) -> tuple[list[float], int]:
        got, missing = [], 0
        for p in pubs:
            if a <= float(p[3]) < b and p[4] == 201:
                w = delivered(int(p[0]))
                if w is None:
                    missing += 1
                else:
                    got.append(max(0.0, w - float(p[3])) * 1000)
        return got, missing

    def lat_text(a: float, b: float) -> str:
        got, missing = lat(a, b)
        if not got:
            return f"none woken ({missing} publishes)"
        return (
            f"{len(got)} woken (median {statistics.median(got):.0f} ms, "
            f"p95 {pct(got, 0.95):.0f} ms, max {max(got):.0f} ms), {missing} not"
        )

    end = max(float(p[0]) for p in polls) if polls else replica
    subscribed = ev.get("subscribed", promoted)
    first = (
        f"failover {promoted - kill:.1f} s after the kill, every poll server subscribed again by "
        f"{subscribed - kill:.1f} s; {len(polls)} polls, {non2xx} non-2xx "
        f"({bad} 5xx or failed); {len(pubs)} publishes, {len(pub_bad)} not 201, cache writes ok "
        f"again {last_pending - kill:.1f} s after the kill; held polls woken after the failover: "
        f"{lat_text(promoted, end + 1)}"
    )
    print(first)
    print(f"poll statuses: {statuses}")
    print(f"before the kill: {window(0, kill)}")
    print(f"master down, before the promotion ({promoted - kill:.1f} s): {window(kill, promoted)}")
    print(f"after the promotion, old master down: {window(promoted, restarted)}")
    print(
        f"old master back as a replica ({replica - restarted:.1f} s after its start): "
        f"{window(replica, end + 1)}"
    )
    print(
        f"publishes not answered ok by the cache after the kill: {len(pending_after)}; "
        f"not 201: {[(p[4], p[5]) for p in pub_bad][:10]}"
    )
    print(f"held-poll wake latency from the publish's answer: before the kill: {lat_text(0, kill)}")
    print(f"  master down: {lat_text(kill, promoted)}")
    print(f"  after the promotion, old master down: {lat_text(promoted, restarted)}")
    print(f"  old master back as a replica: {lat_text(replica, end + 1)}")
    print(f"held-poll errors: {len(data['held_errors'])} {data['held_errors'][:5]}")
    if bad > len(polls) / 100:
        failures.append(f"{bad} polls answered 5xx or failed")
    if pub_bad:
        failures.append(f"{len(pub_bad)} publishes not answered 201")
    if after_hits == 0:
        failures.append("no cache hit after the failover (the poll servers did not follow)")
    got, missing = lat(promoted + 3, end - 6)
    if missing or not got or max(got) > 5000 or statistics.median(got) > 1000:
        failures.append(
            f"held polls after the failover: {missing} publishes never woke theirs, "
            f"median {statistics.median(got) if got else 0:.0f} ms, "
            f"max {max(got, default=0):.0f} ms"
        )
    for why in failures:
        print(f"FAIL: {why}")
    return 1 if failures else 0


def main() -> int:
    ap = arguments(max_seconds=150)
    args = ap.parse_args()
    if args.check:
        return check(args.check, args.events)
    Load(args).run(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
