"""The browser client (client/fastpoll.js) in a real browser: headless Chromium (Debian's
chromium + chromium-driver) driven by Selenium, on the demo page the local stack serves at
/fastpoll-client/demo.html. A message published through the API shows on the page within a
second; stop() ends the loop (no request after it). A room (docs/channels.md): several users'
pages, each polling its own key and the room on one URL, all show a room message within a second,
and a user's own message only on that user's page. Messages by id: three publishes 0.5 s apart
show as three messages in order; a reload shows them once each and continues from there, a gap
(more published while the page was away than an answer lists, [app] answer_messages = 2 here)
is read through the history read, and a publish after the poll server's restart shows too.
The demo is a small chat page (a conversation per room of the URL and one for the user's own
messages, each with an unread badge; each message with its id and the time the page got it; the
connection as the client reports it): its texts are read from each item's `.text`, whether its
conversation is the open one or not. Tabs (the demo shares its poll across a browser's tabs of
one URL): three tabs make one tab's polls, a publish shows in each, and when the leading tab
closes, or is frozen, another takes over with nothing lost or shown twice, and a tab opened later
gets the last answer from the leader; with shared=0 each tab polls. Streams: with the client's
default transport the page holds an event stream (the poll server's fastpoll_streams, an event
per publish, no poll), three publishes show in order once each, and across the poll server's
restart the EventSource reconnects with nothing lost or twice; a stream refused with 403 gets
a new URL from refreshUrl and streams again, one refused with 503 waits its Retry-After and
streams again once the app is back; tabs sharing a URL hold one stream, the leader's, and a tab
that takes the lead over holds its own; the other tests ask for long polls (transport=poll).

The page's polls carry wait=25 and the current tag: the poll server holds them, and the app's
announcement on the stack's Redis ([announce] server: the cache is memcached) wakes them when a
message is published. The
latency is measured from just before the publish request to the page's own clock when it added
the message (Date.now(), the same host clock), not to when Selenium noticed it."""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Iterator
from urllib.parse import quote

import httpx
import pytest
from selenium import webdriver  # make deps-browser (the Makefile) installs it
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support.ui import WebDriverWait

from fastpoll_testkit.helpers import start_stack
from fastpoll_testkit.procs import free_port
from fastpoll_testkit.stack import Stack

CHROMEDRIVER = "/usr/bin/chromedriver"
INTERVAL_MS = 100
POLLS = "&transport=poll"  # the page's client long polls (its default is an event stream)


@pytest.fixture(scope="module")
def demo_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    run_dir, redis_port = tmp_path_factory.mktemp("browser"), free_port()
    s = start_stack(
        run_dir,
        "memcached",
        n_pollers=1,
        redis_port=redis_port,
        extra_ini={
            # The app's answers ask for 1-1.2 s (3 s by default): the first, a miss, comes from it.
            "poll": {"fallback_interval_ms": "1000"},
            # An answer lists two messages: three published while a page is away leave a gap.
            "app": {"answer_messages": "2"},
            # Writes are announced on the stack's Redis; the poller wakes its held polls.
            "announce": {
                "server": f"127.0.0.1:{redis_port}",
                "password_file": str(run_dir / "redis.pass"),
            },
        },
    )
    yield s
    s.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[webdriver.Chrome]:
    if not shutil.which("chromium") or not shutil.which(CHROMEDRIVER):
        pytest.fail("chromium and chromium-driver are needed: make deps-browser")
    opts = Options()
    opts.binary_location = shutil.which("chromium") or ""
    # The room test's pages share one browser in separate windows: none may be throttled as
    # a background page (its pause between polls would stretch to 1 s).
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--no-first-run", "--disable-extensions", "--disable-background-timer-throttling",
                "--disable-renderer-backgrounding",
                "--disable-backgrounding-occluded-windows"):  # fmt: skip
        opts.add_argument(arg)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
    try:
        yield driver
    finally:
        driver.quit()  # chromedriver stops the browser it started, then itself


def publish(stack: Stack, uid: int, text: str) -> float:
    """Publish; the wall-clock time (s) just before the request was sent."""
    with stack.api() as api:
        t0 = time.time()
        r = api.post("/api/messages", json={"user_id": uid, "text": text})
        assert r.status_code == 201, r.text
        print(f"publish took {time.time() - t0:.3f} s")
    return t0


def wait_held(stack: Stack, n: int = 1) -> None:
    """Until the poller holds n polls (the pages'), from its /metrics."""
    deadline = time.monotonic() + 15
    while True:
        text = httpx.get(f"http://127.0.0.1:{stack.admin_ports[0]}/metrics", timeout=5).text
        if f"\nfastpoll_held_requests {n}\n" in text:
            return
        assert time.monotonic() < deadline, "the page's poll was never held"
        time.sleep(0.05)


def texts(driver: webdriver.Chrome, css: str) -> list[str]:
    """The messages' texts of a list, in the page's order: each item's `.text` (its id and
    time are beside it, in `.meta`), read whether or not its conversation is the open one."""
    return list(
        driver.execute_script(
            "return [...document.querySelectorAll(arguments[0])]"
            ".map((li) => li.querySelector('.text').textContent);",
            css,
        )
    )


def shown(driver: webdriver.Chrome) -> list[str]:
    return texts(driver, "#messages li")


