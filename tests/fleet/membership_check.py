"""The fleet test's consistency checker for a memcached membership change (tests/fleet/run.sh).

    membership_check.py SIGNING_KEY API_TOKEN APPS POLLERS FIRST_USER USERS STOP_FILE OUT_JSON \
        [STEP_FILE]
    membership_check.py --annotate OUT_JSON POLLER=ACCESS_LOG...

Publishes through the app hosts' private write API (APPS: comma-separated addresses, port 8000
unless given as ADDR:PORT) and polls every user through the pollers' nginx (POLLERS: addresses,
port 80 unless given) until STOP_FILE
exists (at most 900 s). Each user is published once first, so its answer is cached on the old
placement before the change starts (then OUT_JSON.ready is written); later publishes go to the
first tenth of the users only, so the others stay on that first answer: when a poller moves to the
new list, their moved keys miss once (the hit-ratio dip). A poll sent after a publish returned
must show that message or a newer one as the newest (the model: loadtests/drills.py,
StaleChecker); an older one is counted as stale. Writes the counts and the hit ratio per 2 s
(X-Poll-Source: cache) to OUT_JSON.
Traffic goes only to the addresses given, which run.sh has checked route through its bridge.

Evidence: every violation (a stale answer, a failed poll) is printed to stderr when seen and kept
in OUT_JSON's "violations": the user, the poller, the poll's send and receive times, its status,
X-Poll-Source and ETag, the newest id expected and the one served, the rollout step running at
send and at receipt (STEP_FILE, written by the fleet test's membership scenario), the publish that
set the expectation (app host, start and return, every attempt with its error) and any publish to
that user still in flight. Publishes carry an Idempotency-Key, so a retried one (the app host
restarting) stores one message, whichever attempt committed it. nginx names the instance that
answered only in its access log (ua=, the upstream address); `--annotate` adds each violation's
access-log lines (the user's requests within a second of it, on the poller that answered) to
OUT_JSON.
"""

import json
import random
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from fastpoll_app.keys import derive_key
from fastpoll_app.signing import load_secrets, signed_query

MAX_S = 900.0
BUCKET_S = 2
KEEP = 50  # violations and publish retries kept in OUT_JSON (all are counted)


def stamp(t: float) -> str:
    """Wall-clock time, UTC, to the millisecond (the hosts' logs use the same clock)."""
    return datetime.fromtimestamp(t, UTC).isoformat(timespec="milliseconds")


class Step:
    """The rollout step the membership scenario is in (STEP_FILE's first line; "-" without one)."""

    def __init__(self, path: str | None) -> None:
        self._path = Path(path) if path else None

    def now(self) -> str:
        if self._path is None:
            return "-"
        try:
            return self._path.read_text().strip() or "-"
        except OSError:
            return "-"


