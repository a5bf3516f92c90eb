"""Attention weights for the viewer: qkv.SentenceEncoder.attentions equals transformers' output_attentions for the
real all-MiniLM-L6-v2 (single sentences, pairs, masked tokens), and qkv.viz.write_html / `qkv viz` write a page that
holds exactly those weights, or refuse bad input in one line."""
import base64
import json
import os
import re
import subprocess

import numpy as np
import pytest

import minilm_corpus as corpus
import qkv
from test_cli_minilm import cli_path

# float16 of a weight in [0, 1] is within 2^-12 of it; uint8 within 1/510
F16_ATOL = 2.0 ** -12
U8_ATOL = 1.0 / 510 + 1e-7


@pytest.fixture(scope="module")
def enc():
    return qkv.SentenceEncoder(corpus.model_dir())


@pytest.fixture(scope="module")
def hf():
    import torch
    from transformers import AutoModel, AutoTokenizer

    torch.set_num_threads(2)
    tok = AutoTokenizer.from_pretrained(corpus.model_dir())
    model = AutoModel.from_pretrained(corpus.model_dir(), attn_implementation="eager").eval()
    return tok, model


def hf_attentions(hf, text, second=None, mask=()):
    import torch

    tok, model = hf
    b = tok(text, second, return_tensors="pt")
    ids = b["input_ids"].clone()
    for p in mask:
        ids[0, p] = tok.mask_token_id
    with torch.no_grad():
        out = model(input_ids=ids, token_type_ids=b["token_type_ids"], attention_mask=b["attention_mask"],
                    output_attentions=True)
    return tok.convert_ids_to_tokens(ids[0]), [a.numpy() for a in out.attentions]


@pytest.mark.parametrize("text,second", [("The cat sat on the mat.", None),
                                         ("Attention is all you need.", "你好,世界 🙂 naïve café"),
                                         (corpus.HANDWRITTEN[18], corpus.HANDWRITTEN[20])])
def test_attentions_match_transformers(enc, hf, text, second):
    tokens, ours = enc.attentions(text, second)
    ref_tokens, ref = hf_attentions(hf, text, second)
    assert tokens == ref_tokens
    assert len(ours) == len(ref) == 6
    for a, r in zip(ours, ref):
        assert a.shape == r.shape == (1, 12, len(tokens), len(tokens))
        np.testing.assert_allclose(a, r, rtol=0, atol=2e-5)
        np.testing.assert_allclose(a.sum(-1), 1.0, rtol=0, atol=1e-5)


def test_masked_positions_become_mask_tokens(enc, hf):
    text = "The capital of France is Paris."
    tokens, ours = enc.attentions(text, mask=[5, 6])
    ref_tokens, ref = hf_attentions(hf, text, mask=[5, 6])
    assert tokens == ref_tokens and tokens[5] == tokens[6] == "[MASK]"
    for a, r in zip(ours, ref):
        np.testing.assert_allclose(a, r, rtol=0, atol=2e-5)
    with pytest.raises(ValueError, match=r"mask position 40 is outside \[0, 9\)"):
        enc.attentions(text, mask=[40])


def test_too_long_pair_is_refused(enc):
    long = " ".join(["word"] * 200)
    with pytest.raises(ValueError, match="sentence pair has 40[0-9] tokens, more than max_seq_length = 256"):
        enc.attentions(long, long)


def page_data(path):
    html = open(path, encoding="utf-8").read()
    m = re.search(r'<script id="qkv-data" type="application/json">(.*?)</script>', html, re.S)
    assert m, "the page holds no data element"
    return html, json.loads(m.group(1))


def decode(group):
    raw = base64.b64decode(group["data"])
    shape = (group["layers"], group["heads"], group["tq"], group["tk"])
    if group["dtype"] == "f16":
        return np.frombuffer(raw, dtype="<f2").astype(np.float32).reshape(shape)
    return (np.frombuffer(raw, dtype=np.uint8).astype(np.float32) / 255).reshape(shape)