def connection(driver: webdriver.Chrome) -> str:
    """The page's connection state (connected, reconnecting, offline, ...), from its client."""
    return str(driver.find_element(By.ID, "connection").get_attribute("data-state"))


def newest_li(driver: webdriver.Chrome, css: str) -> WebElement:
    """The last item of a list: the page lists messages in order, the newest last."""
    return driver.find_elements(By.CSS_SELECTOR, css)[-1]


def stop_page(driver: webdriver.Chrome, poller: str = "window.fastpollDemo?.poller") -> None:
    """Stop the page's poller (the demo's, or another one the page holds) and wait for it."""
    driver.execute_async_script(
        "const done = arguments[arguments.length - 1];"
        f"{poller}.stop().then(() => done(true)) ?? done(false);"
    )


def test_messages_in_order_once_each_across_a_reload_a_gap_and_a_poller_restart(
    demo_stack: Stack, browser: webdriver.Chrome
) -> None:
    uid = 737373
    page = (
        f"{demo_stack.base_url}/fastpoll-client/demo.html"
        f"?url={quote(demo_stack.poll_url(uid), safe='')}&interval={INTERVAL_MS}&wait=25{POLLS}"
    )
    browser.get(page)
    wait_held(demo_stack)
    texts = [f"m{i}" for i in range(1, 4)]
    for t in texts:  # 0.5 s apart: each answer lists every unread message, in order
        publish(demo_stack, uid, t)
        time.sleep(0.5)

    def shows(want: list[str]) -> Callable[[webdriver.Chrome], bool]:
        return lambda d: shown(d) == want

    WebDriverWait(browser, 5, 0.05).until(shows(texts))
    # A reload: the page shows what it showed (its own record), and the client hands over
    # nothing again: the answer still lists m2 and m3 (unread), both already handed over.
    browser.refresh()
    answers = "return window.fastpollDemo.stats.answers"
    WebDriverWait(browser, 5, 0.05).until(lambda d: d.execute_script(answers) >= 1)
    time.sleep(1.0)
    assert shown(browser) == texts
    restored = browser.find_elements(By.CSS_SELECTOR, "#messages li[data-restored]")
    assert len(restored) == 3
    # Away from the page while three are published: the answer lists m5 and m6 with
    # "before" m4, newer than the last shown (m3): the page reads m4 first, then the rest.
    stop_page(browser)
    browser.get("about:blank")
    away = [f"m{i}" for i in range(4, 7)]
    for t in away:
        publish(demo_stack, uid, t)
    answer = httpx.get(demo_stack.base_url + demo_stack.poll_url(uid), timeout=5).json()
    assert [m["text"] for m in answer["messages"]] == ["m5", "m6"] and "before" in answer
    browser.get(page)
    WebDriverWait(browser, 5, 0.05).until(shows(texts + away))
    # The poll server restarted (stopped by its pid, started again): a publish still shows.
    wait_held(demo_stack)
    demo_stack.stop_proc("poller-0")
    demo_stack.start_poller(0)
    publish(demo_stack, uid, "m7")
    WebDriverWait(browser, 10, 0.05).until(shows([*texts, *away, "m7"]))
    time.sleep(0.5)
    assert shown(browser) == [*texts, *away, "m7"]  # nothing twice
    stop_page(browser)


def publish_id(stack: Stack, uid: int, text: str) -> int:
    """Publish; the stored message's id."""
    with stack.api() as api:
        r = api.post("/api/messages", json={"user_id": uid, "text": text})
        assert r.status_code == 201, r.text
        return int(r.json()["id"])


