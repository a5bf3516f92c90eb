"""docs/PYTHON.md, "Porting from PyTorch": one test per row of the table, each running the PyTorch code and the qkv
code side by side. Plus the defaults the rows rely on (set_num_threads, the changelog's behaviour changes).
"""
import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import qkv

torch.set_num_threads(2)

RTOL, ATOL = 1e-5, 1e-6


def close(got, ref, rtol=RTOL, atol=ATOL):
    ref = ref.detach().numpy() if isinstance(ref, torch.Tensor) else ref
    np.testing.assert_allclose(got, ref, rtol=rtol, atol=atol)


def randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def test_row_multihead_attention_default_layout_is_seq_first():
    torch.manual_seed(0)
    ref = nn.MultiheadAttention(8, 2).eval()
    mine = qkv.MultiheadAttention(8, 2)
    mine.load_state_dict(ref.state_dict())
    x = randn(5, 3, 8)  # (T, B, E)
    with torch.no_grad():
        out, w = ref(x, x, x)
    got, got_w = mine(x, x, x)
    close(got, out)
    close(got_w, w)


def test_row_load_state_dict_takes_a_torch_state_dict_and_returns_missing_and_unexpected():
    ref = nn.TransformerEncoderLayer(8, 2, 16)
    mine = qkv.TransformerEncoderLayer(8, 2, 16)
    result = mine.load_state_dict(ref.state_dict())
    assert result == ([], []) and result.missing_keys == [] and result.unexpected_keys == []
    for name, t in ref.state_dict().items():
        np.testing.assert_array_equal(mine.state_dict()[name], t.numpy())
    sd = dict(ref.state_dict())
    del sd["norm1.bias"]
    sd["extra.weight"] = torch.zeros(2)
    missing, unexpected = mine.load_state_dict(sd, strict=False)
    assert missing == ["norm1.bias"] and unexpected == ["extra.weight"]
    with pytest.raises(ValueError, match=r"missing: norm1.bias"):
        mine.load_state_dict(sd)


def test_row_float_mask_is_additive_in_sdpa_and_bool_keeps():
    q, k, v = randn(2, 2, 4, 8, seed=1), randn(2, 2, 6, 8, seed=2), randn(2, 2, 6, 8, seed=3)
    bias = randn(4, 6, seed=4)
    close(qkv.scaled_dot_product_attention(q, k, v, attn_mask=bias),
          F.scaled_dot_product_attention(q, k, v, attn_mask=bias))
    keep = torch.rand(4, 6, generator=torch.Generator().manual_seed(5)) < 0.6
    keep[:, 0] = True
    close(qkv.scaled_dot_product_attention(q, k, v, attn_mask=keep),
          F.scaled_dot_product_attention(q, k, v, attn_mask=keep))
    # In MultiheadAttention a bool mask's True blocks, as in torch.
    torch.manual_seed(1)
    ref = nn.MultiheadAttention(8, 2, batch_first=True).eval()
    mine = qkv.MultiheadAttention(8, 2, batch_first=True)
    mine.load_state_dict(ref.state_dict())
    x = randn(2, 6, 8, seed=6)
    blocked = torch.rand(6, 6, generator=torch.Generator().manual_seed(6)) < 0.4
    blocked[:, 0] = False
    with torch.no_grad():
        out, _ = ref(x, x, x, attn_mask=blocked)
    close(mine(x, x, x, attn_mask=blocked)[0], out)


def test_row_attention_needs_a_mask_kind_except_for_float_masks():
    q = randn(3, 4, seed=7).numpy()
    bias = randn(3, 3, seed=8).numpy()
    close(qkv.attention(q, q, q, mask=bias), qkv.attention(q, q, q, mask=bias, mask_kind="additive"), 0, 0)
    keep = np.eye(3, dtype=bool)
    with pytest.raises(ValueError, match="mask_kind"):
        qkv.attention(q, q, q, mask=keep)
    close(qkv.attention(q, q, q, mask=keep, mask_kind="keep"), q, 1e-6, 1e-6)  # each query sees only itself