def test_write_html_holds_the_weights(enc, tmp_path):
    tokens, att = enc.attentions("Colourless green ideas sleep furiously.")
    path = qkv.viz.write_html(tmp_path / "sub" / "page.html", tokens, att, title="t")
    html, data = page_data(path)
    assert "http://" not in html.replace("http://www.w3.org/", "") and "https://" not in html
    (g,) = data["snapshots"][0]["groups"]
    assert g["q_tokens"] == tokens and g["dtype"] == "f16"
    np.testing.assert_allclose(decode(g), np.concatenate(att, 0), rtol=0, atol=F16_ATOL)
    assert oct(os.stat(path).st_mode & 0o777) != "0o600"
    assert not [f for f in os.listdir(tmp_path / "sub") if f != "page.html"], "a temporary file was left behind"


def test_large_pages_switch_to_uint8(tmp_path):
    rng = np.random.default_rng(0)
    t = 256  # 6 x 12 x 256^2 float16 weights would take 12.6 MB of base64: over qkv.viz.MAX_F16_BYTES
    att = [rng.dirichlet(np.ones(t), size=(1, 12, t)).astype(np.float32) for _ in range(6)]
    path = qkv.viz.write_html(tmp_path / "big.html", [f"t{i}" for i in range(t)], att)
    _, data = page_data(path)
    g = data["snapshots"][0]["groups"][0]
    assert g["dtype"] == "u8"
    np.testing.assert_allclose(decode(g), np.concatenate(att, 0), rtol=0, atol=U8_ATOL)


def test_tokens_with_script_end_tags_stay_inside_the_data(tmp_path):
    tokens = ["</script>", "<b>", "&amp;"]
    att = [np.full((1, 1, 3, 3), 1 / 3, dtype=np.float32)]
    html, data = page_data(qkv.viz.write_html(tmp_path / "p.html", tokens, att))
    assert data["snapshots"][0]["groups"][0]["q_tokens"] == tokens


@pytest.mark.parametrize("tokens,att,message", [
    (["a", "b"], [np.full((1, 2, 3, 3), 1 / 3)], r"layer 0 has shape \(1, 2, 3, 3\), expected \(1, H, 2, 2\)"),
    (["a"], [np.ones((1, 2, 1, 1)), np.ones((1, 3, 1, 1))], "layer 1 has 3 heads, layer 0 has 2"),
    (["a"], [np.full((1, 1, 1, 1), np.nan)], "NaN or infinite"),
    (["a"], [np.full((1, 1, 1, 1), 2.0)], r"must lie in \[0, 1\]"),
    (["a"], [], "attentions is empty"),
])
def test_write_html_rejects_bad_input(tmp_path, tokens, att, message):
    with pytest.raises(ValueError, match=message):
        qkv.viz.write_html(tmp_path / "x.html", tokens, att)
    assert not os.path.exists(tmp_path / "x.html")


def test_seq2seq_pages_hold_three_groups_and_check_their_arguments(tmp_path):
    enc_att = [np.full((1, 2, 3, 3), 1 / 3, np.float32)]
    cross = [np.full((1, 2, 2, 3), 1 / 3, np.float32)]
    dec = [np.tril(np.ones((2, 2), np.float32))[None, None].repeat(2, 1) / np.array([1, 2], np.float32)[:, None]]
    _, data = page_data(qkv.viz.write_html(tmp_path / "s.html", encoder_attention=enc_att, decoder_attention=dec,
                                           cross_attention=cross, encoder_tokens=list("abc"), decoder_tokens=list("xy"),
                                           lang="zh"))
    assert data["lang"] == "zh"
    groups = data["snapshots"][0]["groups"]
    assert [(g["kind"], g["causal"], g["tq"], g["tk"]) for g in groups] == [("self", False, 3, 3), ("self", True, 2, 2),
                                                                           ("cross", False, 2, 3)]
    with pytest.raises(ValueError, match="not both"):
        qkv.viz.write_html(tmp_path / "x.html", list("abc"), enc_att, encoder_attention=enc_att, encoder_tokens=list("abc"))
    with pytest.raises(ValueError, match="decoder_tokens"):
        qkv.viz.write_html(tmp_path / "x.html", cross_attention=cross, encoder_tokens=list("abc"))
    with pytest.raises(ValueError, match=r"layer 0 has shape \(1, 2, 2, 3\), expected \(1, H, 3, 2\)"):
        qkv.viz.write_html(tmp_path / "x.html", cross_attention=cross, encoder_tokens=list("xy"), decoder_tokens=list("abc"))
    with pytest.raises(ValueError, match="lang must be 'en' or 'zh'"):
        qkv.viz.write_html(tmp_path / "x.html", ["a"], [np.ones((1, 1, 1, 1))], lang="fr")
    with pytest.raises(ValueError, match="2 checkpoint labels for 1 checkpoints"):
        qkv.viz.write_html(tmp_path / "x.html", ["a"], checkpoints=[[np.ones((1, 1, 1, 1))]], checkpoint_labels=["0", "1"])


