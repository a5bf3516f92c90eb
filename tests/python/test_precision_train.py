"""Training at bf16 compute against PyTorch 2.13: the bf16 attention backward's error (against float64 autograd) is
within 2x that of torch's bf16 SDPA backward on the same inputs, FlashAttention's rule for low-precision kernels;
the gradients of a MultiheadAttention and an encoder layer at bf16 are within 2x the error of the same modules
under torch.autocast(bfloat16); `qkv train --precision bf16` trains; int8 training is refused in one line."""
import numpy as np
import pytest
import torch

import qkv
import qkv_probes as AG  # the gradient probes (tests/python/probes, built beside the package)
torch.set_num_threads(2)


def rel_err(ours, ref):
    """max |ours - ref| / max |ref|, absolute where the reference is below 1 (a gradient that is exactly 0, as dq
    with a single key, leaves only float32 cancellation)."""
    ref = np.asarray(ref, np.float64)
    return float(np.abs(np.asarray(ours, np.float64) - ref).max() / max(np.abs(ref).max(), 1.0))


CASES = [  # (B, Hq, Hkv, Tq, Tk, D, Dv, mask, causal)
    (1, 2, 2, 1, 1, 8, 8, False, False),
    (2, 3, 3, 17, 17, 64, 64, False, True),
    (1, 4, 4, 9, 33, 32, 16, True, False),
    (2, 2, 2, 40, 40, 64, 64, True, True),
    (1, 1, 1, 5, 70, 48, 48, False, False),
    (1, 4, 2, 23, 23, 64, 64, False, True),
    (1, 2, 2, 64, 96, 128, 128, False, False),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "B{}Hq{}Hkv{}Tq{}Tk{}D{}Dv{}{}{}".format(
    *c[:7], "-mask" if c[7] else "", "-causal" if c[8] else ""))
def test_bf16_attention_backward_error_within_twice_torch_bf16(case):
    b, hq, hkv, tq, tk, d, dv, with_mask, causal = case
    rng = np.random.default_rng(tq * 1000 + tk + hq)
    q = (rng.standard_normal((b, hq, tq, d)) * 2).astype(np.float32)
    k = (rng.standard_normal((b, hkv, tk, d)) * 2).astype(np.float32)
    v = rng.standard_normal((b, hkv, tk, dv)).astype(np.float32)
    g = rng.standard_normal((b, hq, tq, dv)).astype(np.float32)
    keep = None
    if with_mask:
        keep = rng.random((tq, tk)) > 0.3
        keep[np.arange(tq), np.arange(tq) % tk] = True  # no fully masked row
    gqa = hq != hkv
    mask_t = None if keep is None else torch.from_numpy(keep)

    def torch_grads(dtype):
        leaves = [torch.from_numpy(x).to(dtype).requires_grad_(True) for x in (q, k, v)]
        out = torch.nn.functional.scaled_dot_product_attention(*leaves, attn_mask=mask_t, is_causal=causal,
                                                               enable_gqa=gqa)
        out.backward(torch.from_numpy(g).to(dtype))
        return [x.grad.double().numpy() for x in leaves]

    exact = torch_grads(torch.float64)
    theirs = torch_grads(torch.bfloat16)
    ours = qkv.scaled_dot_product_attention_backward(q, k, v, g, attn_mask=keep, is_causal=causal, enable_gqa=gqa,
                                                     precision="bf16")
    fp32 = qkv.scaled_dot_product_attention_backward(q, k, v, g, attn_mask=keep, is_causal=causal, enable_gqa=gqa)
    for name, o, t, f, e in zip(("dq", "dk", "dv"), ours, theirs, fp32, exact):
        assert o.shape == e.shape, name
        ours_err, torch_err = rel_err(o, e), rel_err(t, e)
        assert ours_err <= 2 * torch_err + 1e-6, f"{name}: qkv bf16 error {ours_err:.3g} > 2 x torch bf16 {torch_err:.3g}"
        if np.abs(e).max() >= 1.0:  # the bf16 path did round (the fp32 one is the more accurate)
            assert rel_err(f, e) < ours_err, f"{name}: fp32 error {rel_err(f, e):.3g} >= bf16 error {ours_err:.3g}"


def torch_module(kind, seed):
    torch.manual_seed(seed)
    if kind == "mha":
        m = torch.nn.MultiheadAttention(64, 4, batch_first=True)
    else:
        m = torch.nn.TransformerEncoderLayer(64, 4, dim_feedforward=128, dropout=0.0, batch_first=True)
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(torch.randn(p.shape) * 0.15)
    return m.eval()


@pytest.mark.parametrize("kind,causal", [("mha", False), ("mha", True), ("encoder_layer", False),
                                         ("encoder_layer", True)])
def test_module_gradients_at_bf16_within_twice_torch_autocast(kind, causal):
    m = torch_module(kind, 3)
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 19, 64)).astype(np.float32)
    gout = rng.standard_normal((2, 19, 64)).astype(np.float32)
    mask = torch.nn.Transformer.generate_square_subsequent_mask(19) if causal else None

    def run(module, dtype, autocast):
        module.zero_grad()
        xt = torch.from_numpy(x).to(dtype).requires_grad_(True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            if kind == "mha":
                out = module(xt, xt, xt, attn_mask=None if mask is None else mask.to(dtype), is_causal=causal,
                             need_weights=False)[0]
            else:
                out = module(xt, src_mask=None if mask is None else mask.to(dtype), is_causal=causal)
        (out.to(dtype) * torch.from_numpy(gout).to(dtype)).sum().backward()
        grads = {n: p.grad.double().numpy() for n, p in module.named_parameters()}
        grads["input"] = xt.grad.double().numpy()
        return grads

    exact = run(torch_module(kind, 3).double(), torch.float64, False)
    theirs = run(m, torch.float32, True)
    state = {k: v.detach().numpy().copy() for k, v in m.state_dict().items()}
    config = {"embed_dim": 64, "num_heads": 4} if kind == "mha" else {
        "d_model": 64, "nhead": 4, "dim_feedforward": 128, "dropout": 0.0}
    inputs = {"query": x} if kind == "mha" else {"src": x}
    options = {"precision": "bf16"}
    if causal:
        options["is_causal"] = True
    _, pg, ig = AG.module_grads(kind, config, state, inputs, {"output": gout}, options)
    ours = dict(pg)
    ours["input"] = ig["query" if kind == "mha" else "src"]
    assert set(ours) == set(exact)
    for name in exact:
        ours_err, torch_err = rel_err(ours[name], exact[name]), rel_err(theirs[name], exact[name])
        assert ours_err <= 2 * torch_err + 1e-6, (
            f"{kind} {name}: qkv bf16 error {ours_err:.3g} > 2 x torch autocast {torch_err:.3g}")


def test_int8_training_is_refused_in_one_line():
    m = torch_module("mha", 1)
    state = {k: v.detach().numpy().copy() for k, v in m.state_dict().items()}
    x = np.ones((1, 3, 64), np.float32)
    with pytest.raises(ValueError, match=r"^\[MultiheadAttention\] precision int8 is for inference[^\n]*$"):
        AG.module_grads("mha", {"embed_dim": 64, "num_heads": 4}, state, {"query": x}, {"output": x},
                        {"precision": "int8"})
