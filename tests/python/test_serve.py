"""`qkv serve` with the real all-MiniLM-L6-v2 on a free loopback port: the page draws, a typed sentence re-runs the
model and redraws, a clicked token is masked and re-run, bad and oversized requests get 4xx with a message, the
server survives them, and SIGTERM stops it."""
import json
import os
import re
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request

import numpy as np
import pytest
from selenium.webdriver.common.by import By

import browser
import minilm_corpus as corpus
import qkv
from test_cli_minilm import cli_path


@pytest.fixture(scope="module")
def server():
    p = subprocess.Popen([cli_path(), "serve", "--model", corpus.model_dir(), "--port", "0", "--max-tokens", "64"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=dict(os.environ, OMP_NUM_THREADS="2"))
    line = p.stdout.readline()
    m = re.search(r"http://127\.0\.0\.1:(\d+)/", line)
    assert m, (line, p.poll(), p.stderr.read() if p.poll() is not None else "")
    yield p, int(m.group(1))
    if p.poll() is None:
        p.kill()
        p.wait()


def post(port, body, raw=False):
    data = body if raw else json.dumps(body).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/api/attention", data=data, method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_listens_on_loopback_only(server):
    _, port = server
    with socket.create_connection(("127.0.0.1", port), timeout=5):
        pass
    # the listening sockets on this port, from the kernel's table: local address 0100007F is 127.0.0.1
    listening = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for row in f.read().splitlines()[1:]:
                local, state = row.split()[1], row.split()[3]
                addr, hexport = local.split(":")
                if int(hexport, 16) == port and state == "0A":
                    listening.append(addr)
    assert listening == ["0100007F"], listening


def test_post_returns_the_python_api_weights(server):
    _, port = server
    status, data = post(port, {"text": "Paris is the capital of France.", "mask": [2]})
    assert status == 200, data
    g = data["snapshots"][0]["groups"][0]
    tokens, att = qkv.SentenceEncoder(corpus.model_dir()).attentions("Paris is the capital of France.", mask=[2])
    assert g["q_tokens"] == tokens and tokens[2] == "[MASK]"
    import base64
    w = np.frombuffer(base64.b64decode(g["data"]), dtype="<f2").astype(np.float32).reshape(6, 12, len(tokens), len(tokens))
    np.testing.assert_allclose(w, np.concatenate(att, 0), rtol=0, atol=2.0 ** -12 + 1e-6)


@pytest.mark.parametrize("body,status,message", [
    (b"{not json", 400, "not JSON"),
    ({"txt": "x"}, 400, "unknown field 'txt'"),
    ({"text": 3}, 400, "'text' must be a string"),
    ({"text": "   "}, 400, "'text' is empty"),
    ({"text": "hi", "mask": [99]}, 400, "mask position 99 is outside [0, 3)"),
    ({"text": "hi", "mask": "1"}, 400, "'mask' must be an array"),
    ({"text": "word " * 100}, 413, "102 tokens, more than the limit of 64"),
    ({"text": "x" * 3000}, 413, "more than 2000 bytes"),
    (b"{\"text\": \"" + b"a" * 20000 + b"\"}", 413, "too large"),
])
def test_bad_requests_get_4xx_with_a_message(server, body, status, message):
    p, port = server
    got, data = post(port, body, raw=isinstance(body, bytes))
    assert got == status and message in data["error"], (got, data)
    assert p.poll() is None, "the server must survive a bad request"


def test_unknown_path_is_404(server):
    _, port = server
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/nothing", timeout=10)
        raise AssertionError("expected 404")
    except urllib.error.HTTPError as e:
        assert e.code == 404 and "not found" in json.loads(e.read())["error"]


def test_page_redraws_on_a_new_sentence_and_masks_a_clicked_token(server):
    p, port = server
    d = browser.start(block_network=False)
    try:
        d.get(f"http://127.0.0.1:{port}/")
        t0 = time.time()
        while not d.execute_script("return !!(window.qkvViewer && window.qkvViewer.ready)"):
            assert time.time() - t0 < 30
            time.sleep(0.05)
        assert len(d.find_elements(By.CSS_SELECTOR, "canvas.thumb")) == 72
        before = d.execute_script("return document.querySelector('canvas.thumb').toDataURL()")
        box = d.find_element(By.ID, "live-text")
        box.clear()
        box.send_keys("Dogs chase cats in the garden.")
        d.find_element(By.ID, "live-run").click()
        wait_runs(d, 1)
        toks = [e.text for e in d.find_elements(By.CSS_SELECTOR, "#tokens .tok")]
        assert toks == ["[CLS]", "dogs", "chase", "cats", "in", "the", "garden", ".", "[SEP]"]
        assert len(d.find_elements(By.CSS_SELECTOR, "canvas.thumb")) == 72
        assert d.execute_script("return document.querySelector('canvas.thumb').toDataURL()") != before
        d.find_elements(By.CSS_SELECTOR, "#tokens .tok")[3].click()
        wait_runs(d, 2)
        toks = [e.text for e in d.find_elements(By.CSS_SELECTOR, "#tokens .tok")]
        assert toks[3] == "[MASK]" and "masked" in d.find_elements(By.CSS_SELECTOR, "#tokens .tok")[3].get_attribute("class")
        origins = d.execute_script("return performance.getEntriesByType('resource').map(e => new URL(e.name).origin)")
        assert set(origins) <= {f"http://127.0.0.1:{port}"}, origins
        shoot = d.find_element(By.TAG_NAME, "body").screenshot_as_png
        assert browser.distinct_colours(d, shoot)[2] > 20
        out = os.environ.get("QKV_VIEWER_SHOTS")
        if out:
            with open(os.path.join(out, "viewer-serve.png"), "wb") as f:
                f.write(shoot)
        assert browser.console_errors(d) == []
    finally:
        d.quit()
    assert p.poll() is None


def wait_runs(d, n):
    t0 = time.time()
    while d.execute_script("return +(document.getElementById('status').dataset.runs || 0)") < n:
        assert time.time() - t0 < 60, d.find_element(By.ID, "status").text
        time.sleep(0.05)


def test_sigterm_stops_the_server(server):
    p, port = server
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=20) == 0
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=2)


