"""qkv.CausalLM against Hugging Face transformers on tiny random Llama models with scaled rotary embeddings (linear,
llama3, yarn, yarn with DeepSeek's mscales, the older rope_scaling form) and Qwen 2 (random q/k/v biases; a window on
the upper layers, tied embeddings, yarn), each built here from a config (no download) and written with
save_pretrained: the logits within 1e-4 relative and greedy tokens through qkv's KV cache equal to transformers' own
cached decoding, at positions past original_max_position_embeddings. Read without its scaling (or biases) a model
misses: they are what matches."""
import json
import os

import numpy as np
import pytest
import torch
import transformers as hf
from safetensors.torch import load_file, save_file

import qkv

COMMON = dict(vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=128, initializer_range=0.1)
# head_dim 8 and short original lengths, so that every band of each recipe is hit by the 4 frequencies.
ROPES = {
    "linear": dict(rope_parameters=dict(rope_type="linear", rope_theta=10000.0, factor=2.0)),
    "llama3": dict(rope_parameters=dict(rope_type="llama3", rope_theta=10000.0, factor=8.0, low_freq_factor=1.0,
                                        high_freq_factor=4.0, original_max_position_embeddings=16)),
    "yarn": dict(rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, factor=4.0,
                                      original_max_position_embeddings=32)),
    "yarn_mscale": dict(rope_parameters=dict(rope_type="yarn", rope_theta=500.0, factor=8.0, beta_fast=8.0,
                                             beta_slow=2.0, mscale=0.707, mscale_all_dim=1.0, truncate=False,
                                             original_max_position_embeddings=16)),
    "yarn_rope_scaling": dict(rope_theta=5000.0, rope_scaling=dict(type="yarn", factor=4.0,
                                                                   original_max_position_embeddings=32)),
}
KINDS = {f"llama_{name}": (lambda kw=kw: hf.LlamaForCausalLM(hf.LlamaConfig(**COMMON, **kw)))
         for name, kw in ROPES.items()}
KINDS["qwen2"] = lambda: hf.Qwen2ForCausalLM(hf.Qwen2Config(**COMMON))
KINDS["qwen2_window_yarn"] = lambda: hf.Qwen2ForCausalLM(hf.Qwen2Config(
    **COMMON, use_sliding_window=True, sliding_window=5, max_window_layers=1, tie_word_embeddings=True,
    rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, factor=4.0, original_max_position_embeddings=32)))
PROMPT = [5, 17, 42]
STEPS = 40  # positions up to 42: past every original_max_position_embeddings above


def build(kind, folder):
    torch.manual_seed(1234)
    model = KINDS[kind]().eval()
    with torch.no_grad():  # norms start at 1 and biases at 0: make them random so they are tested
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith(".bias"):
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
    ids = np.random.default_rng(0).integers(0, 97, size=(2, 50))
    with torch.no_grad():
        want = ref(torch.tensor(ids)).logits.numpy()
    got = model.logits(ids)
    assert got.shape == want.shape == (2, 50, 97)
    assert relative_error(got, want) <= 1e-4, kind


def test_greedy_tokens_through_the_kv_cache_match_transformers(pair):
    kind, ref, model, _ = pair
    want, step, past = [], torch.tensor([PROMPT]), None
    with torch.inference_mode():
        for _ in range(STEPS):  # transformers' own cached decoding, greedy, never stopping at EOS
            out = ref(step, past_key_values=past, use_cache=True)
            past = out.past_key_values
            want.append(int(out.logits[0, -1].argmax()))
            step = torch.tensor([[want[-1]]])
    assert model.generate(PROMPT, STEPS).tolist() == want, kind
    assert model.generate(PROMPT, STEPS, page_size=4).tolist() == want, kind


def test_without_the_scaling_or_the_biases_it_misses(pair, tmp_path):
    # The same weights read with the default rotary embedding (or, for the unscaled Qwen 2, with its q/k/v biases
    # zeroed) are clearly off: the parity above is the scaling's and the biases', not a coincidence.
    kind, ref, _, folder = pair
    with open(os.path.join(folder, "config.json")) as f:
        cfg = json.load(f)
    state = load_file(os.path.join(folder, "model.safetensors"))
    if kind == "qwen2":
        state = {k: torch.zeros_like(v) if k.endswith(".bias") else v for k, v in state.items()}
    else:
        theta = (cfg.get("rope_parameters") or {}).get("rope_theta", cfg.get("rope_theta", 10000.0))
        cfg.pop("rope_scaling", None)
        cfg["rope_parameters"] = {"rope_type": "default", "rope_theta": theta}
    os.makedirs(tmp_path / "other")
    with open(tmp_path / "other" / "config.json", "w") as f:
        json.dump(cfg, f)
    save_file(state, str(tmp_path / "other" / "model.safetensors"))
    ids = np.random.default_rng(0).integers(0, 97, size=(1, 50))
    with torch.no_grad():
        want = ref(torch.tensor(ids)).logits.numpy()
    assert relative_error(qkv.CausalLM.from_pretrained(str(tmp_path / "other")).logits(ids), want) > 1e-2, kind
