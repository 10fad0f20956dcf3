"""A poll server's resident memory per idle keep-alive connection.

    ulimit -n 20000; .venv/bin/python loadtests/idle_rss.py BINARY [N]

Starts memcached and the poll server on loopback, opens N connections (default 5,000) that each
make one request and read its answer, then compares the server's VmRSS with its VmRSS before.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def main() -> int:
    binary, n = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 5000
    mp, pp = free_port(), free_port()
    ini = os.path.join(tempfile.mkdtemp(prefix="fp-idle-rss-"), "fastpoll.ini")
    with open(ini, "w") as f:
        f.write(f"[memcached]\nservers = 127.0.0.1:{mp}\n[log]\nlevel = error\n")
    mc_argv = ["memcached", "-l", "127.0.0.1", "-p", str(mp), "-U", "0", "-c", "20000"]
    mc = subprocess.Popen(mc_argv + (["-u", "nobody"] if os.geteuid() == 0 else []))
    ps = None
    conns: list[socket.socket] = []
    try:
        time.sleep(0.3)
        with socket.create_connection(("127.0.0.1", mp)) as s:
            s.sendall(b'set /Poll/getMessages?user_id=1 0 0 12\r\n{"unread":1}\r\n')
            s.recv(100)
        ps = subprocess.Popen([binary, "-c", ini, "-p", str(pp)])
        time.sleep(0.5)
        before = rss_kb(ps.pid)
        req = b"GET /getMessages?user_id=1 HTTP/1.1\r\nHost: x\r\n\r\n"
        for _ in range(n):
            c = socket.create_connection(("127.0.0.1", pp))
            c.sendall(req)
            conns.append(c)
        for c in conns:
            c.recv(4096)
        time.sleep(0.5)
        after = rss_kb(ps.pid)
        print(
            f"{binary}: {n} idle keep-alive connections: VmRSS {before} -> {after} kB, "
            f"{(after - before) * 1024 / n:.0f} bytes per connection"
        )
    finally:
        for c in conns:
            c.close()
        for p in (ps, mc):
            if p is not None:
                p.terminate()
                p.wait(timeout=10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
