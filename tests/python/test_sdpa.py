"""qkv.scaled_dot_product_attention and its backward against torch.nn.functional.scaled_dot_product_attention.

Random configurations cover ranks 2-4, broadcast batch dims, Tq != Tk, D != Dv, bool and float masks of every
broadcast shape, is_causal (top-left) and explicit scales; forward and all three gradients (torch autograd) must
meet the parity rule of torch_parity.assert_parity.
"""
import zlib

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import qkv
from torch_parity import assert_parity, rand, t64, tmask

N_CASES = 48


def sdpa_case(seed):
    rng = np.random.default_rng(1000 + seed)
    B, H = int(rng.integers(1, 4)), int(rng.integers(1, 4))
    Tq, Tk = int(rng.integers(1, 10)), int(rng.integers(1, 10))
    D = int(rng.choice([1, 3, 8, 16]))
    Dv = int(rng.choice([D, 5]))
    layout = rng.choice(["bhtd", "btd", "td", "broadcast_kv", "broadcast_q"])
    if layout == "bhtd":
        qs, ks, vs = (B, H, Tq, D), (B, H, Tk, D), (B, H, Tk, Dv)
    elif layout == "btd":
        qs, ks, vs = (B, Tq, D), (B, Tk, D), (B, Tk, Dv)
    elif layout == "td":
        qs, ks, vs = (Tq, D), (Tk, D), (Tk, Dv)
    elif layout == "broadcast_kv":  # one K/V head shared by every query head
        qs, ks, vs = (B, H, Tq, D), (B, 1, Tk, D), (1, 1, Tk, Dv)
    else:
        qs, ks, vs = (1, H, Tq, D), (B, H, Tk, D), (B, H, Tk, Dv)
    scale = [None, 0.25, 1.0][int(rng.integers(3))]
    # Inputs sized so that the logits q.k*scale have standard deviation `logit_std` (1 is what trained models see;
    # 3 gives |logits| up to ~12). Larger logits: test_backward_error_with_large_logits_follows_the_lse_model.
    logit_std = float(rng.choice([0.3, 1.0, 3.0]))
    amp = np.sqrt(logit_std / (np.sqrt(D) * (scale if scale is not None else 1.0 / np.sqrt(D))))
    q, k, v = rand(rng, *qs, scale=amp), rand(rng, *ks, scale=amp), rand(rng, *vs)
    lead = np.broadcast_shapes(qs[:-2], ks[:-2], vs[:-2])
    kind = rng.choice(["none", "bool", "float", "causal"])
    mask = None
    if kind in ("bool", "float"):
        shapes = [(Tq, Tk), (1, Tk), lead + (Tq, Tk)]
        if len(lead) == 2:
            shapes += [(lead[0], 1, Tq, Tk), (1, lead[1], Tq, Tk), (Tq, 1)]
        mshape = shapes[int(rng.integers(len(shapes)))]
        if mshape == (Tq, 1):  # keeps or drops whole rows... of one column: make it broadcast over keys safely
            mshape = (Tq, Tk)
        if kind == "bool":
            mask = rng.random(mshape) < 0.7
            mask[..., 0] = True  # every row keeps key 0: no fully masked rows here
        else:
            mask = rng.standard_normal(mshape).astype(np.float32)
            mask[rng.random(mshape) < 0.2] = -np.inf
            mask[..., 0] = 0.0
    g = rand(rng, *(lead + (Tq, Dv)))
    return q, k, v, mask, kind == "causal", scale, g


def torch_sdpa(q, k, v, mask, causal, scale, g, dtype):
    tq, tk, tv = (torch.from_numpy(np.asarray(a, np.float64)).to(dtype).requires_grad_() for a in (q, k, v))
    out = F.scaled_dot_product_attention(tq, tk, tv, attn_mask=tmask(mask, dtype), is_causal=causal, scale=scale)
    out.backward(torch.from_numpy(g.astype(np.float64)).to(dtype))
    return [t.detach().numpy() for t in (out, tq.grad, tk.grad, tv.grad)]