def test_serve_a_training_run(tmp_path):
    """--run: the attention of a `qkv train` run (target x source) for each posted input; masks and pairs refused."""
    run = tmp_path / "run"
    r = subprocess.run([cli_path(), "train", "--model", "rnn-attn", "--task", "reverse", "--min-len", "4", "--max-len", "6",
                        "--train-size", "200", "--test-size", "10", "--hidden", "16", "--d-model", "8", "--steps", "20",
                        "--eval-every", "20", "--eval-size", "5", "--seed", "1", "--out", str(run)],
                       capture_output=True, text=True, timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert r.returncode == 0, r.stderr
    bad = subprocess.run([cli_path(), "serve", "--run", str(run)], capture_output=True, text=True, timeout=60)
    assert bad.returncode != 0 and "--run needs --text" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1
    p = subprocess.Popen([cli_path(), "serve", "--run", str(run), "--text", "1234", "--port", "0"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        m = re.search(r"http://127\.0\.0\.1:(\d+)/", p.stdout.readline())
        assert m, p.stderr.read() if p.poll() is not None else "no address printed"
        port = int(m.group(1))
        status, data = post(port, {"text": "98765"})
        assert status == 200, data
        (g,) = data["snapshots"][0]["groups"]
        assert g["kind"] == "cross" and g["k_tokens"][:5] == list("98765") and g["q_tokens"][-1] == "<eos>"
        assert data["live"]["maskable"] is False
        assert post(port, {"text": "98765", "mask": [1]})[0] == 400
        assert post(port, {"text": "98765", "second": "1"})[0] == 400
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=10) as page:
            assert b"qkv-attention-1" in page.read()
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=20) == 0
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