def test_the_demo_shows_quick_messages_in_order_across_a_reload_and_a_poller_restart(
    demo_stack: Stack, browser: webdriver.Chrome
) -> None:
    """A user's page that also reads a room (the room is the open conversation): three publishes
    0.3 s apart show as three messages in order, each with its id and the time the page got it,
    and the user's conversation's badge counts them; after a reload, the same three in order
    (the badge too); opened, the badge clears; after the poll server's restart a fourth shows
    after the three, and the page says it is connected."""
    uid = 747474
    with demo_stack.api() as api:
        r = api.post("/api/poll-url", json={"user_id": uid, "channels": ["room.lobby"]})
        assert r.status_code == 200, r.text
        url = r.json()["url"]
    page = (
        f"{demo_stack.base_url}/fastpoll-client/demo.html"
        f"?url={quote(url, safe='')}&interval={INTERVAL_MS}&wait=25{POLLS}"
    )
    browser.get(page)
    wait_held(demo_stack)  # the first answer came (a URL new to the tab starts from it)
    assert connection(browser) == "connected"
    badge = 'button[data-conv="user"] .badge'

    def badge_count(d: webdriver.Chrome) -> int | None:
        """The user's unread badge: its number, None while hidden."""
        b = d.find_element(By.CSS_SELECTOR, badge)
        return None if b.get_attribute("hidden") is not None else int(b.text)

    sent = ["quick 1", "quick 2", "quick 3"]
    ids = []
    for t in sent:
        ids.append(publish_id(demo_stack, uid, t))
        time.sleep(0.3)
    assert ids == sorted(ids)

    def shows(want: list[str]) -> Callable[[webdriver.Chrome], bool]:
        return lambda d: shown(d) == want

    WebDriverWait(browser, 5, 0.05).until(shows(sent))
    items = browser.find_elements(By.CSS_SELECTOR, "#messages li")
    assert [int(li.get_attribute("data-id") or 0) for li in items] == ids
    metas = [  # the pane is not the open one: textContent, not .text (the visible text)
        m.get_attribute("textContent") or ""
        for m in browser.find_elements(By.CSS_SELECTOR, "#messages li .meta")
    ]
    assert [m.split(" · ")[0] for m in metas] == [f"#{i}" for i in ids], metas
    assert len(browser.find_elements(By.CSS_SELECTOR, "#messages li .meta time[datetime]")) == 3
    assert badge_count(browser) == 3  # the room is open: the user's three are unread
    assert browser.title.startswith("(3) ")

    # A reload: the page shows what it showed, from its own record; the client hands nothing
    # over again. Its first answer (no tag: at once) is handed over in the same task as
    # onAnswer (no gap to read), so once it is counted the list is final.
    browser.refresh()
    answers = "return window.fastpollDemo.stats.answers"
    WebDriverWait(browser, 5, 0.05).until(lambda d: d.execute_script(answers) >= 1)
    assert shown(browser) == sent
    assert len(browser.find_elements(By.CSS_SELECTOR, "#messages li[data-restored]")) == 3
    assert badge_count(browser) == 3
    browser.find_element(By.CSS_SELECTOR, 'button[data-conv="user"]').click()
    assert badge_count(browser) is None  # seen
    visible = [li.text for li in browser.find_elements(By.CSS_SELECTOR, "#messages li .text")]
    assert visible == sent  # the open pane shows them

    # The poll server restarted (stopped by its pid, started again): once the page's poll is
    # held by the new one, subscribed to the announcements, a fourth publish shows after them.
    wait_held(demo_stack)
    demo_stack.stop_proc("poller-0")
    demo_stack.start_poller(0)
    demo_stack.wait_subscribed()
    wait_held(demo_stack)
    ids.append(publish_id(demo_stack, uid, "quick 4"))
    WebDriverWait(browser, 5, 0.05).until(shows([*sent, "quick 4"]))
    items = browser.find_elements(By.CSS_SELECTOR, "#messages li")
    assert [int(li.get_attribute("data-id") or 0) for li in items] == ids
    assert connection(browser) == "connected"
    assert badge_count(browser) is None  # the open conversation: read as it arrives
    stop_page(browser)


def test_a_messages_data_reaches_the_page(demo_stack: Stack, browser: webdriver.Chrome) -> None:
    """docs/api.md, "Data": a message published with data (beside its text, or alone) reaches
    onMessages with it, as published; the demo shows it as JSON under the text, and again after
    a reload; a message without data shows none."""
    uid = 757575
    with demo_stack.api() as api:
        url = api.post("/api/poll-url", json={"user_id": uid}).json()["url"]
        page = (
            f"{demo_stack.base_url}/fastpoll-client/demo.html"
            f"?url={quote(url, safe='')}&interval={INTERVAL_MS}&wait=25{POLLS}"
        )
        browser.get(page)
        wait_held(demo_stack)
        sent = [
            {"user_id": uid, "text": "shipped", "data": {"order": 991, "tags": ["☃"]}},
            {"user_id": uid, "data": [1, 2.5, None, True]},
            {"user_id": uid, "text": "plain"},
        ]
        for body in sent:
            assert api.post("/api/messages", json=body).status_code == 201
    want = [
        ["shipped", '{"order":991,"tags":["☃"]}'],
        ["", "[1,2.5,null,true]"],
        ["plain", None],
    ]
    shown_data = (
        "return [...document.querySelectorAll('#messages li')].map((li) => "
        "[li.querySelector('.text').textContent, li.querySelector('.data')?.textContent ?? null]);"
    )
    WebDriverWait(browser, 5, 0.05).until(lambda d: d.execute_script(shown_data) == want)
    browser.refresh()
    answers = "return window.fastpollDemo.stats.answers"
    WebDriverWait(browser, 5, 0.05).until(lambda d: d.execute_script(answers) >= 1)
    assert browser.execute_script(shown_data) == want
    stop_page(browser)


def test_messages_arrive_within_a_second_and_stop_is_clean(
    demo_stack: Stack, browser: webdriver.Chrome
) -> None:
    uid = 424242
    url = demo_stack.poll_url(uid)
    browser.get(
        f"{demo_stack.base_url}/fastpoll-client/demo.html"
        f"?url={quote(url, safe='')}&interval={INTERVAL_MS}&wait=25{POLLS}"
    )
    # The first poll is a miss (the app answers, with a 1-1.2 s pace); the next, with its tag,
    # is held by the poller: the steady state, before timing anything.
    wait_held(demo_stack)
    latencies = []
    for i in range(3):
        if i:
            wait_held(demo_stack)  # the page's next poll, with the new tag
        text = f"message {i} ☃ <b>not html</b>"
        t0 = publish(demo_stack, uid, text)

        def has_text(d: webdriver.Chrome, t: str = text) -> bool:
            return t in shown(d)

        WebDriverWait(browser, 5, 0.02).until(has_text)
        at = newest_li(browser, "#messages li").get_attribute("data-shown-at")
        latencies.append(int(at or 0) / 1000 - t0)
        time.sleep(0.1)
    assert shown(browser) == [f"message {i} ☃ <b>not html</b>" for i in (0, 1, 2)]
    assert max(latencies) < 1.0, latencies
    print(f"publish-to-page latencies (s): {[round(x, 3) for x in latencies]}")

    # stop(): the loop ends (the promise resolves) and no poll follows.
    browser.execute_async_script(
        "const done = arguments[arguments.length - 1];"
        "window.fastpollDemo.poller.stop().then(() => done(true));"
    )
    polls = browser.execute_script("return window.fastpollDemo.poller.polls")
    time.sleep(0.6)  # several intervals
    assert browser.execute_script("return window.fastpollDemo.poller.polls") == polls
    assert connection(browser) == "stopped"
    publish(demo_stack, uid, "after stop")
    time.sleep(0.5)
    assert "after stop" not in shown(browser)