@pytest.mark.parametrize("seed", range(N_CASES))
def test_forward_and_backward_match_torch_on_random_configurations(seed):
    q, k, v, mask, causal, scale, g = sdpa_case(seed)
    ref64 = torch_sdpa(q, k, v, mask, causal, scale, g, torch.float64)
    ref32 = torch_sdpa(q, k, v, mask, causal, scale, g, torch.float32)
    out = qkv.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, scale=scale)
    grads = qkv.scaled_dot_product_attention_backward(q, k, v, g, attn_mask=mask, is_causal=causal, scale=scale)
    # Gradients can cancel to exactly 0 (one key: softmax is constant); measure them on the scale of all three.
    grad_scale = max(float(np.max(np.abs(r))) for r in ref64[1:])
    for i, (name, got, r64, r32) in enumerate(zip(("out", "grad_q", "grad_k", "grad_v"), (out, *grads), ref64,
                                                  ref32)):
        assert_parity(f"sdpa[{seed}].{name}", got, r64, r32, magnitude=grad_scale if i else None)


def test_causal_is_top_left_when_tq_differs_from_tk():
    rng = np.random.default_rng(5)
    for tq, tk in ((3, 7), (7, 3)):
        q, k, v = rand(rng, 2, tq, 4), rand(rng, 2, tk, 4), rand(rng, 2, tk, 4)
        top_left = np.tril(np.ones((tq, tk), bool))
        np.testing.assert_array_equal(qkv.scaled_dot_product_attention(q, k, v, is_causal=True),
                                      qkv.scaled_dot_product_attention(q, k, v, attn_mask=top_left))
        ref = F.scaled_dot_product_attention(t64(q), t64(k), t64(v), is_causal=True).numpy()
        np.testing.assert_allclose(qkv.scaled_dot_product_attention(q, k, v, is_causal=True), ref, atol=1e-5)


@pytest.mark.parametrize("mask_dtype", ["bool", "float"])
def test_fully_masked_row_is_zero_not_nan_in_output_and_gradients(mask_dtype):
    rng = np.random.default_rng(6)
    q, k, v, g = rand(rng, 1, 2, 4, 8), rand(rng, 1, 2, 5, 8), rand(rng, 1, 2, 5, 8), rand(rng, 1, 2, 4, 8)
    keep = np.ones((4, 5), bool)
    keep[2] = False  # query row 2 sees no key
    mask = keep if mask_dtype == "bool" else np.where(keep, 0.0, -np.inf).astype(np.float32)
    out = qkv.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    dq, dk, dv = qkv.scaled_dot_product_attention_backward(q, k, v, g, attn_mask=mask)
    assert np.all(out[:, :, 2] == 0.0) and np.all(np.isfinite(out))
    assert np.all(dq[:, :, 2] == 0.0) and np.all(np.isfinite(dk)) and np.all(np.isfinite(dv))
    # PyTorch 2.13's math backend gives 0 here too (its "safe softmax"); older PyTorch and nn.MultiheadAttention
    # give NaN (see test_mha). The other rows still match.
    ref = F.scaled_dot_product_attention(t64(q), t64(k), t64(v), attn_mask=tmask(mask, torch.float64)).numpy()
    np.testing.assert_allclose(out, np.nan_to_num(ref, nan=0.0), atol=1e-5)


def test_dropout_p_outside_zero_one_raises_value_error():
    q = np.zeros((1, 2, 4), np.float32)
    for p in (-0.1, 1.0, float("nan")):
        with pytest.raises(ValueError, match=r"\[scaled_dot_product_attention\] dropout_p must be in \[0, 1\)"):
            qkv.scaled_dot_product_attention(q, q, q, dropout_p=p)
    assert qkv.scaled_dot_product_attention(q, q, q, dropout_p=0.0).shape == (1, 2, 4)
    assert qkv.scaled_dot_product_attention(q, q, q, dropout_p=0.1).shape == (1, 2, 4)


def test_attn_mask_with_is_causal_combines_both_as_torch_forward_and_backward():
    rng = np.random.default_rng(8)
    q, k, v, g = rand(rng, 2, 5, 4), rand(rng, 2, 7, 4), rand(rng, 2, 7, 3), rand(rng, 2, 5, 3)
    for mask in (rng.random((5, 7)) < 0.6, rng.standard_normal((2, 5, 7)).astype(np.float32)):
        mask[..., 0] = True if mask.dtype == bool else 0.0
        tq, tk, tv = (t64(x).requires_grad_(True) for x in (q, k, v))
        # torch 2.13's fused CPU kernel folds the top-left causal mask into attn_mask (its math path raises).
        causal = torch.ones(5, 7, dtype=torch.bool).tril()
        tm = tmask(mask, torch.float64)
        tm = tm & causal if tm.dtype == torch.bool else tm.masked_fill(~causal, float("-inf"))
        ref = F.scaled_dot_product_attention(tq, tk, tv, attn_mask=tm)
        ref.backward(t64(g))
        out = qkv.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=True)
        np.testing.assert_allclose(out, ref.detach().numpy(), rtol=1e-5, atol=1e-6)
        grads = qkv.scaled_dot_product_attention_backward(q, k, v, g, attn_mask=mask, is_causal=True)
        for got, t in zip(grads, (tq, tk, tv)):
            np.testing.assert_allclose(got, t.grad.numpy(), rtol=1e-4, atol=1e-5)


