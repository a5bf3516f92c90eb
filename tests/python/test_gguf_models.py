"""Tiny GGUFs of each weight type and architecture, written here with the gguf package from random transformers models
(tensor names, metadata and llama's permuted attn_q / attn_k rows as llama.cpp's converter writes them), loaded by
qkv.CausalLM.from_pretrained:
- precision="fp32" (every weight dequantized once) gives the logits of the transformers model whose weights are the
  file's dequantized weights, within float32 rounding;
- precision=None (the file's weights read as stored, int8 activations per 32 for the integer types) stays within
  the activations' quantization error of those logits: no more than a few times the error that quantizing the
  weights alone to Q8_0 (the same rounding, per 32 with an fp16 scale) causes."""
import numpy as np
import pytest
import torch
import transformers as hf

import gguf
import qkv

TYPES = ["F32", "F16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1"]
ARCHS = ["llama", "llama-tied", "qwen2"]
IDS = [[3, 17, 45, 9, 88, 2, 61, 30, 7, 12, 90, 5]]


def tiny(arch):
    torch.manual_seed({"llama": 1, "llama-tied": 2, "qwen2": 3}[arch])
    common = dict(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=16, max_position_embeddings=128, rms_norm_eps=1e-5,
                  tie_word_embeddings=arch == "llama-tied")
    if arch == "qwen2":
        m = hf.Qwen2ForCausalLM(hf.Qwen2Config(**common, rope_theta=10000.0))
        with torch.no_grad():  # random biases (HF initialises them to zero)
            for layer in m.model.layers:
                for p in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                    p.bias.normal_(0, 0.5)
    else:
        m = hf.LlamaForCausalLM(hf.LlamaConfig(**common, rope_theta=10000.0))
    with torch.no_grad():  # norms away from 1 so that a misplaced one shows
        for n, p in m.named_parameters():
            if "norm" in n:
                p.uniform_(0.5, 1.5)
    return m.eval()


def llama_permute(w, heads):
    """llama.cpp's convert_hf_to_gguf permutation of q/k rows (rotate_half pairs -> adjacent pairs)."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def gguf_names(model, arch):
    c = model.config
    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight"}
    if not c.tie_word_embeddings:
        names["lm_head.weight"] = "output.weight"
    for i in range(c.num_hidden_layers):
        h, g = f"model.layers.{i}.", f"blk.{i}."
        names.update({h + "input_layernorm.weight": g + "attn_norm.weight",
                      h + "post_attention_layernorm.weight": g + "ffn_norm.weight",
                      h + "self_attn.o_proj.weight": g + "attn_output.weight",
                      h + "mlp.gate_proj.weight": g + "ffn_gate.weight",
                      h + "mlp.up_proj.weight": g + "ffn_up.weight",
                      h + "mlp.down_proj.weight": g + "ffn_down.weight"})
        for x in "qkv":
            names[h + f"self_attn.{x}_proj.weight"] = g + f"attn_{x}.weight"
            if arch == "qwen2":
                names[h + f"self_attn.{x}_proj.bias"] = g + f"attn_{x}.bias"
    return names


def write_gguf(path, model, arch, type_name):
    """The model as a GGUF whose matrices are of `type_name` (norms and biases F32); returns the dequantized weights
    under HF's names (what the file holds)."""
    c = model.config
    qtype = gguf.GGMLQuantizationType[type_name]
    name = "qwen2" if arch == "qwen2" else "llama"
    w = gguf.GGUFWriter(str(path), name)
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_block_count(c.num_hidden_layers)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_rope_freq_base(10000.0)
    w.add_file_type(0)
    held = {}
    for hf_name, g_name in gguf_names(model, arch).items():
        t = model.state_dict()[hf_name].float().numpy()
        if name == "llama" and (".q_proj." in hf_name or ".k_proj." in hf_name):
            heads = c.num_attention_heads if ".q_proj." in hf_name else c.num_key_value_heads
            t = llama_permute(t, heads)
        if t.ndim == 2:
            data = gguf.quants.quantize(t, qtype)
            back = gguf.quants.dequantize(data, qtype).reshape(t.shape)
            w.add_tensor(g_name, data, raw_dtype=qtype)  # data: the bytes, (rows, row bytes)
        else:
            back = t
            w.add_tensor(g_name, t)
        if name == "llama" and (".q_proj." in hf_name or ".k_proj." in hf_name):  # back to HF's row order
            heads = c.num_attention_heads if ".q_proj." in hf_name else c.num_key_value_heads
            back = back.reshape(heads, back.shape[0] // heads // 2, 2, -1).swapaxes(1, 2).reshape(back.shape)
        held[hf_name] = back
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return held


def logits_with(model, weights):
    m = type(model)(model.config).eval()
    sd = m.state_dict()
    if model.config.tie_word_embeddings:  # the head is the file's (rounded) embedding table too
        weights = dict(weights, **{"lm_head.weight": weights["model.embed_tokens.weight"]})
    for k in sd:
        if k in weights:
            sd[k] = torch.from_numpy(np.ascontiguousarray(weights[k]))
        else:
            sd[k] = model.state_dict()[k]
    m.load_state_dict(sd)
    with torch.no_grad():
        return m(torch.tensor(IDS)).logits.numpy()


def rms(x):
    return float(np.sqrt(np.mean(np.square(x))))


@pytest.fixture(scope="module")
def q8_error():
    """Per arch: the RMS logit error of quantizing the weights alone to Q8_0."""
    return {}


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("type_name", TYPES)
def test_tiny_gguf_gives_the_logits_of_its_weights(tmp_path, arch, type_name, q8_error):
    model = tiny(arch)
    with torch.no_grad():
        orig = model(torch.tensor(IDS)).logits.numpy()
    if arch not in q8_error:
        held8 = write_gguf(tmp_path / "q8.gguf", model, arch, "Q8_0")
        q8_error[arch] = rms(logits_with(model, held8) - orig)
        assert q8_error[arch] > 0
    path = tmp_path / f"{arch}.{type_name}.gguf"
    held = write_gguf(path, model, arch, type_name)
    want = logits_with(model, held)
    fp32 = qkv.CausalLM.from_pretrained(path, precision="fp32").logits(IDS)
    np.testing.assert_allclose(fp32, want, rtol=0, atol=1e-4 * float(np.abs(want).max()))
    stored = qkv.CausalLM.from_pretrained(path).logits(IDS)
    assert np.isfinite(stored).all()
    err = rms(stored - want)
    if type_name in ("F32", "F16"):  # no integer product: float32 rows
        assert err <= 1e-4 * float(np.abs(want).max()), err
    else:  # int8 activations per 32: the same rounding as Q8_0 weights, applied to the activations
        assert 0 < err <= 3.0 * q8_error[arch], (err, q8_error[arch])  # > 0: the integer product ran


def test_gguf_tensor_without_a_place_is_refused_naming_it(tmp_path):
    model = tiny("llama")
    path = tmp_path / "extra.gguf"
    c = model.config
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_embedding_length(c.hidden_size)
    w.add_block_count(0)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_tensor("token_embd.weight", model.model.embed_tokens.weight.detach().numpy())
    w.add_tensor("output_norm.weight", model.model.norm.weight.detach().numpy())
    w.add_tensor("mystery.weight", np.zeros(4, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ValueError, match="mystery.weight"):
        qkv.CausalLM.from_pretrained(path)