def test_retry_after_is_honoured_and_the_page_recovers(
    demo_stack: Stack, browser: webdriver.Chrome
) -> None:
    """The app stopped: a miss gets nginx's 503 with Retry-After 2-3 s; the client waits that
    long (its own error back-off would be 0-1 s), then recovers when the app is back."""
    uid = 515151
    app = demo_stack.app_name(0)
    demo_stack.stop_proc(app)
    try:
        browser.get(
            f"{demo_stack.base_url}/fastpoll-client/demo.html"
            f"?url={quote(demo_stack.poll_url(uid), safe='')}&interval={INTERVAL_MS}&wait=25{POLLS}"
        )
        WebDriverWait(browser, 10, 0.05).until(
            lambda d: "status 503" in d.find_element(By.ID, "status").text
        )
        assert connection(browser) == "reconnecting"
        time.sleep(4.0)
        polls = browser.execute_script("return window.fastpollDemo.poller.polls")
        assert 1 <= polls <= 3, polls  # every 2-3 s, not every 0-1 s or every 300 ms
    finally:
        demo_stack.start_app(0)
    WebDriverWait(browser, 10, 0.05).until(
        lambda d: "nothing unread" in d.find_element(By.ID, "status").text
    )
    assert connection(browser) == "connected"
    browser.execute_async_script(
        "const done = arguments[arguments.length - 1];"
        "window.fastpollDemo.poller.stop().then(() => done(true));"
    )


def test_a_room_shared_by_users(demo_stack: Stack, browser: webdriver.Chrome) -> None:
    """Three users' pages, each on its own signed URL for its key and room.demo: a message to
    the room shows on every page within a second; a message to one user on that page only."""
    uids = [616161, 626262, 636363]
    windows: list[str] = []
    with demo_stack.api() as api:
        for uid in uids:
            r = api.post("/api/poll-url", json={"user_id": uid, "channels": ["room.demo"]})
            assert r.status_code == 200, r.text
            url = r.json()["url"]
            assert "&ch=room.demo&" in url
            if windows:
                browser.switch_to.new_window("window")
            windows.append(browser.current_window_handle)
            browser.get(
                f"{demo_stack.base_url}/fastpoll-client/demo.html"
                f"?url={quote(url, safe='')}&interval={INTERVAL_MS}&wait=25{POLLS}"
            )

    def room(d: webdriver.Chrome) -> list[str]:
        return texts(d, 'ul[data-room="room.demo"] li')

    def everywhere(text: str) -> list[float]:
        """When each page showed `text` in the room (its own clock, seconds)."""
        at = []
        for w in windows:
            browser.switch_to.window(w)
            WebDriverWait(browser, 5, 0.02).until(lambda d: text in room(d))
            li = newest_li(browser, 'ul[data-room="room.demo"] li')
            at.append(int(li.get_attribute("data-shown-at") or 0) / 1000)
        return at

    try:
        latencies = []
        for i in range(3):
            wait_held(demo_stack, len(uids))  # every page's poll, with its current tag
            text = f"room message {i} <i>not html</i>"
            with demo_stack.api() as api:
                t0 = time.time()
                r = api.post("/api/channels/room.demo/messages", json={"text": text})
                assert r.status_code == 201, r.text
                assert r.json()["channel"] == "room.demo"
            latencies += [at - t0 for at in everywhere(text)]
            time.sleep(0.1)
        for w in windows:
            browser.switch_to.window(w)
            assert room(browser) == [f"room message {i} <i>not html</i>" for i in (0, 1, 2)]
        print(f"room publish-to-page latencies (s): {[round(x, 3) for x in latencies]}")
        assert max(latencies) < 1.0, latencies

        wait_held(demo_stack, len(uids))
        publish(demo_stack, uids[1], "for the second user only")
        browser.switch_to.window(windows[1])
        WebDriverWait(browser, 5, 0.02).until(lambda d: "for the second user only" in shown(d))
        time.sleep(0.3)
        for w in (windows[0], windows[2]):
            browser.switch_to.window(w)
            assert shown(browser) == []
    finally:
        for w in windows:
            browser.switch_to.window(w)
            browser.execute_async_script(
                "const done = arguments[arguments.length - 1];"
                "window.fastpollDemo?.poller.stop().then(() => done(true)) ?? done(false);"
            )
        for w in windows[1:]:
            browser.switch_to.window(w)
            browser.close()
        browser.switch_to.window(windows[0])


