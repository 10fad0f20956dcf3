"""Security properties of the running stack (docs/security.md lists which test proves what).

- A user reads only their own poll answers: poll URLs are signed by the app and expire; a
  missing, tampered, expired or someone else's signature gets 403 from the poll server before
  the cache is asked and before the app sees the request, and from the app on the fallback path.
- The signature's parameters never enter the cache key.
- The signing secret comes from a 0600/0640 file made per deployment, never from the repo, and
  is never logged or put on a command line; a second secret in the file allows rotation.
- Poll servers, memcached, Redis, the app and nginx listen on loopback only (here); Redis wants
  a password; the poll server reads only keys under its prefix.
"""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from fastpoll_app.signing import load_secrets, signed_query
from fastpoll_testkit.helpers import (
    NGINX_FAIL_WAIT_S,
    Cache,
    http_client,
    new_uid,
    poll_key,
)
from fastpoll_testkit.stack import ROOT, VENV_PYTHON, Stack, memcached_stats

HIT = b'{"unread":1,"newest":{"id":1,"text":"mine"}}'


@pytest.fixture(scope="module")
def sec_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    s = Stack(
        run_dir=tmp_path_factory.mktemp("security"),
        n_memcached=1,
        n_pollers=2,
        memcached_args=["-vv"],  # every command memcached receives, in its log
    )
    s.start()
    yield s
    s.stop()


def bad_urls(stack: Stack, uid: int, other: int) -> dict[str, str]:
    """Every way a client could try to read user uid's answer without the app's consent."""
    good = stack.poll_url(uid)
    sig = good.rsplit("sig=", 1)[1]
    exp = re.search(r"exp=(\d+)", good)
    assert exp is not None
    flipped = sig[:-2] + ("AA" if not sig.endswith("AA") else "BB")
    return {
        "unsigned": f"/Poll/getMessages?user_id={uid}",
        "tampered signature": good.replace(sig, flipped),
        "later expiry": good.replace(f"exp={exp[1]}", f"exp={int(exp[1]) + 86400}"),
        "expired": stack.sign(f"/Poll/getMessages?user_id={uid}", ttl=-5),
        "another user's signature": stack.poll_url(other).replace(
            f"user_id={other}", f"user_id={uid}"
        ),
        "signature in a second user_id": stack.poll_url(other) + f"&user_id={uid}",
        "signature moved to another path": good.replace("getMessages", "getMessages2"),
        "exp repeated": good + "&exp=9999999999",
        "sig repeated": good + "&sig=" + sig,
        "percent-encoded sig": good.replace(
            sig, sig.replace("-", "%2D").replace("_", "%5F")
        )
        if ("-" in sig or "_" in sig)
        else good.replace("sig=", "%73ig="),
        "signed with another secret": f"/Poll/getMessages?user_id={uid}&"
        + signed_query(
            b"x" * 64, poll_key(uid).encode(), int(time.time()) + 600
        ).decode(),
    }


def direct(target: str) -> str:
    """The same request straight to a poll server (nginx strips /Poll)."""
    return target[len("/Poll") :]


def cache_counters(stack: Stack) -> tuple[int, int, int]:
    st = memcached_stats(stack.memcached_ports[0])
    return st["cmd_get"], st["cmd_set"], st["curr_items"]


def test_signed_url_reads_the_answer(sec_stack: Stack) -> None:
    uid = new_uid()
    Cache(sec_stack).set(poll_key(uid), HIT)
    url = sec_stack.poll_url(uid)
    with httpx.Client(base_url=sec_stack.base_url, timeout=10) as c:
        r = c.get(url)
    assert (r.status_code, r.content, r.headers["x-poll-source"]) == (200, HIT, "cache")
    for port in sec_stack.poller_ports:
        r = httpx.get(f"http://127.0.0.1:{port}{direct(url)}", timeout=10)
        assert (r.status_code, r.content) == (200, HIT)


