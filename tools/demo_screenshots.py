"""Screenshots of the browser client's demo page (client/demo.html) for the README: a local
stack (as tests/test_browser.py starts it), one user's page reading two rooms, a few messages
published through the app's API, then headless Chromium (Debian's chromium + chromium-driver,
Selenium) saves the page at 1000x700: a room open and connected, then the other room open
(its "how to send" too) and offline (DevTools network emulation). The PNGs are reduced to a
palette to stay small.

    PYTHONPATH=testkit:fallback_app .venv/bin/python tools/demo_screenshots.py [OUT_DIR]

OUT_DIR defaults to docs/img; it writes demo-chat.png and demo-offline.png there."""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import quote

from PIL import Image
from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from fastpoll_testkit.stack import Stack, free_port

ROOT = Path(__file__).resolve().parents[1]
SIZE = (1000, 700)
USER = 4201
ROOMS = ["room.general", "room.launch"]
# (room or None for the user's own, text), published in this order.
SCRIPT = [
    ("room.general", "Morning! The new poll servers are on staging."),
    ("room.general", "Held polls are answered a few ms after a publish now."),
    (None, "Your export of last week's report is ready."),
    ("room.general", "Nice. p99 on the bench box is 3 ms, from memcached."),
    ("room.launch", "Launch checklist updated: step 4 is the nginx reload."),
    ("room.general", "I'll restart one poll server to show the page carries on."),
    ("room.launch", "Go/no-go at 15:00."),
    ("room.general", "Done: nothing missed, nothing twice."),
]


def shrink(path: Path) -> None:
    """The screenshot as a 128-colour palette PNG (the flat colours survive it, the
    connection's small dot too)."""
    with Image.open(path) as img:
        small = img.convert("RGB").quantize(colors=128, method=Image.Quantize.FASTOCTREE)
    small.save(path, optimize=True)


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    run_dir = Path(tempfile.mkdtemp(prefix="fastpoll-shots-"))
    redis_port = free_port()
    stack = Stack(
        run_dir=run_dir,
        backend="memcached",
        n_pollers=1,
        redis_port=redis_port,
        extra_ini={
            "announce": {
                "server": f"127.0.0.1:{redis_port}",
                "password_file": str(run_dir / "redis.pass"),
            }
        },
    )
    opts = Options()
    opts.binary_location = shutil.which("chromium") or ""
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--no-first-run", "--disable-extensions", "--hide-scrollbars",
                f"--window-size={SIZE[0]},{SIZE[1]}"):  # fmt: skip
        opts.add_argument(arg)
    driver = None
    try:
        stack.start()
        with stack.api() as api:
            r = api.post("/api/poll-url", json={"user_id": USER, "channels": ROOMS})
            r.raise_for_status()
            url = r.json()["url"]
        driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=opts)
        driver.execute_cdp_cmd(
            "Emulation.setDeviceMetricsOverride",
            {"width": SIZE[0], "height": SIZE[1], "deviceScaleFactor": 1, "mobile": False},
        )
        driver.get(f"{stack.base_url}/fastpoll-client/demo.html?url={quote(url, safe='')}")
        WebDriverWait(driver, 15, 0.1).until(
            lambda d: d.execute_script("return window.fastpollDemo?.stats.answers") >= 1
        )
        with stack.api() as api:
            for room, text in SCRIPT:
                if room is None:
                    r = api.post("/api/messages", json={"user_id": USER, "text": text})
                else:
                    r = api.post(f"/api/channels/{room}/messages", json={"text": text})
                r.raise_for_status()
                time.sleep(0.4)
        WebDriverWait(driver, 10, 0.1).until(
            lambda d: (
                d.execute_script("return document.querySelectorAll('.thread li').length")
                == len(SCRIPT)
            )
        )
        time.sleep(1.0)  # the newest message's highlight fades
        chat = out / "demo-chat.png"
        driver.save_screenshot(str(chat))
        # The second: the other room opened (its badge clears), its "how to send" open, offline.
        launch = '[data-conv="room:room.launch"]'
        driver.find_element(By.CSS_SELECTOR, f"button{launch}").click()
        driver.find_element(By.CSS_SELECTOR, f"section{launch} .howto summary").click()
        driver.execute_cdp_cmd("Network.enable", {})
        driver.execute_cdp_cmd(
            "Network.emulateNetworkConditions",
            {"offline": True, "latency": 0, "downloadThroughput": -1, "uploadThroughput": -1},
        )
        WebDriverWait(driver, 10, 0.1).until(
            lambda d: (
                d.execute_script("return document.getElementById('connection').dataset.state")
                == "offline"
            )
        )
        time.sleep(1.0)  # the room's new messages are highlighted when it opens: it fades
        offline = out / "demo-offline.png"
        driver.save_screenshot(str(offline))
        for p in (chat, offline):
            shrink(p)
            print(f"{p}: {Image.open(p).size}, {p.stat().st_size} bytes")
    finally:
        if driver is not None:
            driver.quit()
        stack.stop()
        shutil.rmtree(run_dir, ignore_errors=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "docs" / "img")
