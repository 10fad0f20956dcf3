"""What the fleet test's failover drills share (tests/fleet/*_load.py).

A drill's load generator runs against the fleet's pollers and app hosts from the control node
until the shell script that kills something writes `stop` to its events file (or a deadline
passes); the script writes the other events too ("kill T", "promoted T", ...: wall-clock
seconds), and the checker splits the load's record at them.
"""

from __future__ import annotations

import argparse
import http.client
import json
import threading
import time


def arguments(max_seconds: float) -> argparse.ArgumentParser:
    """The options every drill's load generator and checker take."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--pollers", default="", help="poller addresses, comma-separated")
    ap.add_argument("--apps", default="", help="app host:port pairs, comma-separated")
    ap.add_argument("--token-file", default="", help="the write API's bearer token")
    ap.add_argument("--users", default="", help="user ids, comma-separated")
    ap.add_argument("--paths", default="", help="signed poll paths, |-separated")
    ap.add_argument("--events", required=True, help="the events file the drill's script writes")
    ap.add_argument("--out", default="", help="where the load writes its record (JSON)")
    ap.add_argument("--max-seconds", type=float, default=max_seconds)
    ap.add_argument("--check", default="", help="judge this record instead of making load")
    return ap


def read_events(path: str) -> dict[str, float]:
    """The events file: the first time of each name."""
    events: dict[str, float] = {}
    with open(path) as f:
        for line in f:
            name, _, t = line.strip().partition(" ")
            if t:
                events.setdefault(name, float(t))
    return events


class DrillLoad:
    """The parsed options, a lock for the record, and the stop that the events file gives."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.pollers: list[str] = args.pollers.split(",")
        self.apps: list[str] = args.apps.split(",")
        with open(args.token_file) as f:
            self.token = f.read().strip()
        self.users = [int(u) for u in args.users.split(",")]
        self.paths: list[str] = args.paths.split("|")
        self.events: str = args.events
        self.deadline = time.time() + args.max_seconds
        self.lock = threading.Lock()
        self.stop = threading.Event()

    def stopped(self) -> bool:
        return self.stop.is_set()

    def watch(self) -> None:
        """Sets the stop at the events file's `stop` line or at the deadline."""
        while time.time() < self.deadline and not self.stop.is_set():
            try:
                with open(self.events) as f:
                    if any(line.startswith("stop ") for line in f):
                        break
            except OSError:
                pass
            time.sleep(0.2)
        self.stop.set()

    def get(
        self, host: str, path: str, headers: dict[str, str] | None = None, timeout: float = 10.0
    ) -> tuple[int, str, str, bytes]:
        """GET PATH from HOST (host[:port], port 80 if none) on a new connection: the status, the
        ETag, X-Poll-Source ("-" if absent) and the body. Raises OSError if the connection fails."""
        c = http.client.HTTPConnection(host, timeout=timeout)
        try:
            c.request("GET", path, headers=headers or {})
            r = c.getresponse()
            body = r.read()
            return r.status, r.getheader("ETag") or "", r.getheader("X-Poll-Source") or "-", body
        finally:
            c.close()

    def publish(
        self, app: str, user: int, text: str, idempotency_key: str | None = None
    ) -> tuple[int, http.client.HTTPResponse | None]:
        """POST /api/messages to APP (host:port) with the write API's token: the status and the
        answer (its body read), or 0 and None when the connection failed."""
        headers = {"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"}
        if idempotency_key:
            headers["Idempotency-Key"] = idempotency_key
        c = http.client.HTTPConnection(app, timeout=10)
        try:
            c.request(
                "POST",
                "/api/messages",
                body=json.dumps({"user_id": user, "text": text}),
                headers=headers,
            )
            r = c.getresponse()
            r.read()
            return r.status, r
        except (OSError, http.client.HTTPException):
            return 0, None
        finally:
            c.close()
