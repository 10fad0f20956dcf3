"""The fleet test's consistency checker for a memcached membership change (tests/fleet/run.sh).

    membership_check.py SIGNING_KEY API_TOKEN APPS POLLERS FIRST_USER USERS STOP_FILE OUT_JSON

Publishes through the app hosts' private write API (APPS: comma-separated addresses, port 8000)
and polls every user through the pollers' nginx (POLLERS: addresses, port 80) until STOP_FILE
exists (at most 900 s). Each user is published once first, so its answer is cached on the old
placement before the change starts (then OUT_JSON.ready is written); later publishes go to the
first tenth of the users only, so the others stay on that first answer: when a poller moves to the
new list, their moved keys miss once (the hit-ratio dip). A poll sent after a publish returned must show that message
or a newer one as the newest (the model: loadtests/drills.py, StaleChecker); an older one is
counted as stale. Writes the counts and the hit ratio per 2 s (X-Poll-Source: cache) to OUT_JSON.
Traffic goes only to the addresses given, which run.sh has checked route through its bridge.
"""

import json
import random
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path

from fastpoll_app.keys import derive_key
from fastpoll_app.signing import load_secrets, signed_query

MAX_S = 900.0
BUCKET_S = 2


def main() -> int:
    key_file, token_file, apps_s, pollers_s, first_s, count_s, stop_s, out_s = sys.argv[
        1:9
    ]
    secret = load_secrets(key_file)[0]
    token = Path(token_file).read_text().strip()
    apps, pollers = apps_s.split(","), pollers_s.split(",")
    users = list(range(int(first_s), int(first_s) + int(count_s)))
    stop_file, out = Path(stop_s), Path(out_s)
    exp = int(time.time()) + 3600
    urls = {}
    for u in users:
        target = b"/Poll/getMessages?user_id=%d" % u
        q = signed_query(
            secret, derive_key(b"/Poll", target[len(b"/Poll") :], [b"user_id"]), exp
        )
        urls[u] = (target + b"&" + q).decode()
    published: dict[int, int] = {}
    lock = threading.Lock()
    counts: Counter[str] = Counter()
    buckets: dict[int, Counter[str]] = {}
    stale_at: list[float] = []
    done = threading.Event()
    t0 = time.time()

    def publish(u: int, i: int) -> bool:
        body = json.dumps({"user_id": u, "text": f"membership {i}"}).encode()
        # The app hosts restart one at a time during the rollout: try the other one.
        for n in range(len(apps)):
            addr = apps[(i + n) % len(apps)]
            req = urllib.request.Request(
                f"http://{addr}:8000/api/messages",
                data=body,
                method="POST",
                headers={
                    "Authorization": f"Bearer {token}",
                    "Content-Type": "application/json",
                },
            )
            try:
                with urllib.request.urlopen(req, timeout=10) as r:
                    mid = int(json.load(r)["id"])
            except (OSError, urllib.error.URLError, ValueError, KeyError):
                counts["publish_retry"] += 1
                continue
            with lock:
                published[u] = max(published.get(u, 0), mid)
            counts["publishes"] += 1
            return True
        counts["publish_failed"] += 1
        return False

    def publisher() -> None:
        rng, i = random.Random(7), 0
        while not done.wait(0.2):
            i += 1
            publish(rng.choice(hot), i)

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
        b = buckets.setdefault(int(time.time() - t0) // BUCKET_S, Counter())
        try:
            with urllib.request.urlopen(f"http://{addr}{urls[u]}", timeout=10) as r:
                source = r.headers.get("X-Poll-Source", "-")
                got = int(json.load(r).get("newest", {}).get("id", 0))
        except (OSError, urllib.error.URLError, ValueError) as e:
            counts["failed"] += 1
            print(
                f"membership_check: poll of {u} via {addr} failed: {e}", file=sys.stderr
            )
            continue
        counts["polls"] += 1
        counts[f"source_{source}"] += 1
        b[source] += 1
        if got < want:
            counts["stale"] += 1
            stale_at.append(round(time.time() - t0, 2))
        time.sleep(0.005)
    done.set()
    pub.join(15)
    ratios = [
        c["cache"] / sum(c.values())
        for _, c in sorted(buckets.items())
        if sum(c.values())
    ]
    result = {
        "seconds": round(time.time() - t0, 1),
        "counts": dict(sorted(counts.items())),
        "stale_at_s": stale_at[:20],
        "hit_ratio": round(counts["source_cache"] / max(counts["polls"], 1), 4),
        "hit_ratio_min_per_2s": round(min(ratios), 4) if ratios else None,
        "buckets_under_95pct": sum(1 for r in ratios if r < 0.95),
    }
    out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
