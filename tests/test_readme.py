"""The README's walk-through ("Run it"), run as written against a real stack, then again after
the stack is stopped and started on the same run directory (`make down`, `make up`: the same
run/fastpoll.db), as a reader who comes back to it would: each run shows what the README says
(a miss answered by the app, then a hit, a new stored message, its replay, the poll with it,
mark-read, then 404, 401 and 403)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from fastpoll_testkit.stack import Stack

README = Path(__file__).resolve().parents[1] / "README.md"


def walkthrough(stack: Stack) -> str:
    """The README's shell block with the app's API in it, pointed at this stack: its run
    directory for run/, its nginx port for 8080, and without the closing benchmark."""
    blocks = re.findall(r"```sh\n(.*?)```", README.read_text(), re.S)
    [block] = [b for b in blocks if "/api/messages" in b]
    lines = [ln for ln in block.splitlines() if not ln.startswith("ab ")]
    text = "\n".join(lines).replace("127.0.0.1:8080", f"127.0.0.1:{stack.http_port}")
    return re.sub(r"(?<![\w/.])run/", f"{stack.run_dir}/", text)


def run_walkthrough(stack: Stack) -> str:
    script = walkthrough(stack)
    assert "hello-$(date" in script and str(stack.run_dir) in script
    r = subprocess.run(
        ["bash", "-c", script], capture_output=True, text=True, timeout=120, check=False
    )
    assert r.returncode == 0, f"{r.stdout}\n{r.stderr}"
    return r.stdout


def check_walkthrough(out: str, run: int) -> None:
    heads = re.findall(r"^HTTP/1\.1 .*$|^X-Poll-Source: .*$", out, re.M)
    # the miss (from the app), then the hit (from the cache), as the README shows them
    assert heads[:4] == [
        "HTTP/1.1 200 OK", "X-Poll-Source: app", "HTTP/1.1 200 OK", "X-Poll-Source: cache"
    ], out  # fmt: skip
    stored = re.search(r'^\{"id":(\d+),"user_id":1,"text":"hi",.*$', out, re.M)
    assert stored, f"no stored message:\n{out}"
    msg_id = int(stored.group(1))
    assert msg_id == run, f"a new message each run, got id {msg_id}:\n{out}"
    # the retry with the same key: a replay of that message, and only there
    assert "HTTP/1.1 201 Created\nIdempotent-Replayed: true\n" in out, out
    assert out.count("Idempotent-Replayed") == 1, out
    assert f'{{"unread":1,"newest":{{"id":{msg_id},' in out, out
    assert '{"user_id":1,"marked_read":1}' in out, out
    tail = out.splitlines()[-3:]
    assert [t.split()[1] for t in tail] == ["404", "401", "403"], out


def test_the_walkthrough_runs_as_written_twice(tmp_path: Path) -> None:
    for run in (1, 2):
        stack = Stack(run_dir=tmp_path / "run", n_pollers=1, app_workers=1)
        try:
            stack.start()
            out = run_walkthrough(stack)
        finally:
            stack.stop()
        check_walkthrough(out, run)