def set_offline(driver: webdriver.Chrome, offline: bool) -> None:
    """Chromium's own network emulation (DevTools): offline, every request fails and the page
    gets navigator.onLine false and its "offline" event; back, "online"."""
    driver.execute_cdp_cmd("Network.enable", {})
    driver.execute_cdp_cmd(
        "Network.emulateNetworkConditions",
        {"offline": offline, "latency": 0, "downloadThroughput": -1, "uploadThroughput": -1},
    )


def test_offline_sends_nothing_and_online_polls_at_once(
    demo_stack: Stack, browser: webdriver.Chrome
) -> None:
    """Offline (network emulation), the page's held poll is cancelled and nothing is sent: no
    request fails (onError is never called), no answer comes. Three published meanwhile (more
    than an answer lists: a gap) show within a second of going back online, in order, once."""
    uid = 818181
    browser.get(
        f"{demo_stack.base_url}/fastpoll-client/demo.html"
        f"?url={quote(demo_stack.poll_url(uid), safe='')}&interval={INTERVAL_MS}&wait=25{POLLS}"
    )
    wait_held(demo_stack)
    publish(demo_stack, uid, "before")
    WebDriverWait(browser, 5, 0.05).until(lambda d: shown(d) == ["before"])
    wait_held(demo_stack)
    stats = "return window.fastpollDemo.stats"
    try:
        set_offline(browser, True)
        WebDriverWait(browser, 5, 0.05).until(
            lambda d: d.execute_script(
                "return !navigator.onLine && window.fastpollDemo.poller.offline"
            )
        )
        wait_held(demo_stack, 0)  # the held poll was cancelled, not left hanging
        WebDriverWait(browser, 5, 0.05).until(lambda d: connection(d) == "offline")
        polls = browser.execute_script("return window.fastpollDemo.poller.polls")
        away = ["away 1", "away 2", "away 3"]
        for t in away:
            publish(demo_stack, uid, t)
            time.sleep(0.3)
        time.sleep(2.0)  # an error back-off (0.5 s x 2^n) would have retried several times
        assert shown(browser) == ["before"]
        assert browser.execute_script("return window.fastpollDemo.poller.polls") == polls
        assert browser.execute_script(stats)["errors"] == 0  # nothing was sent to fail
        assert browser.execute_script(stats)["offline"] >= 1
    finally:
        t0 = time.time()
        set_offline(browser, False)
    WebDriverWait(browser, 3, 0.02).until(lambda d: shown(d) == ["before", *away])
    at = newest_li(browser, "#messages li").get_attribute("data-shown-at")
    latency = int(at or 0) / 1000 - t0
    print(f"online-to-page latency (s): {latency:.3f}")
    assert latency < 1.0, latency
    assert browser.execute_script("return window.fastpollDemo.poller.offline") is False
    WebDriverWait(browser, 5, 0.05).until(lambda d: connection(d) == "connected")
    time.sleep(0.5)
    assert shown(browser) == ["before", *away]  # once each
    # Still polling as before: a publish now shows too.
    wait_held(demo_stack)
    publish(demo_stack, uid, "after")
    WebDriverWait(browser, 5, 0.05).until(lambda d: shown(d) == ["before", *away, "after"])
    stop_page(browser)


def metric_sums(stack: Stack, *prefixes: str) -> tuple[int, ...]:
    """Per prefix, the sum of the poll server's /metrics samples whose line starts with it."""
    text = httpx.get(f"http://127.0.0.1:{stack.admin_ports[0]}/metrics", timeout=5).text
    sums = [0] * len(prefixes)
    for line in text.splitlines():
        for i, prefix in enumerate(prefixes):
            if line.startswith(prefix):
                sums[i] += int(line.split()[1])
    return tuple(sums)


def poller_metrics(stack: Stack) -> tuple[int, ...]:
    """(polls held now, requests answered so far) of the poll server, from its /metrics."""
    return metric_sums(stack, "fastpoll_held_requests ", "fastpoll_requests_total{")


def open_tabs(driver: webdriver.Chrome, page: str, n: int) -> list[str]:
    """n more windows of the browser on `page` (tabs of one origin: one profile)."""
    out = []
    for _ in range(n):
        driver.switch_to.new_window("window")
        out.append(driver.current_window_handle)
        driver.get(page)
    return out


def on_each(driver: webdriver.Chrome, windows: list[str], script: str) -> list[object]:
    out = []
    for w in windows:
        driver.switch_to.window(w)
        out.append(driver.execute_script(script))
    return out


def shown_in(driver: webdriver.Chrome, window: str) -> list[str]:
    driver.switch_to.window(window)
    return shown(driver)


def close_tabs(driver: webdriver.Chrome, windows: list[str], home: str) -> None:
    for w in windows:
        driver.switch_to.window(w)
        stop_page(driver)
        driver.close()
    driver.switch_to.window(home)


