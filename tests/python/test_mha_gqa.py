"""qkv.MultiheadAttention(num_kv_heads=...) (grouped-query attention) against a PyTorch reference written with
torch.nn.functional.scaled_dot_product_attention(enable_gqa=True) on the same random weights.

Random configurations: self- and cross-attention, kdim/vdim, bias on/off, key_padding_mask, attn_mask ((Tq, Tk) or
(B*H, Tq, Tk)), is_causal, need_weights averaged or per query head. Outputs and weights meet torch_parity's
assert_parity. Backward: the same reference with its attention on qkv.torch.scaled_dot_product_attention
(enable_gqa=True, qkv's fused GQA backward) against torch's, gradients of the inputs and of every weight. The
parameter shapes, the repr and the errors for bad num_kv_heads.
"""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import qkv
import qkv.torch as qt
from torch_parity import assert_parity, rand

N_CASES = 16


def gqa_case(seed):
    rng = np.random.default_rng(7000 + seed)
    H = int(rng.choice([2, 4, 6, 8]))
    Hkv = int(rng.choice([h for h in range(1, H) if H % h == 0]))
    E = H * int(rng.choice([2, 4, 8]))
    B, Tq = int(rng.integers(1, 4)), int(rng.integers(1, 8))
    self_attn = bool(rng.random() < 0.5)
    kdim = vdim = None
    if not self_attn and rng.random() < 0.5:
        kdim, vdim = int(rng.integers(1, 12)), int(rng.integers(1, 12))
    Tk = Tq if self_attn else int(rng.integers(1, 8))
    cfg = dict(embed_dim=E, num_heads=H, num_kv_heads=Hkv, bias=bool(rng.random() < 0.7), kdim=kdim, vdim=vdim)
    x = rand(rng, B, Tq, E)
    inputs = (x, x, x) if self_attn else (x, rand(rng, B, Tk, kdim or E), rand(rng, B, Tk, vdim or E))
    # Masks never block key 0 (nor does a top-left causal mask), so no query row is fully masked.
    kpm = None
    if rng.random() < 0.5:
        kpm = rng.random((B, Tk)) < 0.3
        kpm[:, 0] = False
    am = None
    if rng.random() < 0.5:
        am = rng.standard_normal((Tq, Tk) if rng.random() < 0.5 else (B * H, Tq, Tk)).astype(np.float32)
        am[rng.random(am.shape) < 0.2] = -np.inf
        am[..., 0] = 0.0
    call = dict(key_padding_mask=kpm, attn_mask=am, need_weights=bool(rng.random() < 0.7),
                average_attn_weights=bool(rng.random() < 0.5), is_causal=self_attn and bool(rng.random() < 0.4))
    return cfg, inputs, call


def random_module(cfg, seed):
    """qkv's module with every parameter drawn from N(0, 0.5^2) (biases included), and those parameters."""
    mine = qkv.MultiheadAttention(**cfg, batch_first=True, seed=seed)
    rng = np.random.default_rng(seed)
    params = {name: (0.5 * rng.standard_normal(np.shape(p))).astype(np.float32)
              for name, p in mine.state_dict().items()}
    mine.load_state_dict(params)
    return mine, params


def additive_mask(call, B, H, Tq, Tk):
    """The MHA's masks as one additive (B, H, Tq, Tk) float64 array (bool True = blocked), or None."""
    total = np.zeros((B, H, Tq, Tk))
    kpm, am = call["key_padding_mask"], call["attn_mask"]
    if kpm is not None:
        total += np.where(kpm, -np.inf, 0.0)[:, None, None, :]
    if am is not None:
        total += am.reshape(B, H, Tq, Tk) if am.ndim == 3 else am
    if call["is_causal"]:
        total += np.where(np.tril(np.ones((Tq, Tk), bool)), 0.0, -np.inf)
    return total if (kpm is not None or am is not None or call["is_causal"]) else None