def test_bool_mask_true_takes_part_and_float_mask_is_added():
    rng = np.random.default_rng(7)
    q, k, v = rand(rng, 3, 4), rand(rng, 6, 4), rand(rng, 6, 2)
    keep = rng.random((3, 6)) < 0.5
    keep[:, 1] = True
    additive = np.where(keep, 0.0, -np.inf).astype(np.float32)
    np.testing.assert_allclose(qkv.scaled_dot_product_attention(q, k, v, attn_mask=keep),
                               qkv.scaled_dot_product_attention(q, k, v, attn_mask=additive), atol=1e-6)
    # A keep-everything bool mask changes nothing; a constant float mask changes nothing (softmax shift).
    plain = qkv.scaled_dot_product_attention(q, k, v)
    np.testing.assert_allclose(qkv.scaled_dot_product_attention(q, k, v, attn_mask=np.ones((3, 6), bool)), plain,
                               atol=1e-6)
    np.testing.assert_allclose(qkv.scaled_dot_product_attention(q, k, v, attn_mask=np.full((3, 6), 3.0, np.float32)),
                               plain, atol=1e-5)


@pytest.mark.parametrize("variant", ["float64", "float16", "int", "fortran", "transposed_view", "big_endian"])
def test_other_dtypes_and_layouts_are_converted(variant):
    rng = np.random.default_rng(8)
    q, k, v = rand(rng, 2, 5, 4), rand(rng, 2, 6, 4), rand(rng, 2, 6, 3)
    if variant == "float16":
        q, k, v = (a.astype(np.float16).astype(np.float32) for a in (q, k, v))
    if variant == "int":
        q, k, v = (np.round(a * 3).astype(np.float32) for a in (q, k, v))
    ref = qkv.scaled_dot_product_attention(q, k, v)
    convert = {
        "float64": lambda a: a.astype(np.float64),
        "float16": lambda a: a.astype(np.float16),
        "int": lambda a: a.astype(np.int32),
        "fortran": np.asfortranarray,
        "transposed_view": lambda a: np.ascontiguousarray(a.transpose(0, 2, 1)).transpose(0, 2, 1),
        "big_endian": lambda a: a.astype(">f4"),
    }[variant]
    got = qkv.scaled_dot_product_attention(convert(q), convert(k), convert(v))
    assert got.dtype == np.float32 and got.flags["C_CONTIGUOUS"]
    np.testing.assert_allclose(got, ref, rtol=1e-6, atol=1e-6)


def test_float32_input_is_not_modified_and_read_only_input_works():
    rng = np.random.default_rng(9)
    q = rand(rng, 2, 3, 4)
    before = q.copy()
    q.setflags(write=False)
    out = qkv.scaled_dot_product_attention(q, q, q)
    np.testing.assert_array_equal(q, before)
    assert out.shape == (2, 3, 4) and not np.shares_memory(out, q)


def test_gil_is_released_during_compute():
    import threading
    import time

    # A call long enough (>= 0.15 s) that holding the GIL through it would show as a pause of the main thread.
    rng = np.random.default_rng(10)
    T = 256
    while True:
        q = rand(rng, 1, 4, T, 64)
        t0 = time.perf_counter()
        qkv.scaled_dot_product_attention(q, q, q)
        if time.perf_counter() - t0 >= 0.15 or T >= 16384:
            break
        T *= 2
    span = {}
    done = threading.Event()

    def work():
        span["t0"] = time.perf_counter()
        qkv.scaled_dot_product_attention(q, q, q)
        span["t1"] = time.perf_counter()
        done.set()

    worker = threading.Thread(target=work)
    gaps = []
    last = time.perf_counter()
    worker.start()
    while not done.is_set():
        now = time.perf_counter()
        if now - last > 0.02:
            gaps.append((last, now))
        last = now
    worker.join()
    call = span["t1"] - span["t0"]
    # The main thread's longest pause while the call ran; with the GIL held it would be the whole call.
    longest = max([min(b, span["t1"]) - max(a, span["t0"]) for a, b in gaps] + [0.0])
    assert longest < 0.5 * call, f"main thread paused {longest:.3f} s during a {call:.3f} s call"