def main() -> int:
    key_file, token_file, apps_s, pollers_s, first_s, count_s, stop_s, out_s = sys.argv[1:9]
    step = Step(sys.argv[9] if len(sys.argv) > 9 else None)
    secret = load_secrets(key_file)[0]
    token = Path(token_file).read_text().strip()
    apps, pollers = apps_s.split(","), pollers_s.split(",")
    users = list(range(int(first_s), int(first_s) + int(count_s)))
    stop_file, out = Path(stop_s), Path(out_s)
    exp = int(time.time()) + 3600
    run_tag = f"{int(time.time())}-{random.randrange(1 << 30)}"
    urls = {}
    for u in users:
        target = b"/Poll/getMessages?user_id=%d" % u
        q = signed_query(secret, derive_key(b"/Poll", target[len(b"/Poll") :], [b"user_id"]), exp)
        urls[u] = (target + b"&" + q).decode()
    published: dict[int, int] = {}
    # The publish that set published[u], and the one under way per user (the evidence).
    last_pub: dict[int, dict[str, Any]] = {}
    in_flight: dict[int, dict[str, Any]] = {}
    lock = threading.Lock()
    counts: Counter[str] = Counter()
    buckets: dict[int, Counter[str]] = {}
    violations: list[dict[str, Any]] = []
    retries: list[dict[str, Any]] = []
    done = threading.Event()
    t0 = time.time()

    def rel(t: float) -> float:
        return round(t - t0, 3)

    def publish(u: int, i: int) -> bool:
        body = json.dumps({"user_id": u, "text": f"membership {i}"}).encode()
        rec: dict[str, Any] = {
            "user": u,
            "start": stamp(time.time()),
            "start_s": rel(time.time()),
            "step": step.now(),
            "attempts": [],
        }
        with lock:
            in_flight[u] = rec
        # The app hosts restart one at a time during the rollout: try the other one. The same
        # Idempotency-Key on every attempt: one message, whichever attempt committed it.
        for n in range(len(apps)):
            addr = apps[(i + n) % len(apps)]
            req = urllib.request.Request(
                f"http://{addr if ':' in addr else addr + ':8000'}/api/messages",
                data=body,
                method="POST",
                headers={
                    "Authorization": f"Bearer {token}",
                    "Content-Type": "application/json",
                    "Idempotency-Key": f"membership-{run_tag}-{i}",
                },
            )
            ts = time.time()
            try:
                with urllib.request.urlopen(req, timeout=10) as r:
                    status = r.status
                    # ok, or pending (the outbox repairs the cache); replayed: an earlier
                    # attempt stored it.
                    cache = r.headers.get("X-Cache-Publish") or (
                        "replayed" if r.headers.get("Idempotent-Replayed") else "-"
                    )
                    mid = int(json.load(r)["id"])
            except (OSError, urllib.error.URLError, ValueError, KeyError) as e:
                te = time.time()
                att = {
                    "app": addr,
                    "sent_s": rel(ts),
                    "end_s": rel(te),
                    "error": repr(e)[:200],
                }
                rec["attempts"].append(att)
                counts["publish_retry"] += 1
                with lock:
                    if len(retries) < KEEP:
                        retries.append({"user": u, "step": step.now(), **att})
                continue
            te = time.time()
            rec["attempts"].append(
                {"app": addr, "sent_s": rel(ts), "end_s": rel(te), "status": status}
            )
            rec.update(
                id=mid,
                app=addr,
                end=stamp(te),
                end_s=rel(te),
                end_step=step.now(),
                cache=cache,
            )
            with lock:
                if mid >= published.get(u, 0):
                    published[u] = mid
                    last_pub[u] = rec
                in_flight.pop(u, None)
            counts["publishes"] += 1
            counts[f"publish_cache_{cache}"] += 1
            return True
        with lock:
            in_flight.pop(u, None)
        counts["publish_failed"] += 1
        print(
            f"membership_check: publish failed everywhere: {json.dumps(rec)}",
            file=sys.stderr,
        )
        return False

    def violation(kind: str, ev: dict[str, Any], u: int) -> None:
        with lock:
            ev["publish"] = last_pub.get(u)
            ev["publish_in_flight"] = in_flight.get(u)
            if len(violations) < KEEP:
                violations.append(ev)
        print(f"membership_check: {kind}: {json.dumps(ev)}", file=sys.stderr, flush=True)

    def publisher() -> None:
        rng, i = random.Random(7), 0
        while not done.wait(0.2):
            i += 1
            publish(rng.choice(hot), len(users) + i)

    for i, u in enumerate(users):
        if not publish(u, i):
            print(f"membership_check: cannot publish to user {u}", file=sys.stderr)
            return 2
    hot = users[: max(len(users) // 10, 1)]
    Path(f"{out}.ready").touch()
    pub = threading.Thread(target=publisher, daemon=True)
    pub.start()
    i = 0
    while not stop_file.exists() and time.time() - t0 < MAX_S:
        u = users[i % len(users)]
        # Each user through each poller in turn (len(users) is even, so i alone would not do).
        addr = pollers[(i + i // len(users)) % len(pollers)]
        i += 1
        with lock:
            want = published.get(u, 0)
        step_sent = step.now()
        ts = time.time()
        b = buckets.setdefault(int(ts - t0) // BUCKET_S, Counter())
        ev: dict[str, Any] = {
            "user": u,
            "poller": addr,
            "sent": stamp(ts),
            "sent_s": rel(ts),
            "step_sent": step_sent,
            "want": want,
        }
        try:
            with urllib.request.urlopen(f"http://{addr}{urls[u]}", timeout=10) as r:
                source = r.headers.get("X-Poll-Source", "-")
                etag = r.headers.get("ETag", "-")
                status = r.status
                got = int(json.load(r).get("newest", {}).get("id", 0))
        except (OSError, urllib.error.URLError, ValueError) as e:
            te = time.time()
            counts["failed"] += 1
            ev.update(received=stamp(te), received_s=rel(te), step_received=step.now())
            ev["error"] = repr(e)[:200]
            violation("failed poll", ev, u)
            continue
        te = time.time()
        counts["polls"] += 1
        counts[f"source_{source}"] += 1
        b[source] += 1
        if got < want:
            counts["stale"] += 1
            ev.update(
                received=stamp(te),
                received_s=rel(te),
                step_received=step.now(),
                status=status,
                got=got,
                source=source,
                etag=etag,
            )
            violation("stale answer", ev, u)
        time.sleep(0.005)
    done.set()
    pub.join(15)
    ratios = [c["cache"] / sum(c.values()) for _, c in sorted(buckets.items()) if sum(c.values())]
    result = {
        "seconds": round(time.time() - t0, 1),
        "started": stamp(t0),
        "counts": dict(sorted(counts.items())),
        "stale_at_s": [v["sent_s"] for v in violations if "got" in v][:20],
        "hit_ratio": round(counts["source_cache"] / max(counts["polls"], 1), 4),
        "hit_ratio_min_per_2s": round(min(ratios), 4) if ratios else None,
        "buckets_under_95pct": sum(1 for r in ratios if r < 0.95),
        "violations": violations,
        "publish_retries": retries,
    }
    out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


def annotate(out_s: str, logs: list[str]) -> int:
    """Add to each violation the access-log lines of its poller for its user, within a second
    of the poll (nginx's $time_iso8601 has whole seconds): ua= names the instance (its unix
    socket) or the app that answered, us= the upstream statuses."""
    out = Path(out_s)
    result = json.loads(out.read_text())
    by_poller: dict[str, list[str]] = {}
    for spec in logs:
        poller, _, path = spec.partition("=")
        try:
            by_poller[poller] = Path(path).read_text(errors="replace").splitlines()
        except OSError as e:
            print(f"membership_check: no access log for {poller}: {e}", file=sys.stderr)
    for v in result.get("violations", []):
        lines = by_poller.get(v["poller"], [])
        lo = datetime.fromisoformat(v["sent"]).timestamp() - 1
        hi = datetime.fromisoformat(v.get("received", v["sent"])).timestamp() + 1
        needle = f"user_id={v['user']}&"
        hits = []
        for line in lines:
            if needle not in line:
                continue
            try:
                t = datetime.fromisoformat(line.split(" ", 1)[0]).timestamp()
            except ValueError:
                continue
            if lo <= t <= hi:
                hits.append(line)
        v["access_log"] = hits
        print(
            f"membership_check: {v['poller']} access log for user {v['user']}:",
            file=sys.stderr,
        )
        for line in hits:
            print(f"  {line}", file=sys.stderr)
    out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--annotate":
        sys.exit(annotate(sys.argv[2], sys.argv[3:]))
    sys.exit(main())