def reference(params, inputs, cfg, call, dtype, sdpa=F.scaled_dot_product_attention, grad=False):
    """The GQA MHA written out in torch: projections, heads, sdpa(enable_gqa=True), out_proj. -> (out, weights,
    the leaf tensors (inputs, params) when grad)."""
    E, H, Hkv = cfg["embed_dim"], cfg["num_heads"], cfg["num_kv_heads"]
    D = E // H
    Ekv = Hkv * D
    p = {k: torch.tensor(v, dtype=dtype, requires_grad=grad) for k, v in params.items()}
    distinct = []  # the inputs once each (self-attention passes one array three times)
    for a in inputs:
        if not any(a is d for d in distinct):
            distinct.append(a)
    xs = [torch.tensor(a, dtype=dtype, requires_grad=grad) for a in distinct]
    q_in, k_in, v_in = (xs[next(i for i, d in enumerate(distinct) if d is a)] for a in inputs)
    if "in_proj_weight" in p:
        w = p["in_proj_weight"]
        wq, wk, wv = w[:E], w[E:E + Ekv], w[E + Ekv:]
    else:
        wq, wk, wv = p["q_proj_weight"], p["k_proj_weight"], p["v_proj_weight"]
    b = p.get("in_proj_bias")
    bq, bk, bv = (None, None, None) if b is None else (b[:E], b[E:E + Ekv], b[E + Ekv:])
    B, Tq, Tk = q_in.shape[0], q_in.shape[1], k_in.shape[1]
    q = F.linear(q_in, wq, bq).view(B, Tq, H, D).transpose(1, 2)
    k = F.linear(k_in, wk, bk).view(B, Tk, Hkv, D).transpose(1, 2)
    v = F.linear(v_in, wv, bv).view(B, Tk, Hkv, D).transpose(1, 2)
    mask64 = additive_mask(call, B, H, Tq, Tk)
    mask = None if mask64 is None else torch.tensor(mask64, dtype=dtype)
    out = sdpa(q, k, v, attn_mask=mask, enable_gqa=True)
    out = F.linear(out.transpose(1, 2).reshape(B, Tq, E), p["out_proj.weight"], p.get("out_proj.bias"))
    scores = q @ k.repeat_interleave(H // Hkv, dim=1).transpose(-1, -2) / D ** 0.5
    weights = torch.softmax(scores if mask is None else scores + mask, dim=-1)
    if call["average_attn_weights"]:
        weights = weights.mean(dim=1)
    return out, weights, (xs, p)


@pytest.mark.parametrize("seed", range(N_CASES))
def test_forward_matches_sdpa_enable_gqa_reference(seed):
    cfg, inputs, call = gqa_case(seed)
    mine, params = random_module(cfg, seed)
    out, w = mine(*inputs, **call)
    out64, w64, _ = reference(params, inputs, cfg, call, torch.float64)
    out32, w32, _ = reference(params, inputs, cfg, call, torch.float32)
    assert_parity(f"gqa[{seed}].out", out, out64.numpy(), out32.numpy())
    if call["need_weights"]:
        assert_parity(f"gqa[{seed}].weights", w, w64.numpy(), w32.numpy())
    else:
        assert w is None


@pytest.mark.parametrize("seed", range(8))
def test_backward_on_qkv_gqa_kernel_matches_torch(seed):
    cfg, inputs, call = gqa_case(seed)
    _, params = random_module(cfg, seed)
    r = np.random.default_rng(seed).standard_normal((inputs[0].shape[0], inputs[0].shape[1], cfg["embed_dim"]))

    def grads(dtype, sdpa):
        out, _, (xs, p) = reference(params, inputs, cfg, call, dtype, sdpa=sdpa, grad=True)
        (out * torch.tensor(r, dtype=dtype)).sum().backward()
        return [t.grad.numpy() for t in xs] + [p[k].grad.numpy() for k in sorted(p)], sorted(p)

    got, names = grads(torch.float32, qt.scaled_dot_product_attention)
    g64, _ = grads(torch.float64, F.scaled_dot_product_attention)
    g32, _ = grads(torch.float32, F.scaled_dot_product_attention)
    labels = [f"input{i}" for i in range(len(got) - len(names))] + names
    # The fused backward recomputes the probabilities block by block and sums in another order than torch's math
    # path: its float32 error is held to 1e-5 of the gradient's largest entry, beside 4x torch float32's.
    for label, a, b64, b32 in zip(labels, got, g64, g32):
        assert_parity(f"gqa[{seed}].grad[{label}]", a, b64, b32, atol_rel=1e-5)


def test_parameter_shapes_repr_and_default():
    m = qkv.MultiheadAttention(16, 4, num_kv_heads=2, seed=0)
    assert m.num_kv_heads == 2 and m.num_heads == 4 and m.head_dim == 4
    shapes = {k: np.shape(v) for k, v in m.state_dict().items()}
    assert shapes == {"in_proj_weight": (32, 16), "in_proj_bias": (32,), "out_proj.weight": (16, 16),
                      "out_proj.bias": (16,)}
    assert "num_kv_heads=2" in repr(m)
    s = qkv.MultiheadAttention(16, 4, kdim=5, vdim=6, num_kv_heads=1, seed=0)
    assert {k: np.shape(v) for k, v in s.state_dict().items()}["k_proj_weight"] == (4, 5)
    plain = qkv.MultiheadAttention(16, 4, seed=3)
    assert plain.num_kv_heads == 4 and "num_kv_heads" not in repr(plain)
    same = qkv.MultiheadAttention(16, 4, num_kv_heads=4, seed=3)
    x = rand(np.random.default_rng(1), 2, 3, 16)
    np.testing.assert_array_equal(plain(x, x, x)[0], same(x, x, x)[0])
    # torch's (3E, E) packing does not fit the grouped module
    with pytest.raises(ValueError, match="in_proj_weight"):
        m.load_state_dict(plain.state_dict())


@pytest.mark.parametrize("bad", [0, -1, 3, 8])
def test_bad_num_kv_heads_raise_value_error(bad):
    with pytest.raises(ValueError, match=rf"\[MultiheadAttention\] num_kv_heads {bad} must be >= 1 and divide "
                                         r"num_heads 4"):
        qkv.MultiheadAttention(16, 4, num_kv_heads=bad)


def test_num_kv_heads_type_and_size_errors():
    with pytest.raises(TypeError, match="num_kv_heads"):
        qkv.MultiheadAttention(16, 4, num_kv_heads=2.0)
    with pytest.raises(TypeError, match="num_kv_heads"):
        qkv.MultiheadAttention(16, 4, num_kv_heads=True)
    with pytest.raises(ValueError, match="num_kv_heads"):
        qkv.MultiheadAttention(16, 4, num_kv_heads=2 ** 70)