def run_cli(*args):
    env = dict(os.environ, OMP_NUM_THREADS="2")
    return subprocess.run([cli_path(), *args], capture_output=True, text=True, env=env, timeout=300)


def test_cli_viz_model_writes_the_modules_weights(enc, tmp_path):
    out = tmp_path / "minilm.html"
    r = run_cli("viz", "--model", corpus.model_dir(), "The cat sat on the mat.", "It was tired.", "--out", str(out))
    assert r.returncode == 0, r.stderr
    _, data = page_data(out)
    (g,) = data["snapshots"][0]["groups"]
    tokens, att = enc.attentions("The cat sat on the mat.", "It was tired.")
    assert g["q_tokens"] == tokens and (g["layers"], g["heads"]) == (6, 12)
    np.testing.assert_allclose(decode(g), np.concatenate(att, 0), rtol=0, atol=F16_ATOL + 1e-6)


def test_cli_viz_demo_writes_two_samples_of_four_heads(tmp_path):
    out = tmp_path / "demo.html"
    r = run_cli("viz", "demo", "--out", str(out))
    assert r.returncode == 0, r.stderr
    _, data = page_data(out)
    groups = data["snapshots"][0]["groups"]
    assert [g["name"] for g in groups] == ["sample 0", "sample 1"]
    for g in groups:
        w = decode(g)
        assert w.shape == (1, 4, 10, 10)
        np.testing.assert_allclose(w.sum(-1), 1.0, atol=10 * F16_ATOL)


@pytest.mark.parametrize("args,message", [
    (["viz", "--out", "x.html"], "--model DIR"),
    (["viz", "--model", "/nonexistent-model-dir", "hi"], "/nonexistent-model-dir"),
    (["viz", "--model", "MODEL", "a", "b", "c"], "one sentence or two"),
])
def test_cli_viz_errors_are_one_line(tmp_path, args, message):
    args = [corpus.model_dir() if a == "MODEL" else a for a in args]
    r = run_cli(*args)
    assert r.returncode != 0
    assert len(r.stderr.strip().splitlines()) == 1 and message in r.stderr, r.stderr


COMMENT_SCRIPT = "a <!--<script> b </script> c & d \u2028 e \u2029"


def script_text(html):
    """The text of the page data element as the HTML parser sees it: up to the first "</script"."""
    return html.split('<script id="qkv-data" type="application/json">', 1)[1].split("</script", 1)[0]


