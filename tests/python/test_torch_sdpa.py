"""qkv.torch.scaled_dot_product_attention against torch.nn.functional.scaled_dot_product_attention.

Forward and the three gradients (through qkv's fused backward, as a torch custom op) must equal torch's within
rtol 1e-4 for every mask kind, causal, mask + causal, GQA, odd sizes, T = 1, Tq != Tk, broadcast batch dims and
strided (transposed) inputs. Other devices, dtypes, dropout and empty sequences must give torch's own results.
"""
import zlib

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import qkv
import qkv.torch as qt

torch.set_num_threads(2)

RTOL = 1e-4


def assert_close(name, got, ref):
    """|got - ref| <= RTOL * |ref| + RTOL * 1e-1 * max|ref|: relative, with a floor for entries that cancel to ~0.

    The floor is float32's: both sides round, and an entry that cancels (a dq row whose query sees one key) keeps an
    absolute error of a few 1e-7..1e-6 of the tensor's largest entry (qkv's fused backward: 1.46e-6 at max |dq| 1.15
    on one of 900 random bool-mask cases, where torch's was 3.9e-7 against float64)."""
    got = got.detach().double()
    ref = ref.detach().double()
    assert got.shape == ref.shape, f"{name}: shapes {tuple(got.shape)} vs {tuple(ref.shape)}"
    assert torch.isfinite(got).all(), f"{name}: qkv gave non-finite values"
    floor = RTOL * 1e-1 * max(1.0, float(ref.abs().max()) if ref.numel() else 0.0)
    bad = (got - ref).abs() > RTOL * ref.abs() + floor
    assert not bad.any(), f"{name}: {int(bad.sum())} of {got.numel()} entries differ; max |diff| " \
                          f"{float((got - ref).abs().max()):.3g}"


def leaf(gen, *shape, scale=1.0):
    return (torch.randn(*shape, generator=gen) * scale).requires_grad_(True)


def run_both(q, k, v, g, prep=lambda t: t, **kw):
    """(qkv out, grads), (torch out, grads) for the same leaves; prep maps k and v to the views passed."""
    results = []
    for fn in (qt.scaled_dot_product_attention, F.scaled_dot_product_attention):
        for t in (q, k, v):
            t.grad = None
        out = fn(q, prep(k), prep(v), **kw)
        out.backward(g)
        results.append((out.detach().clone(), [t.grad.clone() for t in (q, k, v)]))
    return results


def check_case(name, qs, ks, vs, mask=None, seed=0, **kw):
    gen = torch.Generator().manual_seed(seed)
    q, k, v = leaf(gen, *qs), leaf(gen, *ks), leaf(gen, *vs)
    kw = dict(kw)
    if mask is not None:
        kw["attn_mask"] = mask(gen)
    ref_out = F.scaled_dot_product_attention(q.detach(), k.detach(), v.detach(), **kw)
    g = torch.randn(ref_out.shape, generator=gen)
    (o1, g1), (o2, g2) = run_both(q, k, v, g, **kw)
    assert_close(f"{name} out", o1, o2)
    for label, a, b in zip(("dq", "dk", "dv"), g1, g2):
        assert_close(f"{name} {label}", a, b)


def bool_mask(*shape):
    def make(gen):
        m = torch.rand(*shape, generator=gen) < 0.7
        m[..., 0] = True  # no fully masked row here (tested on its own)
        return m
    return make


def float_mask(*shape):
    def make(gen):
        m = torch.randn(*shape, generator=gen)
        m[torch.rand(*shape, generator=gen) < 0.2] = float("-inf")
        m[..., 0] = 0.0
        return m
    return make