def test_backward_error_with_large_logits_follows_the_lse_model():
    # The backward recomputes P = exp(s - lse) from the forward's float32 log-sum-exp (as FlashAttention does), so P
    # carries a relative error of about |lse|·eps32, where PyTorch's math backend keeps the forward's P. With
    # logits ~ 50 this makes qkv's gradients ~10-50x less accurate than PyTorch float32's (still ~1e-5 relative);
    # the bound below is that error model. The forward keeps the row max separately and is unaffected.
    rng = np.random.default_rng(11)
    q, k, v, g = rand(rng, 2, 2, 6, 16, scale=4.0), rand(rng, 2, 2, 9, 16, scale=4.0), rand(rng, 2, 2, 9, 8), \
        rand(rng, 2, 2, 6, 8)
    ref64 = torch_sdpa(q, k, v, None, False, None, g, torch.float64)
    ref32 = torch_sdpa(q, k, v, None, False, None, g, torch.float32)
    s = (q.astype(np.float64) @ np.swapaxes(k, -1, -2).astype(np.float64)) / 4.0
    max_lse = float(np.max(np.abs(s.max(-1) + np.log(np.exp(s - s.max(-1, keepdims=True)).sum(-1)))))
    assert max_lse > 30.0  # the regime this test is about
    assert_parity("sdpa_large_logits.out", qkv.scaled_dot_product_attention(q, k, v), ref64[0], ref32[0])
    grads = qkv.scaled_dot_product_attention_backward(q, k, v, g)
    eps32 = float(np.finfo(np.float32).eps)
    grad_scale = max(float(np.max(np.abs(r))) for r in ref64[1:])
    for name, got, r64 in zip(("grad_q", "grad_k", "grad_v"), grads, ref64[1:]):
        err = float(np.max(np.abs(got - r64)))
        assert err <= 16 * max_lse * eps32 * grad_scale, f"{name}: {err:.3g} (|lse| {max_lse:.3g})"


def test_parity_rule_rejects_a_result_off_by_more_than_float32_noise():
    q, k, v, mask, causal, scale, g = sdpa_case(0)
    ref64 = torch_sdpa(q, k, v, mask, causal, scale, g, torch.float64)[0]
    ref32 = torch_sdpa(q, k, v, mask, causal, scale, g, torch.float32)[0]
    out = qkv.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, scale=scale)
    assert_parity("sdpa.self_check", out, ref64, ref32)
    bumped = out.copy()
    bumped.flat[0] += 1e-4 * max(1.0, float(np.max(np.abs(ref64))))
    with pytest.raises(AssertionError, match="exceeds"):
        assert_parity("sdpa.self_check_bumped", bumped, ref64, ref32)


# ----- the attention variants: enable_gqa (native), window_size, softcap ----------------------------------------

def torch_variant(q, k, v, g, dtype, causal=False, window=(-1, -1), softcap=0.0, enable_gqa=False):
    """The variants written out in torch: K/V repeated per group, the window as an explicit mask, tanh capping."""
    tq, tk, tv = (torch.from_numpy(np.asarray(a, np.float64)).to(dtype).requires_grad_() for a in (q, k, v))
    kk, vv = tk, tv
    if enable_gqa:
        group = tq.shape[-3] // tk.shape[-3]
        kk, vv = tk.repeat_interleave(group, dim=-3), tv.repeat_interleave(group, dim=-3)
    s = tq @ kk.transpose(-1, -2) / np.sqrt(q.shape[-1])
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    Tq, Tk = q.shape[-2], k.shape[-2]
    i = torch.arange(Tq)[:, None]
    j = torch.arange(Tk)[None, :]
    keep = torch.ones(Tq, Tk, dtype=torch.bool)
    if causal:
        keep &= j <= i
    if window[0] >= 0:
        keep &= j >= i + Tk - Tq - window[0]
    if window[1] >= 0:
        keep &= j <= i + Tk - Tq + window[1]
    s = s.masked_fill(~keep, float("-inf"))
    w = torch.softmax(s, -1).nan_to_num(0.0)  # a row that sees no key: 0
    out = w @ vv
    out.backward(torch.from_numpy(g.astype(np.float64)).to(dtype))
    return [t.detach().numpy() for t in (out, tq.grad, tk.grad, tv.grad)]


