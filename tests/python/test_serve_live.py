"""`qkv serve --model`'s live viewer on the real SmolLM2-135M-Instruct GGUF, over raw HTTP: GET / is the viewer page
(no outside URL); POST /viz/generate streams the prompt's maps, then per new token its attention row of every
layer x head (uint8: each head's row sums to 1 within the rounding) and its logit lens, then the end; its tokens and
text equal /v1/chat/completions' greedy reply to the same messages; errors are one JSON line; one generation at a
time (503 for a second), a client that hangs up frees it at once, and the OpenAI routes answer meanwhile; a stop
signal ends a live stream with an error event."""
import base64
import http.client
import json
import re
import signal
import socket
import time

import numpy as np
import pytest

from test_serve_openai import raw, start_server, stop_server

QUESTION = "What is the capital of France?"
STORY = "Write a long story about a dragon who learns to paint. Make it at least five paragraphs."
L, H = 30, 9  # SmolLM2-135M: layers, query heads
LEVELS = L + 1  # the logit lens: the embeddings, then each layer


@pytest.fixture(scope="module")
def server():
    p, port = start_server("--parallel", "2")
    yield port
    rc = stop_server(p)
    assert rc == 0, p.stderr.read()


def messages(text):
    return [{"role": "user", "content": text}]


def open_stream(port, body):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.request("POST", "/viz/generate", body=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    return conn, conn.getresponse()


def read_events(r, count=None):
    """The stream's `data:` events as JSON, all of them or the first `count`."""
    events, buf = [], b""
    while count is None or len(events) < count:
        chunk = r.read1(1 << 20)
        if not chunk:
            break
        buf += chunk
        while b"\n\n" in buf and (count is None or len(events) < count):
            event, buf = buf.split(b"\n\n", 1)
            assert event.startswith(b"data: ") and b"\n" not in event, event[:80]
            events.append(json.loads(event[6:]))
    return events


def generate(port, body):
    conn, r = open_stream(port, body)
    assert r.status == 200 and r.getheader("Content-Type").startswith("text/event-stream")
    events = read_events(r)
    conn.close()
    return events


def u8_rows(group):
    """A token's attention group (dtype u8, tq 1) as (L, H, Tk) floats."""
    assert group["dtype"] == "u8" and group["tq"] == 1
    data = np.frombuffer(base64.b64decode(group["data"]), dtype=np.uint8)
    return data.reshape(group["layers"], group["heads"], group["tk"]).astype(np.float64) / 255


def test_the_page_is_the_viewer_in_live_mode(server):
    for path in ("/", "/viz"):
        conn = http.client.HTTPConnection("127.0.0.1", server, timeout=30)
        conn.request("GET", path)
        r = conn.getresponse()
        page = r.read().decode()
        conn.close()
        assert r.status == 200 and r.getheader("Content-Type").startswith("text/html")
        assert '<meta name="generator" content="qkv attention viewer">' in page[:4096]
        assert '"live_llm"' in page and "/viz/generate" in page
        # Everything inline: no script, style, image or font from anywhere else.
        assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page)
        assert "@import" not in page and "url(http" not in page


def test_stream_shapes_rows_sum_to_one_and_tokens_equal_the_chat_reply(server):
    events = generate(server, {"messages": messages(QUESTION), "max_tokens": 12})
    first, tokens, done = events[0], events[1:-1], events[-1]
    assert first["event"] == "prompt" and done["event"] == "done"
    assert all(e["event"] == "token" for e in tokens) and tokens
    p = first["prompt_tokens"]
    page = first["page"]
    assert page["format"] == "qkv-attention-1" and page["prompt_tokens"] == p
    (prompt,) = page["snapshots"][0]["groups"]
    assert (prompt["name"], prompt["layers"], prompt["heads"], prompt["tq"], prompt["tk"]) == ("prompt", L, H, p, p)
    assert prompt["causal"] and len(prompt["q_tokens"]) == p and len(prompt["stats"]["entropy"]) == L * H
    lens = page["lens"]
    assert lens["positions"] == [p - 1] and lens["levels"] == LEVELS and len(lens["text_tokens"]) == p
    assert len(lens["ids"]) == LEVELS * lens["top"] == len(lens["probs"])

    keys = list(prompt["k_tokens"])
    for i, e in enumerate(tokens):
        assert (e["index"], e["position"]) == (i, p + i)
        keys.append(e["token"])
        a = e["attention"]
        assert (a["layers"], a["heads"], a["tq"], a["tk"]) == (L, H, 1, p + i + 1)
        assert a["k_tokens"] == keys and a["q_tokens"] == [e["token"]]
        w = u8_rows(a)
        # Each weight is rounded to 1/255: a row of Tk weights sums to 1 within Tk / 510.
        assert np.all(np.abs(w.sum(axis=2) - 1) <= a["tk"] / 510 + 1e-9), (i, np.abs(w.sum(axis=2) - 1).max())
        assert np.all(w.max(axis=2) > 0)
        assert e["lens"]["positions"] == [p + i] and e["lens"]["text_tokens"] == [e["token"]]
        assert len(e["lens"]["ids"]) == LEVELS * e["lens"]["top"]
    reply = [e for e in tokens if not e["stop"]]
    assert all(not e["stop"] for e in tokens[:-1])  # an end-of-turn token is only ever the last one
    assert done["usage"] == {"prompt_tokens": p, "completion_tokens": len(reply),
                             "total_tokens": p + len(reply)}
    text = "".join(e["text"] for e in tokens) + done["text"]

    # The same messages through the OpenAI route, greedy: the same tokens, text, finish and prompt length.
    status, chat = raw(server, "POST", "/v1/chat/completions",
                       {"messages": messages(QUESTION), "max_tokens": 12, "temperature": 0, "logprobs": True})
    assert status == 200, chat
    choice = chat["choices"][0]
    assert [t["id"] for t in choice["logprobs"]["content"]] == [e["id"] for e in reply]
    assert choice["message"]["content"] == text
    assert choice["finish_reason"] == done["finish_reason"]
    assert chat["usage"]["prompt_tokens"] == p
    if done["finish_reason"] == "stop":
        assert tokens[-1]["stop"] and tokens[-1]["text"] == ""
    else:
        assert len(reply) == 12