def test_bad_signatures_get_403_before_the_cache(sec_stack: Stack) -> None:
    uid, other = new_uid(), new_uid()
    Cache(sec_stack).set(poll_key(uid), HIT)
    before = cache_counters(sec_stack)
    with httpx.Client(timeout=10) as c:
        for what, url in bad_urls(sec_stack, uid, other).items():
            for base, target in [
                (sec_stack.base_url, url),
                *(
                    (f"http://127.0.0.1:{p}", direct(url))
                    for p in sec_stack.poller_ports
                ),
            ]:
                for method in ("GET", "HEAD", "POST"):
                    r = c.request(
                        method,
                        base + target,
                        content=b"x" if method == "POST" else None,
                    )
                    assert r.status_code == 403, (what, base, method, r.status_code)
                    assert r.content != HIT
                    if method != "HEAD":
                        assert r.headers["content-type"] == "application/json"
                        assert "signature" in r.json()["error"], r.content
    # Not one get, set or new item: the cache never saw these requests.
    assert cache_counters(sec_stack) == before


def test_bad_signatures_never_reach_the_app(sec_stack: Stack) -> None:
    """With the app down, a request that reached it would get nginx's 503: they all get 403."""
    uid = new_uid()
    Cache(sec_stack).set(poll_key(uid), HIT)
    sec_stack.stop_proc("app")
    try:
        with httpx.Client(base_url=sec_stack.base_url, timeout=10) as c:
            for what, url in bad_urls(sec_stack, uid, new_uid()).items():
                r = c.get(url)
                assert r.status_code == 403, (what, r.status_code, r.content)
            assert c.get(sec_stack.poll_url(uid)).content == HIT  # hits still served
            assert (
                c.get(sec_stack.poll_url(new_uid())).status_code == 503
            )  # a miss: app down
    finally:
        sec_stack.start_app()


def test_fallback_path_checks_signatures_too(sec_stack: Stack) -> None:
    """Every poll server down: nginx sends everything to the app, which checks the signature
    first, before its database and before the cache."""
    uid = new_uid()
    pollers = [n for n in sec_stack.procs if n.startswith("poller-")]
    for name in pollers:
        sec_stack.stop_proc(name)
    try:
        before = cache_counters(sec_stack)
        with httpx.Client(base_url=sec_stack.base_url, timeout=10) as c:
            for what, url in bad_urls(sec_stack, uid, new_uid()).items():
                r = c.get(url)
                if (
                    what == "signature moved to another path"
                ):  # the app serves no such path
                    assert r.status_code == 404, (what, r.status_code, r.content)
                    continue
                assert r.status_code == 403, (what, r.status_code, r.content)
                assert "signature" in r.json()["error"]
            assert cache_counters(sec_stack) == before  # no read, no fill
            r = c.get(sec_stack.poll_url(uid))
            assert (r.status_code, r.headers["x-poll-source"]) == (200, "app")
    finally:
        for name in pollers:
            sec_stack.start_poller(int(name.split("-")[1]))
        back_in_rotation(sec_stack)


def back_in_rotation(stack: Stack, timeout: float = 20.0) -> None:
    """Wait until nginx sends polls to the poll servers again (after its fail_timeout). Each
    nginx worker keeps its own failure marks, so one worker back in rotation says nothing of
    the other: first wait out the template's fail_timeout (NGINX_FAIL_WAIT_S)."""
    time.sleep(NGINX_FAIL_WAIT_S)
    uid = new_uid()
    Cache(stack).set(poll_key(uid), HIT)
    deadline = time.monotonic() + timeout
    with httpx.Client(base_url=stack.base_url, timeout=10) as c:
        while time.monotonic() < deadline:
            if c.get(stack.poll_url(uid)).headers.get("x-poll-source") == "cache":
                return
            time.sleep(0.2)
    raise AssertionError("nginx does not use the poll servers again")


