"""A webhook receiver for Alertmanager's notifications, recording each one: what a paging drill
reads to count pages (tests/fleet/monitoring.sh; docs/operations.md, "Alerting").

    python -m fastpoll_testkit.webhook free-port ADDR
        a TCP port free on ADDR now, below the kernel's ephemeral range (an outgoing connection
        cannot take it before the receiver binds it)
    python -m fastpoll_testkit.webhook serve --listen ADDR:PORT --out FILE [--pid-file FILE]
                                             [--while-pid PID] [--max-seconds N]
        answers every POST 200 and appends it to FILE as one JSON line (Notification); the
        pid file is written once the port is bound. It stops on SIGTERM or SIGINT, when PID is
        gone, or after N seconds, whichever comes first
    python -m fastpoll_testkit.webhook show FILE [--path /page] [--status firing] [--since T]
        one line per recorded notification: time, path, status, number of alerts, their
        alertnames and the group's labels (`--alerts`: one line per alert instead)

Alertmanager posts its webhook payload (version 4): receiver, status, groupLabels, groupKey and
the alerts, each with its status, labels, annotations, startsAt and endsAt. Standard library only.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from fastpoll_testkit.procs import free_port


@dataclass
class Alert:
    alertname: str
    severity: str
    status: str
    labels: dict[str, str]
    starts_at: str
    ends_at: str


@dataclass
class Notification:
    """One POST: when it arrived (seconds since the epoch), on which path, and what it said."""

    time: float
    path: str
    receiver: str
    status: str
    group_key: str
    group_labels: dict[str, str]
    alerts: list[Alert] = field(default_factory=list)

    @classmethod
    def from_payload(cls, when: float, path: str, payload: dict[str, Any]) -> Notification:
        alerts = [
            Alert(
                alertname=str(a.get("labels", {}).get("alertname", "")),
                severity=str(a.get("labels", {}).get("severity", "")),
                status=str(a.get("status", "")),
                labels={str(k): str(v) for k, v in a.get("labels", {}).items()},
                starts_at=str(a.get("startsAt", "")),
                ends_at=str(a.get("endsAt", "")),
            )
            for a in payload.get("alerts", [])
        ]
        return cls(
            time=when,
            path=path,
            receiver=str(payload.get("receiver", "")),
            status=str(payload.get("status", "")),
            group_key=str(payload.get("groupKey", "")),
            group_labels={str(k): str(v) for k, v in payload.get("groupLabels", {}).items()},
            alerts=alerts,
        )

    @classmethod
    def from_json(cls, line: str) -> Notification:
        d = json.loads(line)
        d["alerts"] = [Alert(**a) for a in d["alerts"]]
        return cls(**d)


def read(path: Path) -> Iterator[Notification]:
    """The notifications recorded in `path` so far (a line still being written is skipped)."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return
    for line in text.splitlines():
        try:
            yield Notification.from_json(line)
        except (ValueError, TypeError, KeyError):
            continue


# ---- serve ----------------------------------------------------------------------------------


class Recorder:
    """Appends each notification to a file, one JSON line, flushed before the 200 goes out."""

    def __init__(self, out: Path) -> None:
        self.lock = threading.Lock()
        self.out = out.open("a", encoding="utf-8")

    def record(self, n: Notification) -> None:
        with self.lock:
            self.out.write(json.dumps(asdict(n), sort_keys=True) + "\n")
            self.out.flush()

    def close(self) -> None:
        with self.lock:
            self.out.close()


def make_server(listen: tuple[str, int], recorder: Recorder) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server's name)
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            try:
                payload = json.loads(body)
                if not isinstance(payload, dict):
                    raise ValueError("not an object")
            except ValueError:
                self.send_error(400, "not a JSON object")
                return
            recorder.record(Notification.from_payload(time.time(), self.path, payload))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def do_GET(self) -> None:  # noqa: N802
            # Reachability checks (from the monitoring host): not recorded.
            self.send_response(200 if self.path == "/-/healthy" else 404)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            sys.stderr.write(f"{time.time():.3f} {self.address_string()} {format % args}\n")

    return ThreadingHTTPServer(listen, Handler)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def serve(
    listen: tuple[str, int],
    out: Path,
    pid_file: Path | None,
    while_pid: int | None,
    max_seconds: float,
) -> None:
    recorder = Recorder(out)
    server = make_server(listen, recorder)
    done = threading.Event()

    def stop(*_: object) -> None:
        done.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    if pid_file is not None:
        tmp = pid_file.with_suffix(".tmp")
        tmp.write_text(f"{os.getpid()}\n")
        tmp.replace(pid_file)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2})
    thread.start()
    deadline = time.monotonic() + max_seconds
    while not done.wait(0.5):
        if time.monotonic() > deadline:
            sys.stderr.write(f"stopping: {max_seconds:.0f} s are over\n")
            break
        if while_pid is not None and not pid_alive(while_pid):
            sys.stderr.write(f"stopping: pid {while_pid} is gone\n")
            break
    server.shutdown()
    thread.join(10)
    server.server_close()
    recorder.close()
    if pid_file is not None:
        pid_file.unlink(missing_ok=True)


# ---- show -----------------------------------------------------------------------------------


def show(
    notifications: Iterator[Notification],
    path: str | None,
    status: str | None,
    since: float,
    per_alert: bool,
) -> list[str]:
    lines = []
    for n in notifications:
        if (path and n.path != path) or (status and n.status != status) or n.time < since:
            continue
        group = ",".join(f"{k}={v}" for k, v in sorted(n.group_labels.items())) or "-"
        if per_alert:
            for a in n.alerts:
                labels = ",".join(f"{k}={v}" for k, v in sorted(a.labels.items()))
                lines.append(f"{n.time:.3f} {n.path} {n.status} {a.status} {a.alertname} {labels}")
        else:
            names = ",".join(sorted({a.alertname for a in n.alerts})) or "-"
            lines.append(f"{n.time:.3f} {n.path} {n.status} {len(n.alerts)} {names} {group}")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m fastpoll_testkit.webhook",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("free-port")
    p.add_argument("addr")
    p = sub.add_parser("serve")
    p.add_argument("--listen", required=True, help="ADDR:PORT")
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--pid-file", type=Path)
    p.add_argument("--while-pid", type=int)
    p.add_argument("--max-seconds", type=float, default=3600.0)
    p = sub.add_parser("show")
    p.add_argument("file", type=Path)
    p.add_argument("--path")
    p.add_argument("--status")
    p.add_argument("--since", type=float, default=0.0)
    p.add_argument("--alerts", action="store_true")
    args = ap.parse_args(argv)

    if args.cmd == "free-port":
        print(free_port(args.addr))  # fastpoll_testkit.procs's
    elif args.cmd == "serve":
        host, _, port = args.listen.rpartition(":")
        serve((host, int(port)), args.out, args.pid_file, args.while_pid, args.max_seconds)
    else:
        for line in show(read(args.file), args.path, args.status, args.since, args.alerts):
            print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