CASES = {
    "plain": dict(qs=(2, 3, 16, 8), ks=(2, 3, 16, 8), vs=(2, 3, 16, 8)),
    "bool_mask": dict(qs=(2, 3, 9, 8), ks=(2, 3, 11, 8), vs=(2, 3, 11, 8), mask=bool_mask(2, 3, 9, 11)),
    "bool_mask_broadcast": dict(qs=(2, 3, 9, 8), ks=(2, 3, 11, 8), vs=(2, 3, 11, 8), mask=bool_mask(9, 11)),
    "float_mask": dict(qs=(2, 3, 9, 8), ks=(2, 3, 11, 8), vs=(2, 3, 11, 8), mask=float_mask(2, 1, 9, 11)),
    "causal": dict(qs=(2, 2, 33, 16), ks=(2, 2, 33, 16), vs=(2, 2, 33, 16), is_causal=True),
    "causal_tq_lt_tk": dict(qs=(1, 2, 5, 8), ks=(1, 2, 12, 8), vs=(1, 2, 12, 8), is_causal=True),
    "causal_tq_gt_tk": dict(qs=(1, 2, 12, 8), ks=(1, 2, 5, 8), vs=(1, 2, 5, 8), is_causal=True),
    "bool_mask_and_causal": dict(qs=(2, 2, 10, 8), ks=(2, 2, 10, 8), vs=(2, 2, 10, 8), mask=bool_mask(2, 2, 10, 10),
                                 is_causal=True),
    "float_mask_and_causal": dict(qs=(2, 2, 7, 8), ks=(2, 2, 13, 8), vs=(2, 2, 13, 8), mask=float_mask(7, 13),
                                  is_causal=True),
    "odd_sizes": dict(qs=(3, 5, 13, 7), ks=(3, 5, 17, 7), vs=(3, 5, 17, 5)),
    "t1": dict(qs=(2, 2, 1, 8), ks=(2, 2, 1, 8), vs=(2, 2, 1, 8)),
    "t1_causal": dict(qs=(2, 2, 1, 8), ks=(2, 2, 1, 8), vs=(2, 2, 1, 8), is_causal=True),
    "tq1_long_k": dict(qs=(2, 2, 1, 16), ks=(2, 2, 70, 16), vs=(2, 2, 70, 16)),
    "rank3": dict(qs=(4, 9, 8), ks=(4, 6, 8), vs=(4, 6, 3)),
    "broadcast_kv": dict(qs=(2, 4, 9, 8), ks=(2, 1, 9, 8), vs=(1, 1, 9, 8)),
    "scale": dict(qs=(2, 2, 9, 8), ks=(2, 2, 9, 8), vs=(2, 2, 9, 8), scale=0.3),
    "gqa": dict(qs=(2, 8, 11, 8), ks=(2, 2, 11, 8), vs=(2, 2, 11, 8), enable_gqa=True),
    "gqa_causal": dict(qs=(1, 6, 17, 8), ks=(1, 3, 17, 8), vs=(1, 3, 17, 4), enable_gqa=True, is_causal=True),
    "gqa_head_mask": dict(qs=(2, 4, 9, 8), ks=(2, 2, 9, 8), vs=(2, 2, 9, 8), enable_gqa=True,
                          mask=bool_mask(2, 4, 9, 9)),
    "gqa_shared_mask": dict(qs=(2, 4, 9, 8), ks=(2, 1, 9, 8), vs=(2, 1, 9, 8), enable_gqa=True,
                            mask=float_mask(2, 1, 9, 9)),
    "gqa_flag_equal_heads": dict(qs=(2, 3, 9, 8), ks=(2, 3, 9, 8), vs=(2, 3, 9, 8), enable_gqa=True),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_forward_and_gradients_match_torch(name):
    check_case(name, seed=zlib.crc32(name.encode()) % 1000, **CASES[name])  # hash() differs per process


def test_runs_on_qkv_kernel_not_torch(monkeypatch):
    calls = []
    real = qkv._qkv._sdpa_forward
    monkeypatch.setattr(qkv._qkv, "_sdpa_forward", lambda *a: calls.append(1) or real(*a))
    real_b = qkv._qkv._sdpa_backward
    monkeypatch.setattr(qkv._qkv, "_sdpa_backward", lambda *a: calls.append(2) or real_b(*a))
    q = torch.randn(1, 2, 5, 4, requires_grad=True)
    qt.scaled_dot_product_attention(q, q, q, is_causal=True).sum().backward()
    assert calls == [1, 2]


def test_strided_inputs_are_read_in_place():
    # (B, T, H, D) projections transposed to (B, H, T, D): non-contiguous views, last dim contiguous.
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(2, 10, 3, 3, 8, generator=gen)
    q, k, v = (x[:, :, i].transpose(1, 2).requires_grad_(True) for i in range(3))
    assert not q.is_contiguous()
    arr = q.detach().numpy()
    t = qkv._qkv._sdpa_forward(arr, arr, arr, None, False, None)[0]
    assert t.shape == (2, 3, 10, 8)
    g = torch.randn(2, 3, 10, 8, generator=gen)
    (o1, g1), (o2, g2) = run_both(q, k, v, g)
    assert_close("strided out", o1, o2)
    for a, b in zip(g1, g2):
        assert_close("strided grad", a, b)


def test_expanded_mask_and_kv_are_not_copied_and_match():
    gen = torch.Generator().manual_seed(4)
    q = leaf(gen, 2, 4, 6, 8)
    k = leaf(gen, 1, 1, 6, 8)
    v = leaf(gen, 1, 1, 6, 8)
    mask = (torch.rand(6, 6, generator=gen) < 0.6) | torch.eye(6, dtype=torch.bool)
    mask = mask.expand(2, 4, 6, 6)  # stride-0 views, as the expanded k and v
    g = torch.randn(2, 4, 6, 8, generator=gen)
    (o1, g1), (o2, g2) = run_both(q, k, v, g, prep=lambda t: t.expand(2, 4, 6, 8), attn_mask=mask)
    assert_close("expanded out", o1, o2)
    for a, b in zip(g1, g2):
        assert_close("expanded grad", a, b)


def test_fully_masked_row_gives_zero_output_and_zero_gradient():
    q = torch.randn(1, 1, 3, 4, requires_grad=True)
    k = torch.randn(1, 1, 5, 4, requires_grad=True)
    v = torch.randn(1, 1, 5, 4, requires_grad=True)
    mask = torch.ones(3, 5, dtype=torch.bool)
    mask[1] = False
    out = qt.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert torch.equal(out[0, 0, 1], torch.zeros(4))
    assert torch.isfinite(out).all()
    out.sum().backward()
    assert torch.equal(q.grad[0, 0, 1], torch.zeros(4))
    ref = F.scaled_dot_product_attention(q.detach(), k.detach(), v.detach(), attn_mask=mask)
    assert_close("fully masked out", out, ref)


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_other_dtypes_fall_back_to_torch(dtype, monkeypatch):
    monkeypatch.setattr(qkv._qkv, "_sdpa_forward", None)  # a call would raise TypeError
    q = torch.randn(2, 2, 5, 8, dtype=dtype, requires_grad=True)
    out = qt.scaled_dot_product_attention(q, q, q, is_causal=True)
    ref = F.scaled_dot_product_attention(q, q, q, is_causal=True)
    assert out.dtype == dtype and torch.equal(out, ref)
    out.sum().backward()


def test_dropout_is_torchs_own_with_its_seed():
    q = torch.randn(2, 2, 7, 8)
    torch.manual_seed(11)
    a = qt.scaled_dot_product_attention(q, q, q, dropout_p=0.3)
    torch.manual_seed(11)
    b = F.scaled_dot_product_attention(q, q, q, dropout_p=0.3)
    assert torch.equal(a, b)
    torch.manual_seed(12)
    c = qt.scaled_dot_product_attention(q, q, q, dropout_p=0.3)
    assert not torch.equal(a, c)


def test_mask_that_requires_grad_gets_its_gradient_from_torch():
    q = torch.randn(1, 2, 4, 8)
    bias = torch.zeros(4, 4, requires_grad=True)
    qt.scaled_dot_product_attention(q, q, q, attn_mask=bias).sum().backward()
    ref_bias = torch.zeros(4, 4, requires_grad=True)
    F.scaled_dot_product_attention(q, q, q, attn_mask=ref_bias).sum().backward()
    assert bias.grad is not None and torch.equal(bias.grad, ref_bias.grad)


@pytest.mark.parametrize("tq,tk", [(0, 5), (3, 0), (0, 0)])
def test_empty_sequences_as_torch(tq, tk):
    q = torch.randn(2, 3, tq, 4, requires_grad=True)
    k = torch.randn(2, 3, tk, 4, requires_grad=True)
    v = torch.randn(2, 3, tk, 6, requires_grad=True)
    out = qt.scaled_dot_product_attention(q, k, v)
    ref = F.scaled_dot_product_attention(q, k, v)
    assert out.shape == ref.shape == (2, 3, tq, 6)
    assert torch.equal(out, ref)
    out.sum().backward()
    assert q.grad.shape == q.shape


def test_bad_shapes_raise_torchs_error():
    q = torch.randn(1, 2, 4, 8)
    k = torch.randn(1, 2, 4, 7)
    with pytest.raises(RuntimeError):
        qt.scaled_dot_product_attention(q, k, k)


def test_patched_routes_functional_sdpa_and_restores_it():
    torch_sdpa = F.scaled_dot_product_attention
    with qt.patched():
        assert F.scaled_dot_product_attention is qt.scaled_dot_product_attention
        with qt.patched():
            pass
        assert F.scaled_dot_product_attention is qt.scaled_dot_product_attention
    assert F.scaled_dot_product_attention is torch_sdpa
    with pytest.raises(KeyError):
        with qt.patched():
            raise KeyError("x")
    assert F.scaled_dot_product_attention is torch_sdpa


def test_patched_call_runs_on_qkv(monkeypatch):
    calls = []
    real = qkv._qkv._sdpa_forward
    monkeypatch.setattr(qkv._qkv, "_sdpa_forward", lambda *a: calls.append(1) or real(*a))
    q = torch.randn(1, 2, 5, 4)
    with qt.patched():
        out = F.scaled_dot_product_attention(q, q, q, is_causal=True)
    assert calls == [1]
    assert_close("patched", out, F.scaled_dot_product_attention(q, q, q, is_causal=True))


def test_custom_op_passes_opcheck():
    gen = torch.Generator().manual_seed(5)
    q = torch.randn(2, 2, 6, 8, generator=gen, requires_grad=True)
    k = torch.randn(2, 2, 7, 8, generator=gen, requires_grad=True)
    v = torch.randn(2, 2, 7, 4, generator=gen, requires_grad=True)
    mask = torch.rand(6, 7, generator=gen) < 0.7
    mask[:, 0] = True
    torch.library.opcheck(torch.ops.qkv.sdpa.default, (q, k, v, mask, True, None),
                          test_utils=("test_schema", "test_autograd_registration", "test_faketensor"))


def test_double_backward_raises_instead_of_a_silent_zero():
    q = torch.randn(1, 2, 5, 8, requires_grad=True)
    (g,) = torch.autograd.grad(qt.scaled_dot_product_attention(q, q, q).sum(), q, create_graph=True)
    with pytest.raises(RuntimeError, match="qkv.sdpa_backward"):
        g.sum().backward()


def test_inputs_are_read_in_place_not_copied():
    """NumPy's allocations (which tracemalloc traces) stay far below one input's size: the strided views of the
    torch tensors reach the kernel as they are. A copy of q, k or v would show as 512 KiB."""
    import tracemalloc

    x = torch.randn(2, 256, 3, 4, 64)  # (B, T, 3, H, D): q, k, v as (B, H, T, D) transposed views
    q, k, v = (x[:, :, i].transpose(1, 2) for i in range(3))
    mask = torch.zeros(256, 256).expand(2, 4, 256, 256)  # stride-0 float mask, 2 MiB if materialised
    arrays = [qt._np(t) for t in (q, k, v, mask)]
    one_input = q.numel() * 4
    qkv._qkv._sdpa_forward(*arrays, True, None)  # warm-up
    tracemalloc.start()
    out, lse = qkv._qkv._sdpa_forward(*arrays, True, None)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert out.shape == (2, 4, 256, 64) and lse.shape == (2, 4, 256)
    assert peak < one_input // 8, f"numpy allocated {peak} bytes during the call (one input: {one_input})"


def test_enable_gqa_is_native_kv_heads_are_not_expanded(monkeypatch):
    seen = []
    real = qkv._qkv._sdpa_forward
    monkeypatch.setattr(qkv._qkv, "_sdpa_forward", lambda *a: seen.append((a[1].shape, a[6])) or real(*a))
    gen = torch.Generator().manual_seed(11)
    q = torch.randn(2, 8, 7, 16, generator=gen, requires_grad=True)
    k = torch.randn(2, 2, 9, 16, generator=gen, requires_grad=True)
    v = torch.randn(2, 2, 9, 16, generator=gen, requires_grad=True)
    out = qt.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    assert seen == [((2, 2, 9, 16), True)]  # the kernel got k with its 2 heads, and the GQA flag
    ref = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    g = torch.randn(out.shape, generator=gen)
    got = torch.autograd.grad(out, (q, k, v), g)
    want = torch.autograd.grad(ref, (q, k, v), g)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