def test_errors_are_one_json_line_before_any_stream(server):
    long_text = "attention " * 400
    cases = [
        (b"{not json", 400, "invalid_request_error"),
        ({"max_tokens": 4}, 400, "invalid_request_error"),                              # no messages
        ({"messages": messages("hi"), "max_tokens": 0}, 400, "invalid_request_error"),
        ({"messages": messages("hi"), "max_tokens": 100000}, 400, "invalid_request_error"),
        ({"messages": messages("hi"), "lens_top": 99}, 400, "invalid_request_error"),
        ({"messages": messages("hi"), "temperature": 1}, 400, "invalid_request_error"),  # unknown field
        ({"messages": messages(long_text)}, 400, "invalid_request_error"),               # over 256 prompt tokens
        ({"messages": messages(long_text * 2)}, 400, "exceed_context_size_error"),       # over --ctx 512
    ]
    for body, status, kind in cases:
        conn = http.client.HTTPConnection("127.0.0.1", server, timeout=30)
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        conn.request("POST", "/viz/generate", body=data, headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        text = r.read().decode()
        conn.close()
        assert r.status == status, (body, r.status, text)
        assert r.getheader("Content-Type").startswith("application/json")
        assert "\n" not in text.strip(), text
        err = json.loads(text)["error"]
        assert err["type"] == kind and err["message"], (body, err)
    st, body = raw(server, "POST", "/viz/generate", {"messages": messages("hi"), "max_tokens": 0})
    assert "max_tokens" in body["error"]["message"]
    st, body = raw(server, "POST", "/viz/generate", {"messages": messages(long_text)})
    assert "256" in body["error"]["message"]


def test_one_generation_at_a_time_and_a_client_that_leaves_frees_it(server):
    conn, r = open_stream(server, {"messages": messages(STORY), "max_tokens": 128})
    assert r.status == 200
    t0 = time.time()
    head = read_events(r, 3)
    per_token = (time.time() - t0) / 3
    assert [e["event"] for e in head] == ["prompt", "token", "token"]
    # While it runs: a second generation is refused at once, the OpenAI routes answer.
    status, body = raw(server, "POST", "/viz/generate", {"messages": messages("hi"), "max_tokens": 1})
    assert status == 503 and body["error"]["type"] == "unavailable_error", body
    status, chat = raw(server, "POST", "/v1/chat/completions",
                       {"messages": messages(QUESTION), "max_tokens": 3, "temperature": 0})
    assert status == 200 and chat["usage"]["completion_tokens"] == 3
    # The client hangs up: its generation ends at the next write, long before its 128 tokens.
    conn.sock.shutdown(socket.SHUT_RDWR)
    conn.close()
    left = time.time()
    while True:
        conn2, r2 = open_stream(server, {"messages": messages("hi"), "max_tokens": 1})
        if r2.status == 200:
            events = read_events(r2)
            conn2.close()
            break
        assert r2.status == 503
        r2.read()
        conn2.close()
        assert time.time() - left < 3, "the generation of a client that left went on"
        time.sleep(0.05)
    assert [e["event"] for e in events][0] == "prompt" and events[-1]["event"] == "done"
    print(f"\nlive viewer: {per_token * 1000:.0f} ms an event at the start; slot free "
          f"{(time.time() - left) * 1000:.0f} ms after the hang-up")


def test_a_stop_signal_ends_a_live_stream_with_an_error_event():
    p, port = start_server("--parallel", "1")
    try:
        conn, r = open_stream(port, {"messages": messages(STORY), "max_tokens": 128})
        assert [e["event"] for e in read_events(r, 2)] == ["prompt", "token"]
        p.send_signal(signal.SIGTERM)
        rest = read_events(r)
        conn.close()
        assert rest and "error" in rest[-1] and all("error" not in e for e in rest[:-1]), rest[-1:]
        assert rest[-1]["error"]["type"] == "unavailable_error"
        assert len(rest) < 127  # cut, not run to its end
    finally:
        assert stop_server(p) == 0, p.stderr.read()
