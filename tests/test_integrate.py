"""docs/integrate.md's worked example, run as written: the guide's nginx block (an existing site
serving `/` itself, with fastpoll added by two includes) in a real nginx, its includes being the
template's `http` and `locations` parts rendered for a real stack's poll servers and app, with the
guide's CORS origin list. A listed origin gets Access-Control-Allow-Origin and -Expose-Headers on
the app's 200 and 304, the cache's 200 and 304, a held poll's 304 and a 403; an unlisted origin or
none gets no CORS header; a preflight is 204 from nginx. The whole-edge template (fastpoll_part
"site") gets the same CORS through the stack's own nginx. Without origins nothing changes."""

from __future__ import annotations

import http.client
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import jinja2
import pytest
import yaml

from fastpoll_testkit.procs import Server, free_port, wait_for
from fastpoll_testkit.stack import Stack

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "docs" / "integrate.md"
LISTED = "https://www.example.com"
UNLISTED = "https://evil.example.net"
EXPOSED = "ETag, Poll-Interval-Ms, X-Poll-Source, Retry-After"
EMPTY_TAG = '"2d06800538d394c2"'  # the ETag of the empty answer (docs/api.md)

Answer = tuple[int, dict[str, str], bytes]


def guide_block(lang: str) -> str:
    [block] = re.findall(rf"```{lang}\n(.*?)```", GUIDE.read_text(), re.S)
    return block


def guide_origins() -> list[str]:
    origins = yaml.safe_load(guide_block("yaml"))["nginx_cors_origins"]
    assert origins == [LISTED], origins
    return [str(o) for o in origins]


def request(port: int, method: str, target: str, headers: dict[str, str] | None = None) -> Answer:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=15)
    try:
        conn.request(method, target, headers=headers or {})
        r = conn.getresponse()
        body = r.read()
        # Vary may come twice (gzip's and ours): joined, as a client reads them.
        heads: dict[str, str] = {}
        for k, v in r.getheaders():
            heads[k.lower()] = f"{heads[k.lower()]}, {v}" if k.lower() in heads else v
        return r.status, heads, body
    finally:
        conn.close()


def cors_of(heads: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in heads.items() if k.startswith("access-control-")}


def assert_cors(answer: Answer, status: int, source: str | None) -> dict[str, str]:
    code, heads, _ = answer
    assert code == status, answer
    if source is not None:
        assert heads.get("x-poll-source") == source, answer
    assert cors_of(heads) == {
        "access-control-allow-origin": LISTED,
        "access-control-expose-headers": EXPOSED,
    }, answer
    assert "Origin" in heads.get("vary", ""), answer
    return heads


def assert_no_cors(answer: Answer, status: int, source: str) -> None:
    code, heads, _ = answer
    assert code == status, answer
    assert heads.get("x-poll-source") == source, answer
    assert cors_of(heads) == {}, answer


