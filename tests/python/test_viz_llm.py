"""`qkv viz --model` on a language model (SmolLM2-135M-Instruct, the GGUF as stored): the page holds every layer x
head map of the prompt and of the greedy reply (30 x 9), the tokens as the tokenizer cut them shown readably, per-head
statistics, and a logit lens whose last layer predicts the model's greedy next token; the sparse maps decode to the
model's own probabilities. qkv.viz writes its page data through the same library function."""
import base64
import json
import os
import re
import subprocess

import numpy as np
import pytest

import qkv
from smollm2 import gguf_path
from test_cli_minilm import cli_path

TEXT = "The quick brown fox\njumps over the lazy dog. Where does it go?"


def page_data(path):
    html = open(path, encoding="utf-8").read()
    m = re.search(r'<script id="qkv-data" type="application/json">(.*?)</script>', html, re.S)
    return html, json.loads(m.group(1))


def decode_sparse(g, m):
    """The page's sparse map m (see web/viewer.html decodeSparse) as a (Tq, Tk) array."""
    b, out, p = base64.b64decode(g["maps"][m]), np.zeros((g["tq"], g["tk"]), np.float32), 0
    scale = 0.0

    def varint():
        nonlocal p
        v, shift = 0, 0
        while True:
            c = b[p]
            p += 1
            v |= (c & 127) << shift
            shift += 7
            if not c & 128:
                return v

    for i in range(g["tq"]):
        j, n = -1, varint()
        if n:
            scale = float(np.frombuffer(b[p:p + 2], "<f2")[0]) / 255
            p += 2
        for _ in range(n):
            j += varint() + 1
            out[i, j] = b[p] * scale
            p += 1
    assert p == len(b)
    return out


@pytest.fixture(scope="module")
def model():
    return qkv.CausalLM.from_pretrained(gguf_path())


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    out = tmp_path_factory.mktemp("llm") / "page.html"
    r = subprocess.run([cli_path(), "viz", "--model", str(gguf_path()), TEXT, "--generate", "5", "--out", str(out)],
                       capture_output=True, text=True, timeout=300, env=dict(os.environ, OMP_NUM_THREADS="2"))
    assert r.returncode == 0, r.stderr
    return page_data(out)[1]


def test_page_holds_every_layer_and_head_of_prompt_and_reply(page, model):
    tok = qkv.Tokenizer.from_pretrained(gguf_path())
    ids = tok.encode(TEXT)
    prompt, reply = page["snapshots"][0]["groups"]
    assert (prompt["name"], prompt["layers"], prompt["heads"], prompt["tq"], prompt["tk"]) == ("prompt", 30, 9, len(ids), len(ids))
    assert reply["name"] == "reply" and reply["tk"] == len(ids) + reply["tq"] and 1 <= reply["tq"] <= 5
    assert len(prompt["stats"]["entropy"]) == 270 and len(prompt["stats"]["first"]) == 270
    # byte-level BPE tokens shown readably: spaces as ␣, the newline visible, no Ġ / Ċ
    assert "␣quick" in prompt["q_tokens"] and any("↵" in t for t in prompt["q_tokens"])
    assert not any("Ġ" in t or "Ċ" in t for t in prompt["q_tokens"])
    assert reply["k_tokens"][: len(ids)] == prompt["q_tokens"]
    # the greedy reply is the model's
    new = model.generate(ids, reply["tq"], eos_token_id=-1).tolist()
    lens = page["lens"]
    assert [lens["token_ids"][lens["ids"][((len(ids) - 1 + k - lens["positions"][0]) * 31 + 30) * 5]]
            for k in range(reply["tq"])] == new


def test_logit_lens_last_layer_is_the_greedy_next_token(page, model):
    lens = page["lens"]
    tok = qkv.Tokenizer.from_pretrained(gguf_path())
    ids = tok.encode(TEXT)
    all_ids = ids + [None] * page["snapshots"][0]["groups"][1]["tq"]
    assert lens["levels"] == 31 and lens["top"] == 5 and lens["positions"][-1] == len(all_ids) - 1
    logits = model.logits(ids)
    at = len(ids) - 1 - lens["positions"][0]
    top = lens["ids"][(at * 31 + 30) * 5: (at * 31 + 31) * 5]
    assert lens["token_ids"][top[0]] == int(np.argmax(logits[-1]))
    probs = lens["probs"][(at * 31 + 30) * 5: (at * 31 + 31) * 5]
    assert probs == sorted(probs, reverse=True) and 0 < probs[0] <= 1


def test_sparse_maps_are_the_models_probabilities(page, model, tmp_path):
    tok = qkv.Tokenizer.from_pretrained(gguf_path())
    ids = tok.encode(TEXT)
    out = model(ids, output_attentions=True)
    g = page["snapshots"][0]["groups"][0]
    g = dict(g) if g["dtype"] == "u8s" else None
    # a short prompt's page is dense float16: write the same maps as sparse through qkv.viz (the library's writer)
    att = [a[None] for a in out.attentions]
    path = qkv.viz.write_html(tmp_path / "s.html", [str(i) for i in ids], att, causal=True, dtype="sparse")
    (s,) = page_data(path)[1]["snapshots"][0]["groups"]
    assert s["dtype"] == "u8s" and s["thumb_rows"] == min(48, len(ids)) and len(s["maps"]) == 270
    for m in (0, 100, 269):
        want = out.attentions[m // 9][m % 9]
        got, row_max = decode_sparse(s, m), want.max(-1, keepdims=True)
        assert np.all(np.abs(got - want) <= np.where(got > 0, row_max / 510 + row_max * 1e-3, want.max() / 100 + 1e-7))
        assert np.all((got > 0).sum(-1) >= np.minimum(4, (want >= row_max / 510).sum(-1)))  # each row's 4 largest
    # the stats are the exact weights' (the page's head table)
    p = out.attentions[3][2]
    ent = float(np.mean(-np.sum(np.where(p > 0, p * np.log(np.where(p > 0, p, 1)), 0), -1)))
    assert abs(s["stats"]["entropy"][3 * 9 + 2] - ent) < 1e-5
    assert abs(s["stats"]["first"][3 * 9 + 2] - float(p[:, 0].mean())) < 1e-6


def test_cli_llm_errors_are_one_line(tmp_path):
    for args, message in [(["a", "b"], "takes one text, got 2"), (["a", "--generate", "-1"], "--generate must be >= 0")]:
        r = subprocess.run([cli_path(), "viz", "--model", str(gguf_path()), *args, "--out", str(tmp_path / "x.html")],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode != 0 and len(r.stderr.strip().splitlines()) == 1 and message in r.stderr, r.stderr
