"""qkv.flash_attn_varlen_func and qkv.flash_attn_with_kvcache (FlashAttention-2's packed and paged APIs) against
torch written out per sequence: forward, the varlen backward, in-place cache appends and the errors."""
import numpy as np
import pytest
import torch

import qkv


def ref_attention(q, k, v, causal, window=(-1, -1), softcap=0.0, grad=None):
    """q (Tq, Hq, D), k, v (Tk, Hk, D) of one sequence, float64 torch: out (Tq, Hq, Dv) and optionally grads."""
    tq, tk, tv = (torch.from_numpy(np.asarray(a, np.float64)).requires_grad_() for a in (q, k, v))
    group = tq.shape[1] // tk.shape[1]
    kk, vv = tk.repeat_interleave(group, 1), tv.repeat_interleave(group, 1)
    s = torch.einsum("ihd,jhd->hij", tq, kk) / np.sqrt(q.shape[-1])
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    Tq, Tk = q.shape[0], k.shape[0]
    i, j = torch.arange(Tq)[:, None], torch.arange(Tk)[None, :]
    keep = torch.ones(Tq, Tk, dtype=torch.bool)
    if causal:
        keep &= j <= i + Tk - Tq
    if window[0] >= 0:
        keep &= j >= i + Tk - Tq - window[0]
    if window[1] >= 0:
        keep &= j <= i + Tk - Tq + window[1]
    w = torch.softmax(s.masked_fill(~keep, float("-inf")), -1).nan_to_num(0.0)
    out = torch.einsum("hij,jhd->ihd", w, vv)
    if grad is None:
        return out.detach().numpy()
    out.backward(torch.from_numpy(grad.astype(np.float64)))
    return out.detach().numpy(), tq.grad.numpy(), tk.grad.numpy(), tv.grad.numpy()


def packed(rng, lens, h, d):
    return rng.standard_normal((sum(lens), h, d)).astype(np.float32)


def offsets(lens):
    return np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)


@pytest.mark.parametrize("causal, window, softcap", [(False, (-1, -1), 0.0), (True, (-1, -1), 0.0),
                                                     (True, (3, 0), 1.5), (False, (2, 4), 0.0)])
