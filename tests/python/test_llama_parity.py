"""qkv.CausalLM against Hugging Face transformers on tiny random Llama (GQA), Mistral (sliding window shorter than
the sequence) and Gemma 2 (attention and final soft-capping, a window on alternating layers, tied embeddings)
models, each built here from a config (no download) and written with save_pretrained: the logits within 1e-4
relative, the same 64 greedy tokens through qkv's KV cache, seeded sampling, and one-line errors for broken
folders."""
import json
import os
import subprocess

import numpy as np
import pytest
import torch
import transformers as hf
from safetensors.torch import load_file, save_file

import qkv

COMMON = dict(vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=128, initializer_range=0.1)
KINDS = {
    "llama": lambda: hf.LlamaForCausalLM(hf.LlamaConfig(**COMMON)),
    "mistral": lambda: hf.MistralForCausalLM(hf.MistralConfig(**COMMON, sliding_window=5)),
    "gemma2": lambda: hf.Gemma2ForCausalLM(hf.Gemma2Config(**COMMON, head_dim=8, sliding_window=4,
                                                           query_pre_attn_scalar=8, attn_logit_softcapping=1.0,
                                                           final_logit_softcapping=2.0)),
}
PROMPT = [5, 17, 42]


def build(kind, folder):
    torch.manual_seed(1234)
    model = KINDS[kind]().eval()
    with torch.no_grad():  # norms start at 1 (0 for Gemma): make them random so their weights are tested
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.3 * torch.randn_like(p))
    model.save_pretrained(folder)
    return model


@pytest.fixture(scope="module", params=sorted(KINDS))
def pair(request, tmp_path_factory):
    folder = str(tmp_path_factory.mktemp(request.param))
    ref = build(request.param, folder)
    return request.param, ref, qkv.CausalLM.from_pretrained(folder), folder


def relative_error(got, want):
    return float(np.max(np.abs(got - want)) / np.max(np.abs(want)))


def test_logits_match_transformers(pair):
    kind, ref, model, _ = pair
    ids = np.random.default_rng(0).integers(0, 97, size=(2, 23))
    with torch.no_grad():
        want = ref(torch.tensor(ids)).logits.numpy()
    got = model.logits(ids)
    assert got.shape == want.shape == (2, 23, 97)
    assert relative_error(got, want) <= 1e-4, kind
    assert relative_error(model.logits(ids[1]), want[1]) <= 1e-4  # a 1-D prompt


def test_greedy_tokens_through_the_kv_cache_match_transformers(pair):
    kind, ref, model, _ = pair
    want, step, past = [], torch.tensor([PROMPT]), None
    with torch.inference_mode():
        for _ in range(64):  # transformers' own cached decoding, greedy, never stopping at EOS
            out = ref(step, past_key_values=past, use_cache=True)
            past = out.past_key_values
            want.append(int(out.logits[0, -1].argmax()))
            step = torch.tensor([[want[-1]]])
    assert model.generate(PROMPT, 64).tolist() == want, kind
    for page in (1, 5, 16):  # a paged KV cache, read in place through its block table
        assert model.generate(PROMPT, 64, page_size=page).tolist() == want, (kind, page)


def test_sampling_is_seeded_and_top_k_1_is_greedy(pair):
    _, _, model, _ = pair
    a = model.generate(PROMPT, 20, temperature=1.5, top_p=0.9, seed=7)
    assert a.tolist() == model.generate(PROMPT, 20, temperature=1.5, top_p=0.9, seed=7).tolist()
    draws = {tuple(model.generate(PROMPT, 20, temperature=1.5, seed=s).tolist()) for s in range(4)}
    assert len(draws) > 1
    assert model.generate(PROMPT, 20, temperature=0.8, top_k=1, seed=3).tolist() == model.generate(PROMPT, 20).tolist()
    stop = int(model.generate(PROMPT, 1)[0])
    assert model.generate(PROMPT, 10, eos_token_id=stop).tolist() == [stop]


def test_bad_ids_are_one_line_value_errors(pair):
    _, _, model, _ = pair
    for bad in ([5, 97], [-1]):
        with pytest.raises(ValueError, match=r"\[llama\] token id") as e:
            model.logits(bad)
        assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match="top_p"):
        model.generate(PROMPT, 4, temperature=1.0, top_p=0.0)
    with pytest.raises(TypeError, match="integers"):
        model.logits([1.5, 2.0])


def broken_copy(folder, dst, config=None, tensors=None):
    os.makedirs(dst)
    with open(os.path.join(folder, "config.json")) as f:
        cfg = json.load(f)
    if config:
        cfg.update(config)
    with open(os.path.join(dst, "config.json"), "w") as f:
        json.dump(cfg, f)
    state = load_file(os.path.join(folder, "model.safetensors"))
    if tensors:
        state = tensors(state)
    save_file(state, os.path.join(dst, "model.safetensors"))
    return dst


