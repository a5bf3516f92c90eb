"""`qkv serve` with the real all-MiniLM-L6-v2 on a free loopback port: the page draws, a typed sentence re-runs the
model and redraws, a clicked token is masked and re-run, bad and oversized requests get 4xx with a message, the
server survives them, and SIGTERM stops it. The server refuses a port in use, foreign Host names and cross-origin
POSTs, answers promptly beside idle connections, and holds its body limit for every Content-Type."""
import http.client
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


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
    run = tmp_path_factory.mktemp("serve-run") / "run"
    r = subprocess.run([cli_path(), "train", "--model", "rnn-attn", "--task", "reverse", "--min-len", "4", "--max-len", "6",
                        "--train-size", "200", "--test-size", "10", "--hidden", "16", "--d-model", "8", "--steps", "20",
                        "--eval-every", "20", "--eval-size", "5", "--seed", "1", "--out", str(run)],
                       capture_output=True, text=True, timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert r.returncode == 0, r.stderr
    return run


def start_server(*args):
    """A `qkv serve` on a free port: (process, port, the line it printed)."""
    p = subprocess.Popen([cli_path(), "serve", *args, "--port", "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env=dict(os.environ, OMP_NUM_THREADS="2"))
    line = p.stdout.readline()
    m = re.search(r"http://127\.0\.0\.1:(\d+)/", line)
    if not m:
        p.kill()
        raise AssertionError((line, p.wait(), p.stderr.read()))
    return p, int(m.group(1)), line


def stop(p):
    if p.poll() is None:
        p.kill()
        p.wait()


def test_serve_a_training_run(trained_run):
    """--run: the attention of a `qkv train` run (target x source) for each posted input; masks and pairs refused."""
    run = trained_run
    bad = subprocess.run([cli_path(), "serve", "--run", str(run)], capture_output=True, text=True, timeout=60)
    assert bad.returncode != 0 and "--run needs --text" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1
    p, port, _ = start_server("--run", str(run), "--text", "1234")
    try:
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
        stop(p)


def test_characters_outside_a_runs_vocabulary_are_named_and_strict_refuses_them(trained_run, tmp_path):
    """viz --run and serve --run turned characters the run never saw into <unk> without a word."""
    out = tmp_path / "p.html"
    r = subprocess.run([cli_path(), "viz", "--run", str(trained_run), "--input", "12ab", "--out", str(out)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    warn = [line for line in r.stderr.splitlines() if "vocabulary" in line]
    assert len(warn) == 1 and "'a'" in warn[0] and "'b'" in warn[0] and "<unk>" in warn[0], r.stderr
    r = subprocess.run([cli_path(), "viz", "--run", str(trained_run), "--input", "12ab", "--strict", "--out",
                        str(tmp_path / "q.html")], capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and len(r.stderr.strip().splitlines()) == 1 and "'a'" in r.stderr, r.stderr
    p, port, _ = start_server("--run", str(trained_run), "--text", "1234")
    try:
        status, data = post(port, {"text": "12ab"})
        assert status == 200 and "'a'" in data["note"] and "<unk>" in data["note"], data
        status, data = post(port, {"text": "1234"})
        assert status == 200 and "note" not in data, data
    finally:
        stop(p)
    p, port, _ = start_server("--run", str(trained_run), "--text", "1234", "--strict")
    try:
        status, data = post(port, {"text": "12ab"})
        assert status == 400 and "vocabulary" in data["error"], data
    finally:
        stop(p)


def test_serve_run_prints_the_run_it_serves(trained_run):
    """`serve --run` said "serving  on": the name came from --model, empty with --run."""
    p, _, line = start_server("--run", str(trained_run), "--text", "1234")
    stop(p)
    assert line.startswith(f"serving {trained_run} on http://127.0.0.1:"), line


def test_second_server_on_a_port_in_use_is_refused(server):
    """cpp-httplib binds with SO_REUSEPORT by default, so a second server shared the port without a word."""
    _, port = server
    t0 = time.time()
    r = subprocess.run([cli_path(), "serve", "--model", corpus.model_dir(), "--port", str(port)], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode != 0 and r.stdout == "", (r.returncode, r.stdout)
    assert len(r.stderr.strip().splitlines()) == 1 and f"127.0.0.1:{port} is already in use" in r.stderr, r.stderr
    assert time.time() - t0 < 5, "the port is taken before the model loads"


def request(port, method, path, headers, body=None):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        c.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
        for k, v in headers.items():
            c.putheader(k, v)
        if body is not None:
            c.putheader("Content-Length", str(len(body)))
        c.endheaders(body)
        r = c.getresponse()
        return r.status, r.read()
    finally:
        c.close()


@pytest.mark.parametrize("host,status", [
    ("evil.example", 403), ("evil.example:{port}", 403), ("127.0.0.1.evil.example", 403), ("localhost.", 403),
    ("[::2]:{port}", 403), ("localhost:{port}", 200), ("LOCALHOST", 200), ("127.0.0.1:{port}", 200),
    ("[::1]:{port}", 200), ("127.0.0.1:9", 200),
])
def test_foreign_host_is_refused(server, host, status):
    """DNS rebinding: a page of evil.example whose name now points to 127.0.0.1 sends Host: evil.example."""
    _, port = server
    got, body = request(port, "GET", "/", {"Host": host.format(port=port)})
    assert got == status, (got, body[:200])
    if status == 403:
        err = json.loads(body)["error"]
        assert "is not a loopback name" in err and "\n" not in err


@pytest.mark.parametrize("origin,status", [
    ("http://evil.example", 403), ("null", 403), ("http://127.0.0.1:1", 403), ("https://127.0.0.1:{port}", 403),
    ("http://127.0.0.1:{port}", 200), (None, 200),
])
def test_foreign_origin_post_is_refused(server, origin, status):
    """CSRF: any page the user visits can POST to 127.0.0.1; the browser names that page in Origin."""
    _, port = server
    headers = {"Host": f"127.0.0.1:{port}", "Content-Type": "text/plain"}
    if origin:
        headers["Origin"] = origin.format(port=port)
    got, body = request(port, "POST", "/api/attention", headers, json.dumps({"text": "hi"}).encode())
    assert got == status, (got, body[:200])
    if status == 403:
        assert "refused: a POST from origin" in json.loads(body)["error"]


def test_idle_half_open_connections_do_not_delay_a_request(server):
    """16 connections that send nothing or half a request held all 8 of the library's workers: a page took 29.5 s."""
    _, port = server
    idle = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(16)]
    try:
        for c in idle[::2]:
            c.sendall(b"POST /api/attention HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Le")
        time.sleep(0.2)
        t0 = time.time()
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=60) as r:
            assert r.status == 200
        assert time.time() - t0 < 1.5, f"GET / took {time.time() - t0:.1f} s beside 16 idle connections"
    finally:
        for c in idle:
            c.close()


def read_until_closed(s, first):
    """The rest of an answer whose server closes the connection (Connection: close): headers and body may come in
    separate segments."""
    data = first
    while len(data) < 65536:
        chunk = s.recv(4096)
        if not chunk:
            break
        data += chunk
    return data


def test_oversized_content_length_is_refused_at_once(server):
    """The library read and dropped Content-Length bytes before its 413, so an absurd one waited for the timeout."""
    _, port = server
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        t0 = time.time()
        s.sendall(b"POST /api/attention HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 100000000000\r\n\r\n{\"text\": ")
        head = s.recv(4096)
        assert time.time() - t0 < 1.0
        head = read_until_closed(s, head)
    assert head.startswith(b"HTTP/1.1 413") and b"too large" in head, head[:300]
    # curl asks first with "Expect: 100-continue" (bodies over 1 MB): refused without a "100 Continue"
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(b"POST /api/attention HTTP/1.1\r\nHost: 127.0.0.1\r\nExpect: 100-continue\r\n"
                  b"Content-Length: 2000000\r\n\r\n")
        head = read_until_closed(s, s.recv(4096))
    assert head.startswith(b"HTTP/1.1 413") and b"too large" in head, head[:300]


@pytest.mark.parametrize("content_type", ["application/x-www-form-urlencoded", "text/plain", "application/json"])
def test_body_limit_is_16_kB_for_every_content_type(server, content_type):
    """`curl -d` sends a form-encoded body, which the library capped at its own 8 kB before our 16 kB."""
    _, port = server
    headers = {"Host": f"127.0.0.1:{port}", "Content-Type": content_type}
    body = b'{"text": "hi"' + b" " * (12 * 1024) + b"}"
    got, data = request(port, "POST", "/api/attention", headers, body)
    assert got == 200, data[:300]
    got, data = request(port, "POST", "/api/attention", headers, body + b" " * (5 * 1024))
    assert got == 413 and "more than 16384 bytes" in json.loads(data)["error"]


def test_multipart_form_is_refused_with_a_message(server):
    _, port = server
    body = b'--b\r\nContent-Disposition: form-data; name="text"\r\n\r\nhi\r\n--b--\r\n'
    got, data = request(port, "POST", "/api/attention",
                        {"Host": f"127.0.0.1:{port}", "Content-Type": "multipart/form-data; boundary=b"}, body)
    assert got == 415 and "send the request as JSON" in json.loads(data)["error"]


@pytest.fixture(scope="module")
def wide_server():
    """A server whose --max-tokens (300) passes the model's max_seq_length (256), first text holding "<!--<script>"."""
    p, port, _ = start_server("--model", corpus.model_dir(), "--max-tokens", "300", "--text", COMMENT_SCRIPT)
    yield p, port
    stop(p)


COMMENT_SCRIPT = "a <!--<script> b </script> c & d \u2028 e"


def test_serve_text_with_comment_script_keeps_the_page_data_intact(wide_server):
    """`serve --text '<!--<script>'`: the page data element escaped "</" only, and "<!--<script>" in it hid the rest
    of the page from the HTML parser (a blank page)."""
    _, port = wide_server
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=30) as r:
        html = r.read().decode()
    text = html.split('<script id="qkv-data" type="application/json">', 1)[1].split("</script>", 1)[0]
    assert not set(text) & set("<>&\u2028\u2029")
    assert json.loads(text)["live"]["text"] == COMMENT_SCRIPT


def test_serve_notes_a_text_cut_to_max_seq_length(wide_server):
    """300 tokens pass --max-tokens 300, and the model reads 256 of them: the answer says so."""
    _, port = wide_server
    status, data = post(port, {"text": "word " * 290})
    assert status == 200, data
    assert data["snapshots"][0]["groups"][0]["tq"] == 256
    assert "292 tokens" in data["note"] and "only the first 256" in data["note"]
    status, data = post(port, {"text": "word " * 10})
    assert status == 200 and "note" not in data


def test_sigterm_stops_the_server(server):
    # last: it ends the module's server
    p, port = server
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=20) == 0
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=2)