class Site:
    """The guide's example site in an nginx of its own, in front of `stack`."""

    def __init__(self, stack: Stack) -> None:
        # Not under pytest's 0700 tmp_path: nginx's workers (nobody, when we are root) serve
        # the site's root and write the temp directories.
        self.dir = Path(tempfile.mkdtemp(prefix="fastpoll-site-", dir="/tmp"))
        self.dir.chmod(0o755)
        self.port = free_port()
        snippets = self.dir / "fastpoll"
        snippets.mkdir()
        for part in ("http", "locations"):
            text = stack.render_site_template(
                fastpoll_part=part, fastpoll_cors_origins=guide_origins()
            )
            (snippets / f"fastpoll-{part}.conf").write_text(text)
        www = self.dir / "www"
        www.mkdir()
        (www / "index.html").write_text("the site's own page\n")
        example = guide_block("nginx")
        for old, new in (
            ("/etc/fastpoll/nginx/", f"{snippets}/"),
            ("/var/www/example", str(www)),
            ("listen 8080;", f"listen 127.0.0.1:{self.port};"),
        ):
            assert old in example, old
            example = example.replace(old, new)
        (self.dir / "example.conf").write_text(example)
        tmp = self.dir / "tmp"
        temps = "".join(
            f"    {kind}_temp_path {tmp / kind};\n"
            for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
        )
        user = ""
        if os.geteuid() == 0:
            user = "user nobody nogroup;\n"
        for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"):
            (tmp / kind).mkdir(parents=True)
            if user:
                shutil.chown(tmp / kind, "nobody", "nogroup")
        self.conf = self.dir / "nginx.conf"
        self.conf.write_text(
            f"{user}worker_processes 1;\npid {self.dir}/nginx.pid;\n"
            f"error_log {self.dir}/error.log warn;\nevents {{ worker_connections 1024; }}\n"
            f"http {{\n    include /etc/nginx/mime.types;\n    access_log off;\n{temps}"
            f"    include {self.dir}/example.conf;\n}}\n"
        )
        argv = ["nginx", "-p", str(self.dir), "-c", str(self.conf), "-g", "daemon off;"]
        check = subprocess.run([*argv[:5], "-t", "-q"], capture_output=True, text=True)
        assert check.returncode == 0, check.stderr
        self.nginx = Server(
            "the example site",
            argv,
            self.port,
            log=self.dir / "nginx.log",
            ready=lambda: request(self.port, "GET", "/")[0] == 200,
            timeout=30,
            logs=[self.dir / "error.log", self.dir / "nginx.log"],
        ).start()

    def stop(self) -> None:
        self.nginx.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    s = Stack(run_dir=tmp_path_factory.mktemp("integrate"), n_pollers=1, app_workers=1)
    s.start()
    try:
        yield s
    finally:
        s.stop()


@pytest.fixture(scope="module")
def site(stack: Stack) -> Iterator[Site]:
    s = Site(stack)
    try:
        yield s
    finally:
        s.stop()


def test_the_site_keeps_its_own_routes_and_the_api_stays_private(site: Site) -> None:
    code, heads, body = request(site.port, "GET", "/")
    assert (code, body) == (200, b"the site's own page\n")
    code, heads, body = request(site.port, "POST", "/api/messages", {"Content-Length": "0"})
    assert code == 404 and "x-poll-source" not in heads, (code, heads, body)


def test_a_listed_origin_gets_cors_from_the_app_and_the_cache(stack: Stack, site: Site) -> None:
    url = stack.sign("/Poll/getMessages?user_id=9101")
    origin = {"Origin": LISTED}
    heads = assert_cors(request(site.port, "GET", url, origin), 200, "app")
    tag = heads["etag"]
    assert_cors(request(site.port, "GET", url, origin), 200, "cache")
    assert_cors(request(site.port, "GET", url, {**origin, "If-None-Match": tag}), 304, "cache")
    # a held poll's end (@poll_held), and a poll the cache never answered: the app's 304
    held = stack.sign("/Poll/getMessages?user_id=9101&wait=1")
    assert_cors(request(site.port, "GET", held, {**origin, "If-None-Match": tag}), 304, "cache")
    fresh = stack.sign("/Poll/getMessages?user_id=9102")
    assert_cors(
        request(site.port, "GET", fresh, {**origin, "If-None-Match": EMPTY_TAG}), 304, "app"
    )
    # a URL without its signature: the page must see the 403 to ask for a new one
    assert_cors(request(site.port, "GET", "/Poll/getMessages?user_id=9101", origin), 403, None)


def test_an_unlisted_origin_or_none_gets_no_cors(stack: Stack, site: Site) -> None:
    for n, extra in enumerate(({"Origin": UNLISTED}, {})):
        url = stack.sign(f"/Poll/getMessages?user_id={9200 + n}")
        answer = request(site.port, "GET", url, extra)
        assert_no_cors(answer, 200, "app")
        assert_no_cors(request(site.port, "GET", url, extra), 200, "cache")
        tag = answer[1]["etag"]
        assert_no_cors(
            request(site.port, "GET", url, {**extra, "If-None-Match": tag}), 304, "cache"
        )


def test_the_preflight_is_answered_by_nginx(stack: Stack, site: Site) -> None:
    url = stack.sign("/Poll/getMessages?user_id=9301&wait=5")
    ask = {
        "Access-Control-Request-Method": "GET",
        "Access-Control-Request-Headers": "if-none-match",
    }
    code, heads, body = request(site.port, "OPTIONS", url, {"Origin": LISTED, **ask})
    assert (code, body) == (204, b""), (code, heads, body)
    assert cors_of(heads) == {
        "access-control-allow-origin": LISTED,
        "access-control-allow-methods": "GET",
        "access-control-allow-headers": "If-None-Match",
        "access-control-max-age": "7200",
    }, heads
    code, heads, body = request(site.port, "OPTIONS", url, {"Origin": UNLISTED, **ask})
    assert (code, cors_of(heads)) == (204, {}), (code, heads, body)