def fold_causal(mask, tq, tk):
    """attn_mask with the top-left causal mask folded in: what torch 2.13's fused CPU kernel computes for
    attn_mask + is_causal=True (its math path raises instead)."""
    causal = torch.ones(tq, tk, dtype=torch.bool).tril()
    return mask & causal if mask.dtype == torch.bool else mask.masked_fill(~causal, float("-inf"))


@pytest.mark.parametrize("tq,tk", [(5, 5), (3, 7), (7, 3)])
def test_row_attn_mask_with_is_causal_combines_both(tq, tk):
    q, k, v = randn(1, 2, tq, 8, seed=9), randn(1, 2, tk, 8, seed=10), randn(1, 2, tk, 8, seed=11)
    bias = randn(tq, tk, seed=12)
    bias[:, 0] = 0.0
    keep = torch.rand(tq, tk, generator=torch.Generator().manual_seed(13)) < 0.7
    keep[:, 0] = True
    for mask in (bias, keep):
        got = qkv.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=True)
        close(got, F.scaled_dot_product_attention(q, k, v, attn_mask=fold_causal(mask, tq, tk)))
        close(got, F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=True))  # torch's fused path


def test_row_enable_gqa():
    q, k, v = randn(2, 8, 5, 8, seed=14), randn(2, 2, 7, 8, seed=15), randn(2, 2, 7, 4, seed=16)
    close(qkv.scaled_dot_product_attention(q, k, v, enable_gqa=True, is_causal=True),
          F.scaled_dot_product_attention(q, k, v, enable_gqa=True, is_causal=True))
    q.requires_grad_(True), k.requires_grad_(True), v.requires_grad_(True)
    g = randn(2, 8, 5, 4, seed=17)
    F.scaled_dot_product_attention(q, k, v, enable_gqa=True).backward(g)
    dq, dk, dv = qkv.scaled_dot_product_attention_backward(q.detach(), k.detach(), v.detach(), g, enable_gqa=True)
    close(dq, q.grad, 1e-4, 1e-5)
    close(dk, k.grad, 1e-4, 1e-5)
    close(dv, v.grad, 1e-4, 1e-5)


def test_row_dropout_is_seeded_by_manual_seed_and_has_torchs_distribution():
    q = np.ones((1, 1, 64, 4), np.float32)
    v = randn(1, 1, 64, 4, seed=18).numpy()
    qkv.manual_seed(5)
    a = qkv.scaled_dot_product_attention(q, q, v, dropout_p=0.5)
    qkv.manual_seed(5)
    b = qkv.scaled_dot_product_attention(q, q, v, dropout_p=0.5)
    c = qkv.scaled_dot_product_attention(q, q, v, dropout_p=0.5)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    # Equal scores: weights 1/64 each; kept ones scaled by 1/(1-p), so out = (2/64) * sum of kept v rows.
    # The mean over many draws approaches the no-dropout output (inverted dropout is unbiased), as torch's.
    outs = [qkv.scaled_dot_product_attention(q, q, v, dropout_p=0.5) for _ in range(200)]
    close(np.mean(outs, axis=0), qkv.scaled_dot_product_attention(q, q, v), 0, 0.05)


def test_row_torch_tensors_are_inputs():
    x = randn(2, 5, 8, seed=19)
    out = qkv.scaled_dot_product_attention(x, x, x)
    assert isinstance(out, np.ndarray)
    close(out, F.scaled_dot_product_attention(x, x, x))
    close(qkv.scaled_dot_product_attention(x.tolist(), x.numpy(), x), out, 0, 0)  # lists too
    # Read in place through DLPack, result not copied: NumPy allocates (tracemalloc traces it) far less than one
    # input's size.
    import tracemalloc

    big = randn(2, 4, 128, 32, seed=29)
    tracemalloc.start()
    qkv.scaled_dot_product_attention(big, big, big, is_causal=True)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < big.numel() * 4 // 8, f"numpy allocated {peak} bytes"
    with pytest.raises(TypeError, match="detach"):
        qkv.scaled_dot_product_attention(x.requires_grad_(True), x, x)


