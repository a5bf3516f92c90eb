"""Tiny GGUFs of each weight type (F32, F16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, and Q4_K, Q5_K, Q6_K and llama.cpp's Q4_K_M
mix of Q4_K and Q6_K as random blocks) and
architecture (llama untied and tied, qwen2, gemma2), written here with the gguf package from random transformers models
(tensor names, metadata and llama's permuted attn_q / attn_k rows as llama.cpp's converter writes them), loaded by
qkv.CausalLM.from_pretrained:
- precision="fp32" (every weight dequantized once) gives the logits of the transformers model whose weights are the
  file's dequantized weights, within float32 rounding;
- precision=None (the file's weights read as stored, int8 activations per 32 for the integer types) stays within
  the activations' quantization error of those logits: no more than a few times the error that quantizing the
  weights alone to Q8_0 (the same rounding, per 32 with an fp16 scale) causes; the float types (read as
  dequantized float32 rows) within float32 rounding."""
import numpy as np
import pytest
import torch
import transformers as hf

import gguf
import qkv

TYPES = ["F32", "F16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K", "Q4_K_M"]
ARCHS = ["llama", "llama-tied", "qwen2", "gemma2"]
IDS = [[3, 17, 45, 9, 88, 2, 61, 30, 7, 12, 90, 5]]


def tiny(arch, wide=False):
    """wide: every matrix's rows a multiple of 256 elements (the K-quants' super-blocks)."""
    torch.manual_seed({"llama": 1, "llama-tied": 2, "qwen2": 3, "gemma2": 4}[arch])
    e, d = (256, 64) if wide else (64, 16)
    common = dict(vocab_size=96, hidden_size=e, intermediate_size=2 * e, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=d, max_position_embeddings=128, rms_norm_eps=1e-5,
                  tie_word_embeddings=arch == "llama-tied")
    if arch == "gemma2":  # sliding window 4 on even layers (12 ids: it matters), soft-caps, GeGLU, sandwich norms
        common["tie_word_embeddings"] = True
        m = hf.Gemma2ForCausalLM(hf.Gemma2Config(**common, rope_theta=10000.0, sliding_window=4,
                                                 query_pre_attn_scalar=d, attn_logit_softcapping=50.0,
                                                 final_logit_softcapping=30.0))
    elif arch == "qwen2":
        m = hf.Qwen2ForCausalLM(hf.Qwen2Config(**common, rope_theta=10000.0))
        with torch.no_grad():  # random biases (HF initialises them to zero)
            for layer in m.model.layers:
                for p in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                    p.bias.normal_(0, 0.5)
    else:
        m = hf.LlamaForCausalLM(hf.LlamaConfig(**common, rope_theta=10000.0))
    with torch.no_grad():  # norms away from their neutral value so that a misplaced one shows
        for n, p in m.named_parameters():
            if "norm" in n:
                p.uniform_(-0.5, 0.5) if arch == "gemma2" else p.uniform_(0.5, 1.5)
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
                      h + "self_attn.o_proj.weight": g + "attn_output.weight",
                      h + "mlp.gate_proj.weight": g + "ffn_gate.weight",
                      h + "mlp.up_proj.weight": g + "ffn_up.weight",
                      h + "mlp.down_proj.weight": g + "ffn_down.weight"})
        if arch == "gemma2":
            names.update({h + "post_attention_layernorm.weight": g + "post_attention_norm.weight",
                          h + "pre_feedforward_layernorm.weight": g + "ffn_norm.weight",
                          h + "post_feedforward_layernorm.weight": g + "post_ffw_norm.weight"})
        else:
            names[h + "post_attention_layernorm.weight"] = g + "ffn_norm.weight"
        for x in "qkv":
            names[h + f"self_attn.{x}_proj.weight"] = g + f"attn_{x}.weight"
            if arch == "qwen2":
                names[h + f"self_attn.{x}_proj.bias"] = g + f"attn_{x}.bias"
    return names


def tensor_type(type_name, g_name):
    """The type of one tensor: Q4_K_M as llama.cpp mixes it (attn_v, ffn_down and the output head Q6_K, the other
    matrices Q4_K), else type_name."""
    if type_name != "Q4_K_M":
        return gguf.GGMLQuantizationType[type_name]
    six = any(s in g_name for s in ("attn_v.", "ffn_down.", "output.weight"))
    return gguf.GGMLQuantizationType.Q6_K if six else gguf.GGMLQuantizationType.Q4_K