def reload_and_settle(stack: Stack) -> None:
    """SIGHUP nginx, then wait until every worker from before is gone: until then one of them may
    still take a connection and answer with the old config."""
    master = stack.procs["nginx"].pid

    def workers() -> set[int]:
        kids: set[int] = set()
        for task in Path(f"/proc/{master}/task").iterdir():
            kids |= {int(k) for k in (task / "children").read_text().split()}
        return kids

    old = workers()
    stack.reload_nginx()
    wait_for("the old nginx workers to exit", lambda: not (old & workers()), timeout=30)


def test_the_whole_edge_gets_the_same_cors(stack: Stack) -> None:
    url = stack.sign("/Poll/getMessages?user_id=9401")
    port = stack.http_port
    assert cors_of(request(port, "GET", url, {"Origin": LISTED})[1]) == {}  # the default: none
    stack.nginx_vars["fastpoll_cors_origins"] = [LISTED]
    try:
        reload_and_settle(stack)
        assert_cors(request(port, "GET", url, {"Origin": LISTED}), 200, "cache")
        assert_no_cors(request(port, "GET", url, {"Origin": UNLISTED}), 200, "cache")
        assert request(port, "OPTIONS", url, {"Origin": LISTED})[0] == 204
    finally:
        del stack.nginx_vars["fastpoll_cors_origins"]
        reload_and_settle(stack)


def render(**extra: object) -> str:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(ROOT / "nginx"), undefined=jinja2.StrictUndefined
    )
    return env.get_template("fastpoll.conf.j2").render(
        fastpoll_listen="127.0.0.1:8080",
        fastpoll_pollers=["unix:/run/fastpoll/8101.sock"],
        fastpoll_apps=["127.0.0.1:8000"],
        **extra,
    )


def test_the_parts_split_the_site_and_no_origins_means_no_cors() -> None:
    http_part = render(fastpoll_part="http")
    locations = render(fastpoll_part="locations")
    assert not re.search(r"^\s*location ", http_part, re.M)
    assert "upstream fastpoll_pollers" in http_part
    assert not re.search(r"^\s*(server|listen|upstream)\b", locations, re.M)
    assert "location @fallback {" in locations
    for text in (http_part, locations, render()):
        assert "Access-Control" not in text and "cors" not in text
    with pytest.raises(jinja2.UndefinedError):
        render(fastpoll_part="server")


def blocks(conf: str) -> dict[str, str]:
    """Each `location ... {` of a rendered config and its body (up to its closing brace)."""
    out: dict[str, str] = {}
    for m in re.finditer(r"^    location ([^{]+)\{\n(.*?)^    \}", conf, re.S | re.M):
        out[m.group(1).strip()] = m.group(2)
    return out


def test_with_cors_and_tls_every_location_with_headers_keeps_hsts() -> None:
    """A location with add_header lines of its own inherits none of the server's: with CORS on,
    each poll location repeats HSTS (the whole edge over TLS) and fastpoll_site_headers."""
    tls = {
        "fastpoll_tls_listen": "443",
        "fastpoll_tls_certificate": "/c.pem",
        "fastpoll_tls_certificate_key": "/k.pem",
    }
    conf = render(
        fastpoll_cors_origins=[LISTED], fastpoll_site_headers=["X-Site yes always"], **tls
    )
    found = blocks(conf)
    poll = ["/Poll/", "@wait_refused", "@poll_held", "@fallback", "@app_unavailable"]
    for name in [*poll, "@fallback_shed"]:
        body = found[name]
        assert "Access-Control-Allow-Origin $fastpoll_cors_origin always" in body, name
        assert "Strict-Transport-Security $fastpoll_hsts always" in body, name
        assert "add_header X-Site yes always;" in body, name
    preflight = found["/Poll/"].split("return 204;")[0]
    assert "Strict-Transport-Security" in preflight and "Allow-Methods" in preflight
