"""fastpoll-stale (ansible/roles/fastpoll_config/files/fastpoll-stale), which tells the roles which
running service must restart: a file written before the service started is not "newer", even in
the same second. The start time comes from `systemctl show`; here a stand-in for systemctl on PATH
answers as systemd 252 does for the timestamp format asked (`unix`: whole seconds; `us+utc`:
microseconds). The fleet test's second run (nothing may restart) runs it on real systemd hosts."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "ansible/roles/fastpoll_config/files/fastpoll-stale"

FAKE_SYSTEMCTL = """#!/usr/bin/python3
import sys
from datetime import datetime, timezone
start = float(open(sys.argv[0] + ".start").read())
fmt = next(a.split("=", 1)[1] for a in sys.argv if a.startswith("--timestamp="))
if fmt == "unix":
    ts = "@%d" % int(start)
elif fmt == "us+utc":
    ts = datetime.fromtimestamp(start, timezone.utc).strftime("%a %Y-%m-%d %H:%M:%S.%f UTC")
else:
    sys.exit("unexpected --timestamp=" + fmt)
print("ActiveState=active")
print("ExecMainStartTimestamp=" + ts)
"""


def _stale(tmp_path: Path, start: float, newer: Path) -> str:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    fake = bin_dir / "systemctl"
    fake.write_text(FAKE_SYSTEMCTL)
    fake.chmod(0o755)
    (bin_dir / "systemctl.start").write_text(repr(start))
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "--newer", str(newer), "app.service=http://127.0.0.1:1/"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    )
    return out.stdout.strip()


def test_a_file_written_just_before_the_start_is_not_newer(tmp_path: Path) -> None:
    # The service started 0.7 s into a second; the file was written 0.4 s before, same second.
    second = int(time.time()) - 10
    newer = tmp_path / "release"
    newer.write_text("r1\n")
    os.utime(newer, (second + 0.3, second + 0.3))
    assert _stale(tmp_path, second + 0.7, newer) == "app.service ok"


def test_a_file_written_after_the_start_is_newer(tmp_path: Path) -> None:
    second = int(time.time()) - 10
    newer = tmp_path / "release"
    newer.write_text("r2\n")
    os.utime(newer, (second + 0.9, second + 0.9))
    assert (
        _stale(tmp_path, second + 0.7, newer)
        == f"app.service stale {newer} changed after the start"
    )
