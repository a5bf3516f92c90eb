"""Headless Debian Chromium for the viewer tests, driven by Selenium with /usr/bin/chromedriver (no browser is
downloaded). Every request that is not file: (or data:) is blocked through CDP, and console errors are collected."""
import base64

from selenium import webdriver
from selenium.webdriver.chrome.service import Service

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
BLOCKED = ["http://*", "https://*", "ws://*", "wss://*", "ftp://*"]


def start(block_network=True, width=1400, height=1000):
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
              "--disable-background-networking", "--disable-component-update", "--disable-sync",
              "--disable-default-apps", "--disable-extensions", f"--window-size={width},{height}",
              "--force-device-scale-factor=1", "--lang=en-US"):
        opts.add_argument(a)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})  # performance: CDP events
    driver = webdriver.Chrome(options=opts, service=Service(CHROMEDRIVER))
    driver.set_page_load_timeout(60)
    driver.set_script_timeout(60)
    if block_network:
        driver.execute_cdp_cmd("Network.enable", {})
        driver.execute_cdp_cmd("Network.setBlockedURLs", {"urls": BLOCKED})
    return driver


def console_errors(driver):
    return [e for e in driver.get_log("browser") if e.get("level") == "SEVERE"]


def network_events(driver):
    """(requested URLs, URLs that failed as blocked) since the last call, from the CDP Network events."""
    import json

    requested, blocked, ids = [], [], {}
    for entry in driver.get_log("performance"):
        m = json.loads(entry["message"])["message"]
        p = m.get("params", {})
        if m.get("method") == "Network.requestWillBeSent":
            requested.append(p["request"]["url"])
            ids[p["requestId"]] = p["request"]["url"]
        elif m.get("method") == "Network.loadingFailed" and p.get("blockedReason"):
            blocked.append(ids.get(p["requestId"], "?"))
    return requested, blocked


def local_only(urls):
    return [u for u in urls if not (u.startswith("file:") or u.startswith("data:"))]


COUNT_COLOURS = """
const [b64, done] = arguments;
const img = new Image();
img.onload = () => {
  const c = document.createElement("canvas"); c.width = img.width; c.height = img.height;
  const ctx = c.getContext("2d"); ctx.drawImage(img, 0, 0);
  const px = ctx.getImageData(0, 0, c.width, c.height).data, seen = new Set();
  for (let i = 0; i < px.length; i += 4) seen.add((px[i] << 16) | (px[i + 1] << 8) | px[i + 2]);
  done([c.width, c.height, seen.size]);
};
img.onerror = () => done([0, 0, 0]);
img.src = "data:image/png;base64," + b64;
"""


def distinct_colours(driver, png):
    """(width, height, number of different RGB colours) of a PNG, decoded by the browser itself."""
    return tuple(driver.execute_async_script(COUNT_COLOURS, base64.b64encode(png).decode("ascii")))


def data_url_png(url):
    assert url.startswith("data:image/png;base64,"), url[:40]
    return base64.b64decode(url.split(",", 1)[1])
