"""Training parity with PyTorch 2.13: the same weights, inputs and upstream gradients give the same outputs, parameter
gradients and input gradients (MHA, encoder/decoder layers, GRU, LSTM, a small nn.Transformer, cross-entropy), and
SGD / Adam / AdamW take the same steps as torch.optim. The C++ side runs through the
test-only module qkv_probes (tests/python/probes)."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import qkv_probes as AG  # the gradient probes (tests/python/probes, built beside the package)
torch.set_num_threads(2)

# float32 on both sides, different summation orders: scaled by each tensor's largest entry.
GRAD_RTOL, GRAD_ATOL = 2e-4, 2e-5
# Optimizer chains: the same float32 operations, fused where PyTorch fuses them. SGD comes out bit-identical; Adam and
# AdamW differ only through PyTorch's vectorised sqrt, which is off by one ulp on some elements.
STEP_RTOL, STEP_ATOL = 1e-6, 1e-7


def assert_close(name, ours, ref, rtol=GRAD_RTOL, atol=GRAD_ATOL):
    ref = np.asarray(ref, dtype=np.float64)
    scale = max(1.0, float(np.abs(ref).max())) if ref.size else 1.0
    np.testing.assert_allclose(ours, ref, rtol=rtol, atol=atol * scale, err_msg=name)


def state_dict(module):
    return {k: v.detach().numpy().copy() for k, v in module.state_dict().items()}


def randomize(module, seed, std=0.3):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * std)


def leaves(arrays):
    return {k: torch.from_numpy(v.copy()).requires_grad_(True) for k, v in arrays.items()}


def run_torch(module, inputs, forward, grad_outputs):
    """forward(tensors) -> {name: output}; backpropagates sum(<output, grad>) like module_grads."""
    module.zero_grad()
    outs = forward(inputs)
    total = sum((outs[k] * torch.from_numpy(g)).sum() for k, g in grad_outputs.items())
    total.backward()
    params = {k: (p.grad.numpy() if p.grad is not None else np.zeros(p.shape, np.float32))
              for k, p in module.named_parameters()}
    return ({k: v.detach().numpy() for k, v in outs.items()}, params,
            {k: v.grad.numpy() for k, v in inputs.items()})


def compare(kind, config, module, arrays, forward, options=None, out_names=("output",), seed=0):
    rng = np.random.default_rng(seed)
    t_inputs = leaves(arrays)
    with torch.no_grad():
        shapes = {k: v.shape for k, v in forward(leaves(arrays)).items()}
    grads = {k: rng.standard_normal(shapes[k]).astype(np.float32) for k in out_names}
    ref_out, ref_params, ref_inputs = run_torch(module, t_inputs, forward, grads)
    out, params, inputs = AG.module_grads(kind, config, state_dict(module), arrays, grads, options or {})
    for k in out_names:
        assert_close(f"output {k}", out[k], ref_out[k])
    assert set(params) == set(ref_params)
    for k in ref_params:
        assert_close(f"grad {k}", params[k], ref_params[k])
    for k in ref_inputs:
        assert_close(f"input grad {k}", inputs[k], ref_inputs[k])


def rand(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def causal_block(t):
    return np.triu(np.ones((t, t), dtype=bool), k=1)  # True = blocked (PyTorch's bool attn_mask)


def padding(b, t, lengths):
    m = np.zeros((b, t), dtype=bool)
    for i, n in enumerate(lengths):
        m[i, n:] = True
    return m


# --- MultiheadAttention -------------------------------------------------------------------------------------------

def test_mha_self_attention_packed_with_padding_and_causal():
    torch.manual_seed(0)
    m = torch.nn.MultiheadAttention(16, 4, batch_first=True)
    randomize(m, 1)
    rng = np.random.default_rng(2)
    x = rand(rng, 3, 6, 16)
    kpm = padding(3, 6, [6, 4, 5])
    cm = causal_block(6)

    def fwd(t):
        q = t["query"]
        return {"output": m(q, q, q, key_padding_mask=torch.from_numpy(kpm), attn_mask=torch.from_numpy(cm),
                            need_weights=False)[0]}

    compare("mha", {"embed_dim": 16, "num_heads": 4}, m, {"query": x}, fwd,
            {"key_padding_mask": kpm, "is_causal": True})


def test_mha_cross_attention_unpacked_with_additive_mask():
    torch.manual_seed(0)
    m = torch.nn.MultiheadAttention(8, 2, batch_first=True, kdim=6, vdim=5)
    randomize(m, 3)
    rng = np.random.default_rng(4)
    arrays = {"query": rand(rng, 2, 4, 8), "key": rand(rng, 2, 7, 6), "value": rand(rng, 2, 7, 5)}
    add = rand(rng, 4, 7)

    def fwd(t):
        return {"output": m(t["query"], t["key"], t["value"], attn_mask=torch.from_numpy(add), need_weights=False)[0]}

    compare("mha", {"embed_dim": 8, "num_heads": 2, "kdim": 6, "vdim": 5}, m, arrays, fwd, {"attn_mask": add})


# --- transformer layers --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("norm_first,activation", [(False, "relu"), (True, "gelu")])
def test_encoder_layer(norm_first, activation):
    torch.manual_seed(0)
    cfg = {"d_model": 16, "nhead": 4, "dim_feedforward": 32, "norm_first": norm_first, "activation": activation}
    m = torch.nn.TransformerEncoderLayer(dropout=0.0, batch_first=True, **cfg)
    randomize(m, 5)
    m.eval()
    rng = np.random.default_rng(6)
    x = rand(rng, 2, 5, 16)
    kpm = padding(2, 5, [5, 3])

    def fwd(t):
        return {"output": m(t["src"], src_mask=torch.from_numpy(causal_block(5)), is_causal=True,
                            src_key_padding_mask=torch.from_numpy(kpm))}

    compare("encoder_layer", cfg, m, {"src": x}, fwd, {"is_causal": True, "src_key_padding_mask": kpm})


@pytest.mark.parametrize("norm_first", [False, True])
def test_decoder_layer(norm_first):
    torch.manual_seed(0)
    cfg = {"d_model": 16, "nhead": 2, "dim_feedforward": 24, "norm_first": norm_first, "activation": "relu"}
    m = torch.nn.TransformerDecoderLayer(dropout=0.0, batch_first=True, **cfg)
    randomize(m, 7)
    m.eval()
    rng = np.random.default_rng(8)
    arrays = {"tgt": rand(rng, 2, 4, 16), "memory": rand(rng, 2, 6, 16)}
    mkpm = padding(2, 6, [6, 2])

    def fwd(t):
        return {"output": m(t["tgt"], t["memory"], tgt_mask=torch.from_numpy(causal_block(4)), tgt_is_causal=True,
                            memory_key_padding_mask=torch.from_numpy(mkpm))}

    compare("decoder_layer", cfg, m, arrays, fwd, {"tgt_is_causal": True, "memory_key_padding_mask": mkpm})


def test_small_full_transformer():
    torch.manual_seed(0)
    cfg = {"d_model": 16, "nhead": 2, "dim_feedforward": 32, "num_encoder_layers": 2, "num_decoder_layers": 2}
    m = torch.nn.Transformer(dropout=0.0, batch_first=True, **cfg)
    m.encoder.enable_nested_tensor = False  # keep padded positions (no nested-tensor fast path)
    randomize(m, 9, std=0.2)
    m.eval()
    rng = np.random.default_rng(10)
    arrays = {"src": rand(rng, 2, 6, 16), "tgt": rand(rng, 2, 5, 16)}
    skpm = padding(2, 6, [6, 4])

    def fwd(t):
        return {"output": m(t["src"], t["tgt"], tgt_mask=torch.from_numpy(causal_block(5)), tgt_is_causal=True,
                            src_key_padding_mask=torch.from_numpy(skpm),
                            memory_key_padding_mask=torch.from_numpy(skpm))}

    compare("transformer", cfg, m, arrays, fwd,
            {"tgt_is_causal": True, "src_key_padding_mask": skpm, "memory_key_padding_mask": skpm})


# --- recurrent layers ----------------------------------------------------------------------------------------------

def test_gru_two_layers_output_and_final_state():
    torch.manual_seed(0)
    m = torch.nn.GRU(5, 6, num_layers=2, batch_first=True)
    rng = np.random.default_rng(11)
    arrays = {"input": rand(rng, 3, 7, 5), "h0": rand(rng, 2, 3, 6)}

    def fwd(t):
        out, h = m(t["input"], t["h0"])
        return {"output": out, "h_n": h}

    compare("gru", {"input_size": 5, "hidden_size": 6, "num_layers": 2}, m, arrays, fwd,
            out_names=("output", "h_n"))


def test_lstm_two_layers_output_and_both_states():
    torch.manual_seed(0)
    m = torch.nn.LSTM(4, 5, num_layers=2, batch_first=True)
    rng = np.random.default_rng(12)
    arrays = {"input": rand(rng, 2, 6, 4), "h0": rand(rng, 2, 2, 5), "c0": rand(rng, 2, 2, 5)}

    def fwd(t):
        out, (h, c) = m(t["input"], (t["h0"], t["c0"]))
        return {"output": out, "h_n": h, "c_n": c}

    compare("lstm", {"input_size": 4, "hidden_size": 5, "num_layers": 2}, m, arrays, fwd,
            out_names=("output", "h_n", "c_n"))


def test_unknown_module_kind_is_a_value_error():
    with pytest.raises(ValueError, match="module_grads"):
        AG.module_grads("conv", {}, {}, {}, {})


# --- cross-entropy --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("smoothing", [0.0, 0.1])
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_cross_entropy_with_ignore_index_and_label_smoothing(smoothing, reduction):
    rng = np.random.default_rng(13)
    logits = rand(rng, 12, 7) * 3
    targets = rng.integers(0, 7, 12)
    targets[[2, 5, 11]] = 0  # padding id
    x = torch.from_numpy(logits.copy()).requires_grad_(True)
    ref = F.cross_entropy(x, torch.from_numpy(targets), ignore_index=0, label_smoothing=smoothing,
                          reduction=reduction)
    ref.backward()
    loss, grad = AG.cross_entropy(logits, targets.tolist(), ignore_index=0, label_smoothing=smoothing,
                                  reduction=reduction)
    assert loss == pytest.approx(ref.item(), rel=1e-5, abs=1e-6)
    assert_close("dlogits", grad, x.grad.numpy(), rtol=1e-5, atol=1e-7)


def test_cross_entropy_bad_target_is_a_value_error():
    with pytest.raises(ValueError, match="cross_entropy"):
        AG.cross_entropy(np.zeros((2, 3), np.float32), [0, 3])


# --- optimizers ---------------------------------------------------------------------------------------------------

OPTIMIZERS = [
    ("sgd", {"lr": 0.1}, lambda ps: torch.optim.SGD(ps, lr=0.1)),
    ("sgd", {"lr": 0.05, "momentum": 0.9, "weight_decay": 0.01},
     lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, weight_decay=0.01)),
    ("sgd", {"lr": 0.05, "momentum": 0.8, "nesterov": True},
     lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.8, nesterov=True)),
    ("adam", {"lr": 1e-2, "weight_decay": 0.1}, lambda ps: torch.optim.Adam(ps, lr=1e-2, weight_decay=0.1)),
    ("adamw", {"lr": 3e-3, "beta1": 0.8, "beta2": 0.99, "weight_decay": 0.05},
     lambda ps: torch.optim.AdamW(ps, lr=3e-3, betas=(0.8, 0.99), weight_decay=0.05)),
    ("adamw", {"lr": 1e-3}, lambda ps: torch.optim.AdamW(ps, lr=1e-3)),
]


@pytest.mark.parametrize("kind,options,make", OPTIMIZERS)
def test_optimizer_steps_match_torch_optim(kind, options, make):
    rng = np.random.default_rng(14)
    # Sizes that are multiples of 32 run entirely through PyTorch's vectorised kernels (no scalar tail).
    start = {"a": rand(rng, 16, 40), "b": rand(rng, 64)}
    grads = [{"a": rand(rng, 16, 40), "b": rand(rng, 64)} for _ in range(5)]
    del grads[2]["b"]  # b has no gradient at step 3: both sides skip it
    params = {k: torch.nn.Parameter(torch.from_numpy(v.copy())) for k, v in start.items()}
    opt = make(list(params.values()))
    ours = AG.optimizer_steps(kind, options, start, grads)
    for step, g in enumerate(grads):
        opt.zero_grad(set_to_none=True)
        for k, v in g.items():
            params[k].grad = torch.from_numpy(v.copy())
        opt.step()
        for k in start:
            assert_close(f"{kind} step {step} {k}", ours[step][k], params[k].detach().numpy(), rtol=STEP_RTOL,
                         atol=STEP_ATOL)
