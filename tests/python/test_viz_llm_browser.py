"""The language-model page of `qkv viz --model` (SmolLM2-135M-Instruct, about 1000 prompt tokens and a short reply)
in headless Chromium: small enough, ready fast, no network request, every one of the 30 x 9 maps reachable (the grid's
thumbnails, each sparse map decoded), the heatmap, the head table from the shipped statistics and the logit lens."""
import os
import subprocess

import pytest
from selenium.webdriver.common.by import By

import browser
from smollm2 import gguf_path
from test_cli_minilm import cli_path
from test_viewer_browser import open_page, shoot, view

SENTENCE = ("Attention lets every token look back at the ones before it. In a small language model, some heads follow "
            "the previous token, some copy names, and many put most of their weight on the first token: a sink.\n")


@pytest.fixture(scope="module")
def driver():
    d = browser.start()
    yield d
    d.quit()


@pytest.fixture(scope="module")
def long_page(tmp_path_factory):
    out = tmp_path_factory.mktemp("llm") / "long.html"
    text = SENTENCE * 24  # about 1000 tokens
    r = subprocess.run([cli_path(), "viz", "--model", str(gguf_path()), text, "--generate", "4", "--out", str(out)],
                       capture_output=True, text=True, timeout=300, env=dict(os.environ, OMP_NUM_THREADS="2"))
    assert r.returncode == 0, r.stderr
    return out


def test_smollm2_page_at_1000_tokens(driver, long_page):
    size = os.path.getsize(long_page)
    assert size < 16_000_000, size
    open_page(driver, long_page)
    ready = driver.execute_script("return window.qkvViewer.readyAt")
    tq = driver.execute_script("return window.qkvViewer.state && document.querySelectorAll('canvas.thumb').length")
    print(f"\nSmolLM2 page, {size / 1e6:.1f} MB: load + decode + draw in headless Chromium {ready:.0f} ms")
    assert tq == 270 and ready < 5000
    labels = [e.text for e in driver.find_elements(By.CSS_SELECTOR, "#grid .lab")]
    assert labels[:9] == [f"H{h}" for h in range(9)] and "L0" in labels and "L29" in labels
    shoot(driver, driver.find_element(By.ID, "grid"), "llm-grid")
    # every map decodes, each row with its largest weights (at 1000 tokens the weights under 1 % of a map's maximum
    # are left out unless among their row's 4 largest)
    empty = driver.execute_script("""
      const v = window.qkvViewer, g = v.group();
      let empty = 0;
      for (let l = 0; l < g.layers; ++l) for (let h = 0; h < g.heads; ++h) {
        const m = v.headMap(g, l, h);
        for (let i = 0; i < g.tq; i += 97) {
          let s = 0; for (let j = 0; j < g.tk; ++j) s += m[i * g.tk + j];
          if (!(s > 0)) ++empty;
        }
      }
      return empty;""")
    assert empty == 0
    view(driver, "heatmap")
    for l, h in ((0, 0), (29, 8)):
        driver.execute_script(f"window.qkvViewer.select({l}, {h}); window.qkvViewer.redraw()")
        assert driver.execute_script("return document.getElementById('heatmap').width") > 900
    shoot(driver, driver.find_element(By.ID, "heatmap"), "llm-heatmap")
    view(driver, "table")
    assert len(driver.find_elements(By.CSS_SELECTOR, "#head-table tbody tr")) == 270
    view(driver, "lens")
    rows = driver.find_elements(By.CSS_SELECTOR, "#lens-table tbody tr")
    assert len(rows) == 31 and rows[0].text.startswith("embeddings")
    shoot(driver, driver.find_element(By.ID, "lens-table"), "llm-lens")
    driver.find_element(By.ID, "group")  # the reply's maps are the second group
    assert driver.execute_script("return document.getElementById('group').options.length") == 2
    assert browser.console_errors(driver) == []