def test_tabs_share_one_poll_and_a_tab_takes_over_when_the_leader_closes(
    demo_stack: Stack, browser: webdriver.Chrome
) -> None:
    """Three tabs of the demo on one user's URL (the demo shares its poll across tabs): one
    poll reaches the poll server, not three; three publishes show in every tab, in order. The
    leading tab closed: another takes the lead within 3 s, continues from the last tag, and a
    publish then shows in both remaining tabs, nothing lost, nothing twice. A tab opened then
    gets the leader's last answer without a poll of its own. The leader frozen: another tab
    leads, and the frozen one, resumed, shows what it missed, once. With shared=0 each tab polls
    on its own (two tabs: two held polls)."""
    uid, home = 939393, browser.current_window_handle
    page = (
        f"{demo_stack.base_url}/fastpoll-client/demo.html"
        f"?url={quote(demo_stack.poll_url(uid), safe='')}&interval={INTERVAL_MS}&wait=25{POLLS}"
    )
    windows = open_tabs(browser, page, 3)
    try:
        for w in windows:  # every tab has its first answer (the leader's, or its own)
            browser.switch_to.window(w)
            WebDriverWait(browser, 10, 0.05).until(
                lambda d: d.execute_script("return window.fastpollDemo.stats.answers") >= 1
            )
        WebDriverWait(browser, 10, 0.05).until(lambda _: poller_metrics(demo_stack)[0] >= 1)
        time.sleep(1.5)  # a tab polling on its own would have its poll held by now
        held, before = poller_metrics(demo_stack)
        assert held == 1, f"{held} polls held for three tabs of one URL"
        leaders = on_each(browser, windows, "return window.fastpollDemo.poller.leader")
        assert leaders.count(True) == 1, leaders
        leader = windows[leaders.index(True)]
        polls = on_each(browser, windows, "return window.fastpollDemo.poller.polls")
        assert [p for w, p in zip(windows, polls, strict=True) if w != leader] == [0, 0], polls

        sent = [f"tab {i}" for i in range(1, 4)]
        for t in sent:
            publish(demo_stack, uid, t)
            time.sleep(0.3)
        for w in windows:
            browser.switch_to.window(w)
            WebDriverWait(browser, 5, 0.05).until(lambda d: shown(d) == sent)
        held, after = poller_metrics(demo_stack)
        # One tab's polls: each publish answers the held poll, its next one is held again.
        assert held == 1 and after - before <= len(sent) + 1, (held, after - before)

        # The leader closes: its lock passes to another tab, which polls with the last tag.
        browser.switch_to.window(leader)
        browser.close()
        windows.remove(leader)
        t0 = time.monotonic()
        while True:
            leaders = on_each(browser, windows, "return window.fastpollDemo.poller.leader")
            if True in leaders:
                break
            assert time.monotonic() - t0 < 3.0, "no tab took the lead over"
            time.sleep(0.05)
        print(f"lead taken over in {time.monotonic() - t0:.3f} s")
        assert leaders.count(True) == 1, leaders
        wait_held(demo_stack, 1)
        publish(demo_stack, uid, "after takeover")
        for w in windows:
            browser.switch_to.window(w)
            WebDriverWait(browser, 5, 0.05).until(lambda d: shown(d) == [*sent, "after takeover"])
        time.sleep(0.5)
        for w in windows:
            browser.switch_to.window(w)
            assert shown(browser) == [*sent, "after takeover"]  # none lost, none twice
        assert poller_metrics(demo_stack)[0] == 1

        # A tab opened now gets the leader's last answer at once (no poll of its own): a URL
        # new to it starts from what that answer lists (answer_messages = 2).
        held, before = poller_metrics(demo_stack)
        windows += open_tabs(browser, page, 1)
        WebDriverWait(browser, 2, 0.02).until(
            lambda d: d.execute_script("return window.fastpollDemo.stats.bySource.tab") == 1
        )
        assert shown(browser) == [sent[-1], "after takeover"]
        assert browser.execute_script("return window.fastpollDemo.poller.polls") == 0
        assert poller_metrics(demo_stack) == (1, before)

        # The leader frozen (Chromium's page lifecycle): it lets the lock go, another tab
        # leads; resumed, it catches up from the leader's last answer, once.
        leaders = on_each(browser, windows, "return window.fastpollDemo.poller.leader")
        leader = windows[leaders.index(True)]
        others = [w for w in windows if w != leader]
        want = {w: [*shown_in(browser, w), "while frozen"] for w in windows}
        browser.switch_to.window(leader)
        browser.execute_cdp_cmd("Page.setWebLifecycleState", {"state": "frozen"})
        t0 = time.monotonic()
        while not any(on_each(browser, others, "return window.fastpollDemo.poller.leader")):
            assert time.monotonic() - t0 < 3.0, "no tab took the lead from the frozen one"
            time.sleep(0.05)
        wait_held(demo_stack, 1)
        publish(demo_stack, uid, "while frozen")
        for w in others:
            browser.switch_to.window(w)
            WebDriverWait(browser, 5, 0.05).until(lambda d: shown(d) == want[w])  # noqa: B023
        browser.switch_to.window(leader)
        browser.execute_cdp_cmd("Page.setWebLifecycleState", {"state": "active"})
        WebDriverWait(browser, 5, 0.05).until(lambda d: shown(d) == want[leader])
        time.sleep(0.5)
        for w in windows:
            assert shown_in(browser, w) == want[w]  # once each
        assert poller_metrics(demo_stack)[0] == 1
    finally:
        close_tabs(browser, windows, home)

    # Not shared: each tab polls on its own.
    wait_held(demo_stack, 0)
    page = (
        f"{demo_stack.base_url}/fastpoll-client/demo.html?url="
        f"{quote(demo_stack.poll_url(uid + 1), safe='')}&interval={INTERVAL_MS}&wait=25"
        f"&shared=0{POLLS}"
    )
    windows = open_tabs(browser, page, 2)
    try:
        wait_held(demo_stack, 2)
        assert on_each(browser, windows, "return window.fastpollDemo.poller.leader") == [True] * 2
        publish(demo_stack, uid + 1, "each polls")
        for w in windows:
            browser.switch_to.window(w)
            WebDriverWait(browser, 5, 0.05).until(lambda d: shown(d) == ["each polls"])
    finally:
        close_tabs(browser, windows, home)