VARIANTS = {
    "gqa": dict(qs=(2, 8, 11, 16), ks=(2, 2, 13, 16), enable_gqa=True),
    "mqa_causal": dict(qs=(1, 4, 9, 8), ks=(1, 1, 9, 8), enable_gqa=True, causal=True),
    "window_left": dict(qs=(2, 2, 17, 8), ks=(2, 2, 17, 8), window=(3, 0)),
    "window_both_tq_lt_tk": dict(qs=(1, 2, 5, 8), ks=(1, 2, 21, 8), window=(4, 2)),
    "window_rows_see_nothing": dict(qs=(1, 2, 12, 8), ks=(1, 2, 4, 8), window=(1, 0)),
    "window_causal": dict(qs=(1, 3, 19, 8), ks=(1, 3, 19, 8), window=(5, 3), causal=True),
    "softcap": dict(qs=(2, 2, 9, 16), ks=(2, 2, 12, 16), softcap=0.7),
    "all_three": dict(qs=(1, 6, 15, 16), ks=(1, 2, 15, 16), enable_gqa=True, window=(4, -1), softcap=2.0,
                      causal=True),
}


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_variants_match_torch_written_out_forward_and_backward(name):
    c = VARIANTS[name]
    rng = np.random.default_rng(zlib.crc32(name.encode()) % 997)  # hash() differs per process
    qs, ks = c["qs"], c["ks"]
    q, k, v = rand(rng, *qs, scale=1.5), rand(rng, *ks, scale=1.5), rand(rng, *ks)
    g = rand(rng, *qs)
    opts = dict(causal=c.get("causal", False), window=c.get("window", (-1, -1)), softcap=c.get("softcap", 0.0),
                enable_gqa=c.get("enable_gqa", False))
    ref64 = torch_variant(q, k, v, g, torch.float64, **opts)
    ref32 = torch_variant(q, k, v, g, torch.float32, **opts)
    kw = dict(is_causal=opts["causal"], window_size=opts["window"], softcap=opts["softcap"],
              enable_gqa=opts["enable_gqa"])
    out = qkv.scaled_dot_product_attention(q, k, v, **kw)
    grads = qkv.scaled_dot_product_attention_backward(q, k, v, g, **kw)
    assert grads[1].shape == k.shape and grads[2].shape == v.shape
    grad_scale = max(float(np.max(np.abs(r))) for r in ref64[1:])
    for i, (what, got, r64, r32) in enumerate(zip(("out", "grad_q", "grad_k", "grad_v"), (out, *grads), ref64,
                                                  ref32)):
        assert_parity(f"{name}.{what}", got, r64, r32, magnitude=grad_scale if i else None)


def test_enable_gqa_matches_torch_enable_gqa():
    rng = np.random.default_rng(5)
    q, k, v = rand(rng, 2, 6, 10, 8), rand(rng, 2, 3, 14, 8), rand(rng, 2, 3, 14, 4)
    tq, tk, tv = (torch.from_numpy(a.astype(np.float64)).requires_grad_() for a in (q, k, v))
    ref = F.scaled_dot_product_attention(tq, tk, tv, is_causal=True, enable_gqa=True)
    g = rand(rng, *ref.shape)
    ref.backward(torch.from_numpy(g.astype(np.float64)))
    got = qkv.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    dq, dk, dv = qkv.scaled_dot_product_attention_backward(q, k, v, g, is_causal=True, enable_gqa=True)
    for what, a, r in (("out", got, ref), ("dq", dq, tq.grad), ("dk", dk, tk.grad), ("dv", dv, tv.grad)):
        np.testing.assert_allclose(a, r.detach().numpy(), rtol=1e-4, atol=1e-5, err_msg=what)


@pytest.mark.parametrize("kwargs, message", [
    (dict(window_size=(-2, 0)), r"\[scaled_dot_product_attention\] window_size \(-2, 0\) must be >= -1"),
    (dict(softcap=-1.0), r"\[scaled_dot_product_attention\] softcap must be a finite float >= 0"),
    (dict(softcap=float("nan")), r"\[scaled_dot_product_attention\] softcap must be a finite float >= 0"),
])
def test_bad_window_or_softcap_raise_one_line_value_error(kwargs, message):
    z = np.zeros((1, 2, 3, 4), np.float32)
    with pytest.raises(ValueError, match=message) as e:
        qkv.scaled_dot_product_attention(z, z, z, **kwargs)
    assert "\n" not in str(e.value)