@pytest.mark.parametrize("tq,tk", [(0, 4), (3, 0)])
def test_row_empty_sequences(tq, tk):
    q, k, v = randn(2, tq, 8, seed=20), randn(2, tk, 8, seed=21), randn(2, tk, 5, seed=22)
    got = qkv.scaled_dot_product_attention(q, k, v)
    ref = F.scaled_dot_product_attention(q, k, v)
    assert got.shape == tuple(ref.shape)
    close(got, ref, 0, 0)


def test_row_set_num_threads():
    before = qkv.get_num_threads()
    try:
        qkv.set_num_threads(1)
        assert qkv.get_num_threads() == 1
        x = randn(2, 2, 33, 8, seed=23)
        one = qkv.scaled_dot_product_attention(x, x, x, is_causal=True)
        qkv.set_num_threads(2)
        assert qkv.get_num_threads() == 2
        close(qkv.scaled_dot_product_attention(x, x, x, is_causal=True), one, 1e-6, 1e-7)
    finally:
        qkv.set_num_threads(before)
    with pytest.raises(ValueError, match=r"\[set_num_threads\] n must be in \[1, 4096\], got 0"):
        qkv.set_num_threads(0)
    with pytest.raises(TypeError, match="set_num_threads: n must be an int"):
        qkv.set_num_threads(1.5)


def test_row_transformer_stacks():
    torch.manual_seed(3)
    t_layer = nn.TransformerEncoderLayer(8, 2, 16)
    t_enc = nn.TransformerEncoder(t_layer, 2, norm=nn.LayerNorm(8), enable_nested_tensor=False).eval()
    layer = qkv.TransformerEncoderLayer(8, 2, 16)
    layer.load_state_dict(t_layer.state_dict())
    enc = qkv.TransformerEncoder(layer, 2, norm=nn.LayerNorm(8)).eval()
    x = randn(5, 2, 8, seed=27)
    with torch.no_grad():
        close(enc(x), t_enc(x), 1e-5, 1e-5)
    t_tr = nn.Transformer(8, 2, 1, 1, 16).eval()
    tr = qkv.Transformer(8, 2, 1, 1, 16).eval()
    assert tr.load_state_dict(t_tr.state_dict()) == ([], [])
    y = randn(3, 2, 8, seed=28)
    with torch.no_grad():
        close(tr(x, y), t_tr(x, y), 1e-5, 1e-5)


def test_row_backward_through_qkv_in_torch():
    import qkv.torch as qt

    q = randn(1, 2, 6, 8, seed=24).requires_grad_(True)
    qt.scaled_dot_product_attention(q, q, q, is_causal=True).sum().backward()
    g_qkv = q.grad.clone()
    q.grad = None
    F.scaled_dot_product_attention(q, q, q, is_causal=True).sum().backward()
    close(g_qkv, q.grad, 1e-4, 1e-6)
    q.grad = None
    with qt.patched():
        F.scaled_dot_product_attention(q, q, q, is_causal=True).sum().backward()
    close(q.grad, g_qkv, 0, 0)


def test_row_torch_modules_with_qkv_attention():
    import qkv.torch as qt

    torch.manual_seed(2)
    ref = nn.TransformerDecoderLayer(8, 2, 16, dropout=0.0)
    torch.manual_seed(2)
    mine = qt.TransformerDecoderLayer(8, 2, 16, dropout=0.0)
    assert isinstance(mine, nn.TransformerDecoderLayer)
    assert all(torch.equal(a, b) for a, b in zip(ref.state_dict().values(), mine.state_dict().values()))
    tgt, mem = randn(4, 2, 8, seed=25), randn(6, 2, 8, seed=26)
    close(mine(tgt, mem).detach().numpy(), ref(tgt, mem), 1e-4, 1e-6)