def stream_metrics(stack: Stack) -> tuple[int, ...]:
    """(streams held now, stream events sent so far) of the poll server, from its /metrics."""
    return metric_sums(stack, "fastpoll_streams ", "fastpoll_stream_events_total ")


def test_the_default_transport_is_an_event_stream_that_resumes_across_a_restart(
    demo_stack: Stack, browser: webdriver.Chrome
) -> None:
    """The demo with the client's default transport ("auto"): Chromium has EventSource, so the
    page holds an event stream (the poll server counts it, and an event per publish), not a
    long poll; three publishes show in order, once each; the poll server restarted, the
    EventSource reconnects (through the app's short stream while the poller is away) with its
    last id, and a publish after it shows, nothing twice or lost."""
    uid = 757575
    page = (
        f"{demo_stack.base_url}/fastpoll-client/demo.html"
        f"?url={quote(demo_stack.poll_url(uid), safe='')}&interval={INTERVAL_MS}&wait=25"
    )
    transport = "return window.fastpollDemo?.poller.transport"
    browser.get(page)
    try:
        WebDriverWait(browser, 5, 0.05).until(lambda d: d.execute_script(transport) == "stream")
        # The first answer of a key not yet cached comes from the app (a short stream); the
        # EventSource reconnects, now to the poll server, which holds it.
        WebDriverWait(browser, 15, 0.05).until(lambda _: stream_metrics(demo_stack)[0] >= 1)
        # The held gauge counts a stream too: what it holds is the stream, no long poll.
        held, answered0 = poller_metrics(demo_stack)
        streams, events0 = stream_metrics(demo_stack)
        assert held == streams == 1, (held, streams)
        texts_ = [f"s{i}" for i in range(1, 4)]
        for t in texts_:
            publish(demo_stack, uid, t)
            time.sleep(0.5)
        WebDriverWait(browser, 5, 0.05).until(lambda d: shown(d) == texts_)
        time.sleep(0.5)
        assert shown(browser) == texts_
        streams, events = stream_metrics(demo_stack)
        assert streams == 1 and events >= events0 + 3, (streams, events0, events)
        # No poll made for them: each came down the one stream.
        assert poller_metrics(demo_stack) == (1, answered0)
        assert browser.execute_script(transport) == "stream"
        # The poll server restarted: its stream ends, the page reconnects by itself.
        demo_stack.stop_proc("poller-0")
        demo_stack.start_poller(0)
        # Once the new one holds the page's stream, subscribed to the announcements, a
        # publish shows.
        demo_stack.wait_subscribed()
        WebDriverWait(browser, 20, 0.05).until(lambda _: stream_metrics(demo_stack)[0] >= 1)
        publish(demo_stack, uid, "s4")
        WebDriverWait(browser, 10, 0.05).until(lambda d: shown(d) == [*texts_, "s4"])
        publish(demo_stack, uid, "s5")
        WebDriverWait(browser, 5, 0.05).until(lambda d: shown(d) == [*texts_, "s4", "s5"])
        time.sleep(0.5)
        assert shown(browser) == [*texts_, "s4", "s5"]  # nothing twice, nothing lost
        assert browser.execute_script(transport) == "stream"
        assert stream_metrics(demo_stack)[1] >= 2  # the new poll server's events
    finally:
        stop_page(browser)


# A poller of the page's own, started in the demo page (same origin) from the client module:
# its URL, a refreshed URL for refreshUrl, and what it saw, kept on window.t.
START_OWN_POLLER = """
const [url, fresh, done] = [arguments[0], arguments[1], arguments[arguments.length - 1]];
import("/fastpoll-client/fastpoll.js").then(({ startPolling }) => {
  const t = { refreshed: 0, statuses: [], texts: [] };
  t.poller = startPolling({
    url, interval: 100, wait: 25,
    refreshUrl: async () => { t.refreshed += 1; return fresh; },
    onStatus: (s) => t.statuses.push(s.status),
    onMessages: (list) => t.texts.push(...list.map((m) => m.text)),
  });
  window.t = t;
  done(true);
});
"""


