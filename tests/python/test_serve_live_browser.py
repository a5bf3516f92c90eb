"""The live viewer page of `qkv serve --model` (SmolLM2-135M-Instruct) in headless Chromium: the page at GET /, a
prompt typed and run, the reply streaming into the page while the reply's 30 x 9 maps grow by a row and a column a
token, every map non-blank, the logit lens growing with it, labels in Chinese too, and no request to anything but the
server on 127.0.0.1."""
import time

import pytest
from selenium.webdriver.common.by import By

import browser
from test_serve_live import server  # noqa: F401 (the module's server fixture)
from test_viewer_browser import shoot, view

PROMPT = "Name three colours of the rainbow."


@pytest.fixture(scope="module")
def driver():
    d = browser.start(block_network=False)  # the page talks to its server; the test checks where it went
    yield d
    d.quit()


def test_live_page_streams_a_reply_and_its_maps_grow(server, driver):
    origin = f"http://127.0.0.1:{server}"
    browser.network_events(driver)
    driver.get(origin + "/")
    t0 = time.time()
    while not driver.execute_script("return !!(window.qkvViewer && window.qkvViewer.ready)"):
        assert time.time() - t0 < 30, "the viewer did not get ready"
        time.sleep(0.05)
    assert driver.find_element(By.ID, "live").is_displayed()
    assert driver.find_element(By.ID, "live-max").is_displayed()
    assert not driver.find_element(By.ID, "live-second").is_displayed()
    box = driver.find_element(By.ID, "live-text")
    box.clear()
    box.send_keys(PROMPT)
    n = driver.find_element(By.ID, "live-max")
    n.clear()
    n.send_keys("16")
    driver.find_element(By.ID, "live-run").click()

    # Poll while it streams: the reply group's rows (tq) and keys (tk) as they grow.
    seen, t0 = [], time.time()
    while True:
        s = driver.execute_script("""
          const v = window.qkvViewer, live = v.live;
          if (!live || !live.events) return null;  // no page data before the first event
          const g = v.group();
          return [live.tokens, live.done, g.name, g.tq, g.tk, document.querySelectorAll('canvas.thumb').length,
                  document.getElementById('status').className];""")
        assert s is None or s[6] != "error", driver.find_element(By.ID, "status").text
        if s:
            seen.append(tuple(s[:6]))
            if s[1]:
                break
        assert time.time() - t0 < 40, seen[-3:]
        time.sleep(0.03)
    tokens, _, name, tq, tk, thumbs = seen[-1]
    assert name == "reply" and tokens >= 2 and tq == tokens and thumbs == 270
    prompt_tk = tk - tq
    growing = sorted({(s[3], s[4]) for s in seen if s[2] == "reply"})
    assert len(growing) >= 2, seen  # seen at two sizes at least while it streamed
    assert all(k == prompt_tk + q for q, k in growing)
    reply = driver.find_element(By.ID, "live-reply").text
    assert reply.strip(), "no reply text"
    assert driver.execute_script("return document.getElementById('status').dataset.runs") == "1"

    # Every map of the reply has weight in every row; the grid is drawn, not blank.
    empty = driver.execute_script("""
      const v = window.qkvViewer, g = v.group();
      let empty = 0;
      for (let l = 0; l < g.layers; ++l) for (let h = 0; h < g.heads; ++h) {
        const m = v.headMap(g, l, h);
        for (let i = 0; i < g.tq; ++i) { let s = 0; for (let j = 0; j < g.tk; ++j) s += m[i * g.tk + j]; if (!(s > 0.9)) ++empty; }
      }
      return empty;""")
    assert empty == 0
    shoot(driver, driver.find_element(By.ID, "grid"), "live-grid")
    view(driver, "heatmap")
    assert driver.execute_script("return document.getElementById('heatmap').width") > 100
    shoot(driver, driver.find_element(By.ID, "heatmap"), "live-heatmap")
    view(driver, "table")
    assert len(driver.find_elements(By.CSS_SELECTOR, "#head-table tbody tr")) == 270
    view(driver, "lens")
    assert len(driver.find_elements(By.CSS_SELECTOR, "#lens-table tbody tr")) == 31
    positions = driver.execute_script("return document.getElementById('lens-pos').options.length")
    assert positions == 1 + tokens  # the prompt's last position, then each token's
    # The prompt's maps are the first group.
    assert driver.execute_script("return document.getElementById('group').options.length") == 2

    driver.find_element(By.ID, "lang").click()
    assert driver.find_element(By.ID, "live-run").text == "运行"
    assert driver.find_element(By.CSS_SELECTOR, "#live-reply-box b").text == "回复"
    driver.find_element(By.ID, "lang").click()

    requested, _ = browser.network_events(driver)
    requested = [u for u in requested if not u.startswith("data:")]
    assert requested and all(u.startswith(origin + "/") for u in requested), requested
    assert browser.console_errors(driver) == []