def write_gguf(path, model, arch, type_name):
    """The model as a GGUF whose matrices are of `type_name` (norms and biases F32); returns the dequantized weights
    under HF's names (what the file holds)."""
    c = model.config
    name = arch if arch in ("qwen2", "gemma2") else "llama"
    w = gguf.GGUFWriter(str(path), name)
    if arch == "gemma2":
        w.add_key_value("gemma2.attention.sliding_window", c.sliding_window, gguf.GGUFValueType.UINT32)
        w.add_key_value("gemma2.attn_logit_softcapping", c.attn_logit_softcapping, gguf.GGUFValueType.FLOAT32)
        w.add_key_value("gemma2.final_logit_softcapping", c.final_logit_softcapping, gguf.GGUFValueType.FLOAT32)
        w.add_key_value("gemma2.attention.key_length", c.head_dim, gguf.GGUFValueType.UINT32)
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
        if arch == "gemma2" and "norm" in hf_name:
            t = t + 1.0  # llama.cpp stores Gemma's RMSNorm gains as 1 + w
        qtype = tensor_type(type_name, g_name)
        if t.ndim == 2 and type_name in K_TYPES:  # random blocks (gguf-py cannot quantize K-quants)
            data = k_blocks(np.random.default_rng(len(held) + 7), qtype, *t.shape)
            back = gguf.quants.dequantize(data, qtype).reshape(t.shape)
            w.add_tensor(g_name, data, raw_dtype=qtype)
        elif t.ndim == 2:
            data = gguf.quants.quantize(t, qtype)
            back = gguf.quants.dequantize(data, qtype).reshape(t.shape)
            w.add_tensor(g_name, data, raw_dtype=qtype)  # data: the bytes, (rows, row bytes)
        else:
            back = t
            w.add_tensor(g_name, t)
        if arch == "gemma2" and "norm" in hf_name:
            back = back - 1.0
        if name == "llama" and (".q_proj." in hf_name or ".k_proj." in hf_name):  # back to HF's row order
            heads = c.num_attention_heads if ".q_proj." in hf_name else c.num_key_value_heads
            back = back.reshape(heads, back.shape[0] // heads // 2, 2, -1).swapaxes(1, 2).reshape(back.shape)
        held[hf_name] = back
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return held


K_TYPES = ("Q4_K", "Q5_K", "Q6_K", "Q4_K_M")
# Per K-quant type: where its fp16 super-block scales sit, and a size for them that keeps the weights near 0.05.
K_SCALES = {"Q4_K": ((0, 2), 6e-5), "Q5_K": ((0, 2), 3e-5), "Q6_K": ((208,), 1.5e-5)}


def k_blocks(rng, qtype, rows, cols):
    """rows x cols elements of a K-quant type as random bytes with small finite fp16 super-block scales."""
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    n = rows * cols // block
    raw = rng.integers(0, 256, (n, size), dtype=np.uint8)
    at_list, s = K_SCALES[qtype.name]
    for at in at_list:
        raw[:, at:at + 2] = (rng.standard_normal(n) * s).astype(np.float16).view(np.uint8).reshape(n, 2)
    return raw.reshape(rows, cols // block * size)


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
    wide = type_name in K_TYPES
    model = tiny(arch, wide)
    with torch.no_grad():
        orig = model(torch.tensor(IDS)).logits.numpy()
    if (arch, wide) not in q8_error:
        held8 = write_gguf(tmp_path / "q8.gguf", model, arch, "Q8_0")
        q8_error[arch, wide] = rms(logits_with(model, held8) - orig)
        assert q8_error[arch, wide] > 0
    path = tmp_path / f"{arch}.{type_name}.gguf"
    held = write_gguf(path, model, arch, type_name)
    want = logits_with(model, held)
    assert np.isfinite(want).all() and want.std() > 1e-2, want.std()  # weights that make a real difference
    fp32 = qkv.CausalLM.from_pretrained(path, precision="fp32").logits(IDS)
    np.testing.assert_allclose(fp32, want, rtol=0, atol=1e-4 * float(np.abs(want).max()))
    stored = qkv.CausalLM.from_pretrained(path).logits(IDS)
    assert np.isfinite(stored).all()
    err = rms(stored - want)
    if type_name in ("F32", "F16"):  # no integer product: dequantized float32 rows
        assert err <= 1e-4 * float(np.abs(want).max()), err
    else:  # int8 activations per 32: the same rounding as Q8_0 weights, applied to the activations
        assert 0 < err <= 3.0 * q8_error[arch, wide], (err, q8_error[arch, wide])  # > 0: the integer product ran


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