def test_a_stream_refused_403_refreshes_its_url_and_streams_again(
    demo_stack: Stack, browser: webdriver.Chrome
) -> None:
    """A stream on an expired signed URL is refused (403): the EventSource closes, one long
    poll from the last tag gets the 403 and asks refreshUrl for a new URL, and the stream
    opens again on it; a publish then comes down that stream."""
    uid = 434343
    expired = demo_stack.poll_url(uid, ttl=1)
    fresh = demo_stack.poll_url(uid)
    time.sleep(2.5)
    assert httpx.get(demo_stack.base_url + expired, timeout=5).status_code == 403
    browser.get(f"{demo_stack.base_url}/fastpoll-client/demo.html")
    browser.execute_async_script(START_OWN_POLLER, expired, fresh)
    try:
        WebDriverWait(browser, 10, 0.05).until(
            lambda d: d.execute_script("return window.t.refreshed") == 1
        )
        WebDriverWait(browser, 15, 0.05).until(lambda _: stream_metrics(demo_stack)[0] >= 1)
        assert browser.execute_script("return window.t.poller.transport") == "stream"
        assert 403 in browser.execute_script("return window.t.statuses")
        publish(demo_stack, uid, "after the refresh")
        WebDriverWait(browser, 5, 0.05).until(
            lambda d: d.execute_script("return window.t.texts") == ["after the refresh"]
        )
        assert browser.execute_script("return window.t.refreshed") == 1
    finally:
        stop_page(browser, "window.t?.poller")


def test_a_stream_refused_503_waits_retry_after_and_streams_again(
    demo_stack: Stack, browser: webdriver.Chrome
) -> None:
    """The app stopped, a stream of a key not cached falls back and gets nginx's 503 with
    Retry-After 2-3 s: the client's long poll after the failed stream waits that long (not
    its own 0-1 s back-off, not at once), it tries the stream again, and once the app is back
    it holds a stream and a publish comes down it."""
    uid = 535353
    app = demo_stack.app_name(0)
    demo_stack.stop_proc(app)
    try:
        browser.get(f"{demo_stack.base_url}/fastpoll-client/demo.html")
        browser.execute_async_script(START_OWN_POLLER, demo_stack.poll_url(uid), "")
        WebDriverWait(browser, 10, 0.05).until(
            lambda d: 503 in d.execute_script("return window.t.statuses")
        )
        time.sleep(5.0)
        statuses = browser.execute_script("return window.t.statuses")
        # Each 503 is a long poll's (the failed stream says nothing): every 2-3 s.
        assert 2 <= statuses.count(503) <= 4, statuses
    finally:
        demo_stack.start_app(0)
    WebDriverWait(browser, 60, 0.05).until(lambda _: stream_metrics(demo_stack)[0] >= 1)
    try:
        assert browser.execute_script("return window.t.poller.transport") == "stream"
        publish(demo_stack, uid, "after the outage")
        WebDriverWait(browser, 5, 0.05).until(
            lambda d: "after the outage" in d.execute_script("return window.t.texts")
        )
    finally:
        stop_page(browser, "window.t?.poller")


def test_tabs_share_one_stream_and_a_tab_takes_it_over(
    demo_stack: Stack, browser: webdriver.Chrome
) -> None:
    """Three tabs of the demo with the default transport: the leading tab holds the one event
    stream (the poll server holds one stream, no long poll), three publishes show in every tab
    in order; the leader closed, another tab takes over and holds a stream of its own, and a
    publish then shows in both remaining tabs, nothing lost or twice."""
    uid, home = 969696, browser.current_window_handle
    page = (
        f"{demo_stack.base_url}/fastpoll-client/demo.html"
        f"?url={quote(demo_stack.poll_url(uid), safe='')}&interval={INTERVAL_MS}&wait=25"
    )
    windows = open_tabs(browser, page, 3)
    try:
        WebDriverWait(browser, 20, 0.05).until(lambda _: stream_metrics(demo_stack)[0] >= 1)
        time.sleep(1.5)  # a tab streaming on its own would hold its stream by now
        assert stream_metrics(demo_stack)[0] == 1 and poller_metrics(demo_stack)[0] == 1
        leaders = on_each(browser, windows, "return window.fastpollDemo.poller.leader")
        assert leaders.count(True) == 1, leaders
        leader = windows[leaders.index(True)]
        browser.switch_to.window(leader)
        assert browser.execute_script("return window.fastpollDemo.poller.transport") == "stream"
        sent = [f"stream tab {i}" for i in range(1, 4)]
        for t in sent:
            publish(demo_stack, uid, t)
            time.sleep(0.3)
        for w in windows:
            browser.switch_to.window(w)
            WebDriverWait(browser, 5, 0.05).until(lambda d: shown(d) == sent)
        assert stream_metrics(demo_stack)[0] == 1

        browser.switch_to.window(leader)
        browser.close()
        windows.remove(leader)
        t0 = time.monotonic()
        while True not in on_each(browser, windows, "return window.fastpollDemo.poller.leader"):
            assert time.monotonic() - t0 < 3.0, "no tab took the lead over"
            time.sleep(0.05)
        # The closed tab's stream ends (the poll server sees the close), the new leader's opens.
        WebDriverWait(browser, 10, 0.05).until(lambda _: stream_metrics(demo_stack)[0] == 1)
        publish(demo_stack, uid, "after takeover")
        for w in windows:
            browser.switch_to.window(w)
            WebDriverWait(browser, 5, 0.05).until(lambda d: shown(d) == [*sent, "after takeover"])
        time.sleep(0.5)
        for w in windows:
            assert shown_in(browser, w) == [*sent, "after takeover"]  # none lost, none twice
        assert stream_metrics(demo_stack)[0] == 1
    finally:
        close_tabs(browser, windows, home)
