"""The Nchan peer of loadtests/longpoll.py: nginx with Debian's libnginx-mod-nchan on a free
loopback port, stopped by the pid we started (never by name).

Locations: `/pub/<channel>` (publisher), `/lp/<channel>` (long-poll subscriber), `/ip/<channel>`
(interval-poll subscriber), `/nchan_status` (nchan_stub_status: the subscriber count).

Its configuration, chosen for this 2-core machine and the run, the same nginx tuning as the
fastpoll stack's nginx (nginx/nginx-local.conf.j2, which held 15,000 keep-alive clients with 0
errors in the edge drill): 2 workers (one per core), `worker_rlimit_nofile 20000` (the process
cap here) and `worker_connections 19500` (Nchan needs no upstream connections: one per client),
`multi_accept on` (a burst of clients is not left in the accept queue), keep-alive with 100,000
requests per connection. Nchan's own: `nchan_shared_memory_size 128m` (15,000 channels with a few
small messages each need a few MB; its default of 128M is kept, sized well above), a message
buffer of 10 per channel (the default: a client that misses a poll can still catch up) kept for
10 minutes, and `nchan_subscriber_timeout 25s`, the client's `wait=25` in fastpoll.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from loadtests.peers import (  # free_port: fastpoll_testkit.stack's (the one stack harness)
    Peer,
    free_port,
)

MODULE = Path("/usr/lib/nginx/modules/ngx_nchan_module.so")  # Debian's libnginx-mod-nchan

CONF = """\
load_module {module};
{user}
worker_processes 2;
worker_rlimit_nofile 20000;
pid {run_dir}/nginx.pid;
error_log {run_dir}/error.log warn;

events {{
    worker_connections 19500;
    multi_accept on;
}}

http {{
    access_log off;
    tcp_nodelay on;
    keepalive_timeout 65;
    keepalive_requests 100000;
    client_body_temp_path {run_dir}/tmp/body;
    proxy_temp_path {run_dir}/tmp/proxy;
    fastcgi_temp_path {run_dir}/tmp/fastcgi;
    uwsgi_temp_path {run_dir}/tmp/uwsgi;
    scgi_temp_path {run_dir}/tmp/scgi;

    nchan_shared_memory_size 128m;
    nchan_message_buffer_length 10;
    nchan_message_timeout 10m;

    server {{
        listen 127.0.0.1:{port} backlog=4096;

        location = /healthz {{ return 200 "ok\\n"; }}
        location = /nchan_status {{ nchan_stub_status; }}
        location ~ ^/pub/([A-Za-z0-9_-]+)$ {{
            nchan_publisher;
            nchan_channel_id $1;
        }}
        location ~ ^/lp/([A-Za-z0-9_-]+)$ {{
            nchan_subscriber longpoll;
            nchan_channel_id $1;
            nchan_subscriber_timeout 25s;
        }}
        location ~ ^/ip/([A-Za-z0-9_-]+)$ {{
            nchan_subscriber intervalpoll;
            nchan_channel_id $1;
        }}
    }}
}}
"""


class NchanPeer(Peer):
    """peers.Peer's start (nginx -t, then nginx in the foreground until /healthz answers) and
    stop (by our pid), with this configuration instead of a template of loadtests/peers/."""

    @classmethod
    def at(cls, run_dir: Path) -> NchanPeer:
        run_dir.mkdir(parents=True, exist_ok=True)
        return cls(name="nchan", run_dir=run_dir, tuning={})  # the tuning is fixed in CONF

    def render(self) -> Path:
        if not MODULE.exists():
            raise RuntimeError(f"{MODULE} is missing: apt-get install libnginx-mod-nchan")
        self.port = self.port or free_port()
        user = ""
        for sub in ("body", "proxy", "fastcgi", "uwsgi", "scgi"):
            (self.run_dir / "tmp" / sub).mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:  # workers drop to nobody: let them use the temp dirs
            user = "user nobody nogroup;"
            for d in [self.run_dir / "tmp", *(self.run_dir / "tmp").iterdir()]:
                shutil.chown(d, "nobody", "nogroup")
        conf = self.run_dir / "nginx.conf"
        conf.write_text(CONF.format(module=MODULE, user=user, run_dir=self.run_dir, port=self.port))
        return conf