def test_embedded_json_escapes_comment_and_script_openers(tmp_path):
    """"<!--<script>" in the data put the HTML parser in its double-escaped state: the data element swallowed the
    viewer's own script and the page stayed blank. Both writers (qkv.viz and `qkv viz`) escape < > & U+2028 U+2029."""
    tokens = [COMMENT_SCRIPT, "</script>", "<!--"]
    att = [np.full((1, 1, 3, 3), 1 / 3, dtype=np.float32)]
    html = open(qkv.viz.write_html(tmp_path / "py.html", tokens, att, title=COMMENT_SCRIPT), encoding="utf-8").read()
    text = script_text(html)
    assert not set(text) & set("<>&\u2028\u2029")
    data = json.loads(text)
    assert data["title"] == COMMENT_SCRIPT and data["snapshots"][0]["groups"][0]["q_tokens"] == tokens
    out = tmp_path / "cli.html"
    r = run_cli("viz", "--model", corpus.model_dir(), COMMENT_SCRIPT, "--out", str(out))
    assert r.returncode == 0, r.stderr
    text = script_text(out.read_text(encoding="utf-8"))
    assert not set(text) & set("<>&\u2028\u2029")
    assert COMMENT_SCRIPT in json.loads(text)["title"]


def test_cli_viz_out_refuses_to_overwrite_a_file_it_did_not_write(tmp_path):
    """`viz --out RUN/config.json` replaced the run's config; only a page the viewer wrote may be replaced."""
    config = tmp_path / "config.json"
    config.write_text('{"model": "rnn-attn"}\n')
    r = run_cli("viz", "demo", "--out", str(config))
    assert r.returncode != 0 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "exists and is not a viewer page" in r.stderr
    assert config.read_text() == '{"model": "rnn-attn"}\n'
    page = tmp_path / "page.html"
    assert run_cli("viz", "demo", "--out", str(page)).returncode == 0
    assert run_cli("viz", "demo", "--seed", "3", "--out", str(page)).returncode == 0, "a viewer page is replaced"
    assert "seed 3" in page_data(page)[1]["title"]
    tokens = ["a"]
    py_page = qkv.viz.write_html(tmp_path / "py.html", tokens, [np.ones((1, 1, 1, 1), np.float32)])
    assert run_cli("viz", "demo", "--out", str(py_page)).returncode == 0, "so is a page of qkv.viz"
    assert run_cli("viz", "demo", "--out", str(tmp_path)).returncode != 0, "a directory is not a page"