def test_varlen_matches_each_sequence_forward_and_backward(causal, window, softcap):
    rng = np.random.default_rng(7)
    lq, lk = [5, 1, 12, 7], [5, 9, 12, 3]
    q, k, v = packed(rng, lq, 4, 8), packed(rng, lk, 2, 8), packed(rng, lk, 2, 8)
    g = packed(rng, lq, 4, 8)
    cq, ck = offsets(lq), offsets(lk)
    kw = dict(causal=causal, window_size=window, softcap=softcap)
    out, lse = qkv.flash_attn_varlen_func(q, k, v, cq, ck, max(lq), max(lk), return_lse=True, **kw)
    assert out.shape == (sum(lq), 4, 8) and lse.shape == (4, sum(lq))
    dq, dk, dv = qkv.flash_attn_varlen_backward(q, k, v, out, lse, g, cq, ck, max(lq), max(lk), **kw)
    for b in range(len(lq)):
        qs, ks = slice(cq[b], cq[b + 1]), slice(ck[b], ck[b + 1])
        r, rq, rk, rv = ref_attention(q[qs], k[ks], v[ks], causal, window, softcap, grad=g[qs])
        np.testing.assert_allclose(out[qs], r, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(dq[qs], rq, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(dk[ks], rk, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(dv[ks], rv, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("cu, message, error", [
    (np.array([0, 4, 2, 12], np.int32), r"\[attention_varlen\] cu_seqlens_q .* must be non-decreasing", ValueError),
    (np.array([0, 2, 5, 11], np.int32), r"last entry of cu_seqlens_q \(11\) must equal the packed length 12",
     ValueError),
    (np.array([0, 2, 5, 12], np.int64), r"\[flash_attn_varlen_func\] cu_seqlens_q must be int32, got int64",
     TypeError),
])
def test_bad_cu_seqlens_raise_one_line_errors(cu, message, error):
    q = np.zeros((12, 2, 4), np.float32)
    good = np.array([0, 2, 5, 12], np.int32)
    with pytest.raises(error, match=message) as e:
        qkv.flash_attn_varlen_func(q, q, q, cu, good, 12, 12)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("paged", [False, True])
def test_kvcache_appends_in_place_and_matches_the_full_attention(paged):
    rng = np.random.default_rng(3)
    B, hq, hk, d, bs = 2, 4, 2, 8, 4
    cached = np.array([5, 9], np.int32)
    tnew = 2
    full_k = [rng.standard_normal((int(c) + tnew, hk, d)).astype(np.float32) for c in cached]
    full_v = [rng.standard_normal((int(c) + tnew, hk, d)).astype(np.float32) for c in cached]
    q = rng.standard_normal((B, tnew, hq, d)).astype(np.float32)
    if paged:
        max_blocks = 3
        table = np.array([[4, 0, 2], [1, 5, 3]], np.int32)  # scattered physical blocks
        k_cache = np.zeros((6, bs, hk, d), np.float32)
        v_cache = np.zeros((6, bs, hk, d), np.float32)
        for b in range(B):
            for p in range(int(cached[b])):
                k_cache[table[b, p // bs], p % bs] = full_k[b][p]
                v_cache[table[b, p // bs], p % bs] = full_v[b][p]
    else:
        table = None
        k_cache = np.zeros((B, 12, hk, d), np.float32)
        v_cache = np.zeros((B, 12, hk, d), np.float32)
        for b in range(B):
            k_cache[b, :cached[b]] = full_k[b][:cached[b]]
            v_cache[b, :cached[b]] = full_v[b][:cached[b]]
    k_new = np.stack([full_k[b][cached[b]:] for b in range(B)])
    v_new = np.stack([full_v[b][cached[b]:] for b in range(B)])
    out = qkv.flash_attn_with_kvcache(q, k_cache, v_cache, k=k_new, v=v_new, cache_seqlens=cached,
                                      block_table=table, causal=True)
    for b in range(B):
        np.testing.assert_allclose(out[b], ref_attention(q[b], full_k[b], full_v[b], True), rtol=1e-5, atol=1e-5)
        for t in range(tnew):  # the new keys landed in the cache
            p = int(cached[b]) + t
            row = k_cache[table[b, p // bs], p % bs] if paged else k_cache[b, p]
            np.testing.assert_array_equal(row, k_new[b, t])


def test_kvcache_errors_name_the_op():
    k_cache = np.zeros((2, 4, 1, 8), np.float32)
    q = np.zeros((2, 1, 2, 8), np.float32)
    with pytest.raises(ValueError, match=r"\[attention_with_kvcache\] sequence 1: 4 cached keys \+ 1 new ones exceed"):
        qkv.flash_attn_with_kvcache(q, k_cache, k_cache.copy(), k=np.zeros((2, 1, 1, 8), np.float32),
                                    v=np.zeros((2, 1, 1, 8), np.float32), cache_seqlens=np.array([1, 4], np.int32))
    with pytest.raises(ValueError, match=r"block_table entry 7 is outside \[0, 2\)"):
        qkv.flash_attn_with_kvcache(q, k_cache, k_cache.copy(), cache_seqlens=np.array([1, 1], np.int32),
                                    block_table=np.array([[7], [0]], np.int32))


def test_torch_varlen_autograd_matches_each_sequence():
    import qkv.torch as qt
    rng = np.random.default_rng(9)
    lq, lk = [4, 9, 1], [6, 9, 2]
    q, k, v = (torch.from_numpy(a).requires_grad_() for a in (packed(rng, lq, 4, 8), packed(rng, lk, 2, 8),
                                                              packed(rng, lk, 2, 8)))
    cq, ck = torch.from_numpy(offsets(lq)), torch.from_numpy(offsets(lk))
    g = packed(rng, lq, 4, 8)
    out = qt.flash_attn_varlen_func(q, k, v, cq, ck, max(lq), max(lk), causal=True, window_size=(3, 0), softcap=2.0)
    out.backward(torch.from_numpy(g))
    for b in range(len(lq)):
        qs, ks = slice(int(cq[b]), int(cq[b + 1])), slice(int(ck[b]), int(ck[b + 1]))
        r, rq, rk, rv = ref_attention(q.detach().numpy()[qs], k.detach().numpy()[ks], v.detach().numpy()[ks], True,
                                      (3, 0), 2.0, grad=g[qs])
        np.testing.assert_allclose(out.detach().numpy()[qs], r, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(q.grad.numpy()[qs], rq, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(k.grad.numpy()[ks], rk, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(v.grad.numpy()[ks], rv, rtol=1e-4, atol=1e-4)
    with pytest.raises(TypeError, match=r"cu_seqlens_q must be an int32 tensor, got torch.int64"):
        qt.flash_attn_varlen_func(q, k, v, cq.long(), ck, max(lq), max(lk))
