#!/usr/bin/python3
"""fastpoll-memcached-stats: memcached's `stats` for node_exporter's textfile collector.

    fastpoll-memcached-stats --server 10.0.0.21:11211 [--server ...] --out DIR/fastpoll_memcached.prom

Debian 12 packages no memcached exporter, so a systemd timer (role exporters,
fastpoll-memcached-stats.timer) runs this every few seconds on each memcached host; node_exporter,
already there, serves the file. The metric names are those of the Prometheus project's
memcached_exporter (a subset), so dashboards keep working if one is installed later.

The file is replaced atomically (written beside it, then renamed): node_exporter never reads half
of one. A server that does not answer within --timeout gets memcached_up 0 and nothing else.
Standard library only: it runs with the host's python3.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import tempfile
import time

# memcached `stats` field -> (metric, type, help, extra labels)
_FIELDS: dict[str, tuple[str, str, str, str]] = {
    "uptime": (
        "memcached_uptime_seconds",
        "gauge",
        "Seconds since the server started.",
        "",
    ),
    "curr_connections": (
        "memcached_current_connections",
        "gauge",
        "Open client connections.",
        "",
    ),
    "total_connections": (
        "memcached_connections_total",
        "counter",
        "Connections accepted.",
        "",
    ),
    "rejected_connections": (
        "memcached_connections_rejected_total",
        "counter",
        "Connections rejected at maxconns.",
        "",
    ),
    "curr_items": ("memcached_current_items", "gauge", "Items stored.", ""),
    "bytes": ("memcached_current_bytes", "gauge", "Bytes used by items.", ""),
    "limit_maxbytes": ("memcached_limit_bytes", "gauge", "Memory limit (-m).", ""),
    "evictions": (
        "memcached_items_evicted_total",
        "counter",
        "Items evicted to make room before their TTL (memory too small).",
        "",
    ),
    "expired_unfetched": (
        "memcached_items_expired_unfetched_total",
        "counter",
        "Items that expired without ever being read.",
        "",
    ),
    "get_hits": (
        "memcached_commands_total",
        "counter",
        "Commands by result.",
        'command="get",status="hit"',
    ),
    "get_misses": (
        "memcached_commands_total",
        "counter",
        "",
        'command="get",status="miss"',
    ),
    "cmd_set": (
        "memcached_commands_total",
        "counter",
        "",
        'command="set",status="hit"',
    ),
    "bytes_read": (
        "memcached_read_bytes_total",
        "counter",
        "Bytes read from clients.",
        "",
    ),
    "bytes_written": (
        "memcached_written_bytes_total",
        "counter",
        "Bytes sent to clients.",
        "",
    ),
}


class StatsError(Exception):
    pass


def read_stats(server: str, timeout: float) -> dict[str, str]:
    """`stats` of one memcached ("host:port"), as name -> value."""
    host, sep, port = server.rpartition(":")
    if not sep or not port.isdigit():
        raise StatsError(f"{server}: want host:port")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout) as s:
            s.settimeout(timeout)
            s.sendall(b"stats\r\n")
            buf = b""
            deadline = time.monotonic() + timeout
            while not buf.endswith(b"END\r\n"):
                if time.monotonic() > deadline or len(buf) > 65536:
                    raise StatsError(f"{server}: no complete answer")
                chunk = s.recv(4096)
                if not chunk:
                    raise StatsError(f"{server}: closed the connection")
                buf += chunk
    except OSError as e:
        raise StatsError(f"{server}: {e}") from None
    stats: dict[str, str] = {}
    for line in buf.decode("ascii", "replace").splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] == "STAT":
            stats[parts[1]] = parts[2]
    return stats


def render(results: dict[str, dict[str, str] | None]) -> str:
    """Prometheus text for every server (None: it did not answer)."""
    series: dict[str, list[str]] = {"memcached_up": []}
    meta: dict[str, tuple[str, str]] = {
        "memcached_up": ("gauge", "1 if memcached answered `stats`.")
    }
    for server, stats in results.items():
        label = 'server="' + server.replace("\\", "\\\\").replace('"', '\\"') + '"'
        series["memcached_up"].append(
            f"memcached_up{{{label}}} {0 if stats is None else 1}"
        )
        if stats is None:
            continue
        for field, (name, kind, help_, extra) in _FIELDS.items():
            value = stats.get(field)
            if value is None:
                continue
            try:
                number = float(value)
            except ValueError:
                continue
            if name not in meta or help_:
                meta.setdefault(name, (kind, help_))
            labels = label + ("," + extra if extra else "")
            shown = str(int(number)) if number.is_integer() else repr(number)
            series.setdefault(name, []).append(f"{name}{{{labels}}} {shown}")
    out = []
    for name, lines in series.items():
        kind, help_ = meta[name]
        out.append(f"# HELP {name} {help_}\n# TYPE {name} {kind}\n")
        out.extend(line + "\n" for line in lines)
    return "".join(out)


def write_atomically(path: str, text: str) -> None:
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".fastpoll_memcached.", dir=directory)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.splitlines()[0] if __doc__ else None
    )
    ap.add_argument(
        "--server", action="append", required=True, help="host:port (repeatable)"
    )
    ap.add_argument(
        "--out", required=True, help="the .prom file to write ('-': stdout)"
    )
    ap.add_argument(
        "--timeout", type=float, default=2.0, help="seconds per server (default 2)"
    )
    args = ap.parse_args(argv)
    results: dict[str, dict[str, str] | None] = {}
    for server in args.server:
        try:
            results[server] = read_stats(server, args.timeout)
        except StatsError as e:
            print(f"fastpoll-memcached-stats: {e}", file=sys.stderr)
            results[server] = None
    text = render(results)
    if args.out == "-":
        sys.stdout.write(text)
    else:
        write_atomically(args.out, text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