def test_cli_viz_out_dash_writes_the_page_to_stdout(tmp_path):
    """`--out -` wrote a file named "-"."""
    r = subprocess.run([cli_path(), "viz", "demo", "--out", "-"], capture_output=True, text=True, timeout=60,
                       cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert not (tmp_path / "-").exists()
    (tmp_path / "p.html").write_text(r.stdout, encoding="utf-8")
    assert [g["name"] for g in page_data(tmp_path / "p.html")[1]["snapshots"][0]["groups"]] == ["sample 0", "sample 1"]


def test_cli_viz_warns_when_the_text_is_cut_to_max_seq_length(tmp_path):
    """A 2000-word sentence was cut to 256 tokens without a word: a warning on stderr and a note on the page."""
    out = tmp_path / "long.html"
    r = run_cli("viz", "--model", corpus.model_dir(), " ".join(["word"] * 2000), "--out", str(out))
    assert r.returncode == 0, r.stderr
    assert r.stderr.startswith("[viz] warning: the text has 2002 tokens") and "only the first 256" in r.stderr
    _, data = page_data(out)
    assert data["snapshots"][0]["groups"][0]["tq"] == 256 and "only the first 256" in data["note"]
    r = run_cli("viz", "--model", corpus.model_dir(), "short", "--out", str(tmp_path / "short.html"))
    assert r.returncode == 0 and r.stderr == "" and "note" not in page_data(tmp_path / "short.html")[1]


def language_model_folder(tmp_path):
    lm = tmp_path / "smollm"
    lm.mkdir()
    (lm / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama"}))
    (lm / "tokenizer.json").write_text("{}")
    return lm


def test_broken_language_model_folder_is_one_line_naming_the_file(tmp_path):
    """viz draws language models (test_viz_llm.py): a broken folder is the loader's one line naming the file."""
    lm = language_model_folder(tmp_path)
    r = run_cli("viz", "--model", str(lm), "hi", "--out", str(tmp_path / "x.html"))
    assert r.returncode != 0 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert str(lm / "config.json") in r.stderr and "vocab_size" in r.stderr


def llama_run_reference(run, step_dir, source, output):
    """The last layer's attention (heads averaged) of transformers' eager Llama, built from the run's config and a
    checkpoint's weights, on source + BOS + output: the rows of BOS and each output token over the source columns."""
    import torch
    import transformers as hf
    from safetensors.torch import load_file

    c = json.loads((run / "config.json").read_text())
    vocab = (run / "vocab.txt").read_text(encoding="utf-8").splitlines()[1:]  # after the header line, id = index
    cfg = hf.LlamaConfig(vocab_size=len(vocab), hidden_size=c["d_model"], intermediate_size=c["ffn"],
                         num_hidden_layers=c["layers"], num_attention_heads=c["heads"], num_key_value_heads=c["heads"],
                         head_dim=c["d_model"] // c["heads"], rms_norm_eps=1e-6, rope_theta=10000.0,
                         tie_word_embeddings=False)
    model = hf.LlamaForCausalLM(cfg)
    model.config._attn_implementation = "eager"
    model.load_state_dict(load_file(str(step_dir / "model.safetensors")), strict=True)
    model.eval()
    src = [vocab.index(t) for t in source]
    ids = src + [vocab.index("<bos>")] + [vocab.index(t) for t in output]
    with torch.no_grad():
        att = model(input_ids=torch.tensor([ids]), output_attentions=True).attentions[-1][0].double().mean(0).numpy()
    return att[len(src):len(ids), :len(src)]


def test_llama_run_draws_the_attention_of_its_output_over_the_source(tmp_path):
    """`viz --run` of a `--model llama` run: every kept checkpoint's last-layer attention (heads averaged, through its
    KV cache) of BOS and each output token over the source, as transformers' full forward of that checkpoint has it
    (a causal model's rows over the source sum to at most 1: the rest is on BOS and the output)."""
    run = tmp_path / "llama"
    r = run_cli("train", "--model", "llama", "--task", "reverse", "--min-len", "4", "--max-len", "6", "--train-size",
                "200", "--test-size", "10", "--d-model", "16", "--heads", "2", "--layers", "2", "--steps", "20",
                "--lr", "1e-2", "--eval-every", "20", "--eval-size", "5", "--checkpoint-every", "10",
                "--keep-checkpoints", "5", "--seed", "3", "--out", str(run))
    assert r.returncode == 0, r.stderr
    page = tmp_path / "x.html"
    r = run_cli("viz", "--run", str(run), "--checkpoints", "all", "--input", "31415", "--out", str(page))
    assert r.returncode == 0, r.stderr
    _, data = page_data(page)
    assert [s["label"] for s in data["snapshots"]] == ["step 10", "step 20"]
    steps = sorted((run / "checkpoints").iterdir())
    for snap, step_dir in zip(data["snapshots"], steps):
        (g,) = snap["groups"]
        assert g["name"] == "llama attention (target x source)" and g["kind"] == "cross"
        assert g["k_tokens"] == list("31415") and g["q_tokens"][-1] == "<eos>"
        att = decode(g)
        assert att.shape == (1, 1, len(g["q_tokens"]), 5)
        rows = att[0, 0]
        assert (rows.sum(-1) > 0).all() and (rows.sum(-1) <= 1 + 5 * F16_ATOL).all()
        want = llama_run_reference(run, step_dir, g["k_tokens"], g["q_tokens"][:-1])
        np.testing.assert_allclose(rows, want, rtol=0, atol=F16_ATOL + 1e-5)
    png = tmp_path / "a.png"  # translate draws the same maps
    r = subprocess.run([cli_path(), "translate", str(run), "--show-attention", str(png)], input="31415\n",
                       capture_output=True, text=True, timeout=120, env=dict(os.environ, OMP_NUM_THREADS="2"))
    assert r.returncode == 0 and "attention of 1 line(s)" in r.stderr, r.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