def test_signature_parameters_never_enter_the_cache_key(sec_stack: Stack) -> None:
    uid = new_uid()
    cache = Cache(sec_stack)
    with httpx.Client(base_url=sec_stack.base_url, timeout=10) as c:
        first = c.get(sec_stack.poll_url(uid, ttl=100))
        assert first.headers["x-poll-source"] == "app"
        assert cache.get(poll_key(uid)) == first.content  # filled under the plain key
        for ttl in (200, 300, 3600):  # other exp, other sig: the same key, a hit
            r = c.get(sec_stack.poll_url(uid, ttl=ttl))
            assert (r.headers["x-poll-source"], r.content) == ("cache", first.content)
    gets = [c for c in memcached_log(sec_stack) if c.startswith("get ")]
    assert gets and not [g for g in gets if "exp=" in g or "sig=" in g], gets[:5]


def test_app_issues_signed_expiring_poll_urls(sec_stack: Stack) -> None:
    uid = new_uid()
    Cache(sec_stack).set(poll_key(uid), HIT)
    with httpx.Client(base_url=sec_stack.base_url, timeout=10) as c, sec_stack.api() as api:
        assert c.post("/api/poll-url", json={"user_id": uid}).status_code == 404  # private
        r = api.post("/api/poll-url", json={"user_id": uid})
        assert r.status_code == 200
        doc = r.json()
        assert doc["url"].startswith(f"/Poll/getMessages?user_id={uid}&exp=")
        assert time.time() < doc["expires"] <= time.time() + 3600
        assert c.get(doc["url"]).content == HIT
        someone_else = doc["url"].replace(f"user_id={uid}", f"user_id={new_uid()}")
        assert c.get(someone_else).status_code == 403


