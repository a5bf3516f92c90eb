"""`qkv serve --model`: a client that sends a request that is not streamed and hangs up before the answer has its
request cancelled (the scheduler drops the sequence and frees its pages), as a stream's client is; a client that
stays gets the whole answer. Raw sockets on the real SmolLM2-135M-Instruct GGUF.

The prompt makes the model count, greedily, past the token budget: the client that stays shows that the same
request runs to `max_tokens` ("length"), so the one that hangs up is cut, not ended early by the model."""
import json
import socket
import time

import pytest

from test_serve_openai import raw, start_server, stop_server, wait_idle

N = 300
BODY = {"prompt": "1, 2, 3, 4, 5, 6, 7, 8, 9, 10,", "max_tokens": N, "temperature": 0}


@pytest.fixture(scope="module")
def server():
    p, port = start_server("--parallel", "2")
    yield port
    rc = stop_server(p)
    assert rc == 0, p.stderr.read()


def send_raw(port, path, body):
    """Sends one POST on a new socket and returns the socket, the answer unread."""
    data = json.dumps(body).encode()
    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(b"POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                 % (path.encode(), len(data)) + data)
    return sock


def test_a_client_that_stays_gets_the_whole_answer(server):
    status, body = raw(server, "POST", "/v1/completions", BODY, timeout=300)
    assert status == 200, body
    assert body["choices"][0]["finish_reason"] == "length" and body["usage"]["completion_tokens"] == N


@pytest.mark.parametrize("path, body", [("/v1/completions", BODY),
                                        ("/v1/chat/completions",
                                         {"messages": [{"role": "user", "content": "Count from 1 to 1000: " +
                                                        BODY["prompt"]}], "max_tokens": N, "temperature": 0})])
def test_a_client_hanging_up_before_a_non_streamed_answer_is_cancelled(server, path, body):
    before = wait_idle(server)["tokens_generated"]
    sock = send_raw(server, path, body)
    deadline = time.time() + 60
    while raw(server, "GET", "/health")[1]["tokens_generated"] - before < 4:  # it runs
        assert time.time() < deadline
        time.sleep(0.01)
    sock.close()  # hangs up without reading
    after = wait_idle(server)["tokens_generated"]
    assert after - before < N // 2, (before, after)  # cancelled within a few steps, not run to its end
    # The server goes on answering, and the connection that stays is unaffected.
    status, answer = raw(server, "POST", "/v1/completions", dict(BODY, max_tokens=3))
    assert status == 200 and answer["usage"]["completion_tokens"] == 3


def test_a_kept_alive_connection_is_watched_for_each_request(server):
    """Two requests one after the other on one connection: each finds the connection open and gets its answer."""
    short = dict(BODY, max_tokens=40)
    with socket.create_connection(("127.0.0.1", server), timeout=120) as sock:
        for _ in range(2):
            data = json.dumps(short).encode()
            sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\n\r\n" % len(data) + data)
            got = b""
            while b'"total_tokens"' not in got:
                chunk = sock.recv(65536)
                assert chunk, got
                got += chunk
            assert got.startswith(b"HTTP/1.1 200") and b'"completion_tokens": 40' in got, got