def test_broken_folders_name_the_problem(pair, tmp_path):
    kind, _, _, folder = pair
    cases = [
        (dict(config={"rope_parameters": {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0}}),
         "rope_type \"dynamic\" is not supported"),
        (dict(config={"model_type": "gpt2"}), "model_type \"gpt2\" is not supported"),
        (dict(config={"num_key_value_heads": 3}), "multiple of num_key_value_heads"),
        (dict(tensors=lambda s: {k: v for k, v in s.items() if k != "model.layers.1.mlp.up_proj.weight"}),
         "model.layers.1.mlp.up_proj.weight"),
        (dict(tensors=lambda s: {**s, "model.extra.weight": torch.zeros(2)}), "model.extra.weight"),
        (dict(tensors=lambda s: {**s, "model.norm.weight": torch.ones(31)}), "model.norm.weight"),
    ]
    for i, (change, message) in enumerate(cases):
        dst = broken_copy(folder, str(tmp_path / str(i)), **change)
        with pytest.raises(ValueError, match=message.replace("(", r"\(")) as e:
            qkv.CausalLM.from_pretrained(dst)
        assert "\n" not in str(e.value), kind
    with pytest.raises(ValueError, match="does not exist"):
        qkv.CausalLM.from_pretrained(str(tmp_path / "absent"))


def test_from_pretrained_at_low_precision(pair):
    # bf16 and int8 load converted once: the logits stay near fp32's (bf16 rounds weights, activations, attention
    # operands; int8 quantizes the linear layers), and an unknown precision is a one-line ValueError.
    kind, _, model, folder = pair
    ids = np.random.default_rng(1).integers(0, 97, size=(1, 17))
    want = model.logits(ids)
    for precision, bound in (("bf16", 0.05), ("int8", 0.1)):
        got = qkv.CausalLM.from_pretrained(folder, precision=precision).logits(ids)
        err = relative_error(got, want)
        assert 0.0 < err <= bound, (kind, precision, err)
    with pytest.raises(ValueError, match="int4") as e:
        qkv.CausalLM.from_pretrained(folder, precision="int4")
    assert "\n" not in str(e.value)


def cli(*args):
    # The module is built into <build>/python/qkv; the command sits at <build>/qkv.
    build = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(qkv.__file__))))
    path = os.path.join(build, "qkv")
    assert os.path.isfile(path), f"the qkv command was not built next to the module: {path}"
    env = dict(os.environ, OMP_NUM_THREADS="2")
    return subprocess.run([path, "generate", *args], capture_output=True, text=True, env=env, timeout=120)


def ids_of(stdout):
    return [int(x) for x in stdout.strip().split(",")] if stdout.strip() else []


def test_cli_generate_prints_the_modules_tokens(pair):
    _, _, model, folder = pair
    r = cli("--model", folder, "--prompt-ids", "5,17,42", "--max-new-tokens", "64")
    assert r.returncode == 0, r.stderr
    assert ids_of(r.stdout) == model.generate(PROMPT, 64).tolist()
    r = cli("--model", folder, "--prompt-ids", "5,17,42", "--max-new-tokens", "12", "--temperature", "1.2",
            "--top-k", "20", "--top-p", "0.95", "--seed", "9")
    assert r.returncode == 0, r.stderr
    assert ids_of(r.stdout) == model.generate(PROMPT, 12, temperature=1.2, top_k=20, top_p=0.95, seed=9).tolist()
    r = cli("--model", folder, "--prompt-ids", "5,17,42", "--max-new-tokens", "8", "--beam", "3", "--eos", "0")
    assert r.returncode == 0, r.stderr
    beam = ids_of(r.stdout)
    assert 1 <= len(beam) <= 8 and all(0 <= t < 97 for t in beam)
    for extra in (["--max-new-tokens", "64"], ["--max-new-tokens", "8", "--beam", "3", "--eos", "0"]):
        r = cli("--model", folder, "--prompt-ids", "5,17,42", "--page-size", "4", *extra)  # paged KV cache
        assert r.returncode == 0, r.stderr
        assert ids_of(r.stdout) == (beam if "--beam" in extra else model.generate(PROMPT, 64).tolist())


def test_cli_generate_errors_are_one_line(pair, tmp_path):
    _, _, _, folder = pair
    for args, message in [
        (["--model", folder, "--prompt-ids", "5,x"], "'x' is not a token id"),
        (["--model", folder, "--prompt-ids", "5,97"], "outside [0, vocab_size = 97)"),
        (["--model", folder, "--prompt-ids", "5", "--temperature", "-1"], "temperature"),
        (["--model", folder, "--prompt-ids", "5", "--page-size", "-1"], "--page-size"),
        (["--model", str(tmp_path / "absent"), "--prompt-ids", "5"], "does not exist"),
    ]:
        r = cli(*args)
        assert r.returncode != 0 and r.stdout == ""
        assert message in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