def test_secret_rotation_with_two_secrets(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """The runbook's rotation: put the new secret first and keep the old one second, restart
    the poll servers and the app; URLs signed with either work; drop the old one later."""
    stack = Stack(run_dir=tmp_path_factory.mktemp("rotate"), n_memcached=1, n_pollers=1)
    stack.start()
    try:
        uid = new_uid()
        Cache(stack).set(poll_key(uid), HIT)
        old_url = stack.poll_url(uid)
        old = load_secrets(stack.secret_path)[0]
        new = b"n" * 32 + old[32:]

        def rotate(lines: list[bytes]) -> None:
            stack.secret_path.write_bytes(b"\n".join(lines) + b"\n")
            stack.stop_proc("poller-0")
            stack.stop_proc("app")
            stack.start_app()
            stack.start_poller(0)
            stack._secret = None  # Stack.sign() signs with the file's first line again

        rotate([new, old])
        new_url = stack.poll_url(uid)
        with httpx.Client(base_url=stack.base_url, timeout=10) as c:
            assert c.get(old_url).content == HIT
            assert c.get(new_url).content == HIT
            rotate([new])
            assert c.get(old_url).status_code == 403
            assert c.get(new_url).content == HIT
    finally:
        stack.stop()


def test_secret_file_must_not_be_readable_by_others(
    sec_stack: Stack, tmp_path: Path
) -> None:
    key = tmp_path / "signing.key"
    shutil.copy(sec_stack.secret_path, key)
    ini = tmp_path / "fastpoll.ini"
    ini.write_text(
        sec_stack.ini_path.read_text().replace(str(sec_stack.secret_path), str(key))
    )
    for mode, ok in [(0o600, True), (0o640, True), (0o644, False), (0o660, False)]:
        key.chmod(mode)
        poller = subprocess.run(
            [str(sec_stack.poll_server), "-t", "-c", str(ini)],
            capture_output=True,
            text=True,
            check=False,
        )
        app = subprocess.run(
            [str(VENV_PYTHON), "-m", "fastpoll_app", "--config", str(ini), "--check"],
            capture_output=True,
            text=True,
            check=False,
        )
        assert (poller.returncode == 0) == ok, (oct(mode), poller.stderr)
        assert (app.returncode == 0) == ok, (oct(mode), app.stderr)
        if not ok:
            assert f"{mode:04o}" in poller.stderr and f"{mode:04o}" in app.stderr


def test_secret_is_generated_per_deployment_and_never_leaks(sec_stack: Stack) -> None:
    secret = load_secrets(sec_stack.secret_path)[0]
    assert sec_stack.secret_path.stat().st_mode & 0o777 == 0o600
    tracked = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    assert not [f for f in tracked if f.endswith((".key", ".pass"))], (
        "a secret file is tracked"
    )
    grep = subprocess.run(
        ["git", "grep", "-F", "-q", secret.decode()], cwd=ROOT, check=False
    )
    assert grep.returncode == 1, "the secret is in the repository"
    for name, proc in sec_stack.procs.items():
        for what in ("cmdline", "environ"):
            data = Path(f"/proc/{proc.pid}/{what}").read_bytes()
            assert secret not in data, f"the secret is in {name}'s {what}"
    for log in sec_stack.run_dir.glob("*.log"):
        assert secret not in log.read_bytes(), f"the secret is in {log.name}"


# ---- where things listen --------------------------------------------------------------


def listening(pid: int) -> list[str]:
    """host:port of every listening TCP socket the process holds."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = fd.readlink().as_posix()
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = []
    for table, width in (("tcp", 8), ("tcp6", 32)):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            f = line.split()
            if f[3] != "0A" or f[9] not in inodes:  # 0A: LISTEN
                continue
            addr, port = f[1].split(":")
            raw = bytes.fromhex(addr)
            if width == 8:
                host = socket.inet_ntop(socket.AF_INET, raw[::-1])
            else:  # four little-endian 32-bit words
                words = b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))
                host = socket.inet_ntop(socket.AF_INET6, words)
            found.append(f"{host}:{int(port, 16)}")
    return found


def test_everything_listens_on_loopback_only(sec_stack: Stack) -> None:
    seen = {}
    for name, proc in sec_stack.procs.items():
        addrs = listening(proc.pid)
        assert addrs, f"{name} listens nowhere?"
        seen[name] = addrs
        for a in addrs:
            host = a.rsplit(":", 1)[0]
            assert host in ("127.0.0.1", "::1"), f"{name} listens on {a}"
    assert {"nginx", "app", "redis", "memcached-0", "poller-0"} <= set(seen)


def test_redis_requires_a_password(sec_stack: Stack) -> None:
    with socket.create_connection(("127.0.0.1", sec_stack.redis_port), timeout=5) as s:
        s.sendall(b"GET /Poll/getMessages?user_id=1\r\nFLUSHALL\r\n")
        time.sleep(0.3)
        answer = s.recv(4096)
    assert answer.startswith(b"-NOAUTH"), answer
    assert answer.count(b"-NOAUTH") == 2, answer


def memcached_log(stack: Stack) -> list[str]:
    lines = (stack.run_dir / "memcached-0.log").read_text(errors="replace").splitlines()
    return [m.group(1) for ln in lines if (m := re.match(r"<\d+ (.*)", ln))]


def test_poll_server_reads_only_keys_under_its_prefix(sec_stack: Stack) -> None:
    targets = [
        "/getMessages?user_id=1",
        "/",
        "/other/path?user_id=2&channel=x",
        "/getMessages/../../etc?user_id=3",
        "/%2FPoll%2FgetMessages?user_id=4",
        "/getMessages?user_id=%2F..%2F..",
    ]
    with http_client(sec_stack, sec_stack.poller_ports[0]) as c:
        for t in targets:
            c.get(t)
    gets = [g[4:] for g in memcached_log(sec_stack) if g.startswith("get ")]
    assert gets
    for key in gets:
        assert key.startswith("/Poll/"), key
        assert re.fullmatch(r"[!-~]{1,250}", key), key
