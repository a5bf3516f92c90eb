"""qkv.MultiheadAttention against torch.nn.MultiheadAttention (batch_first=True, eval mode) with copied weights.

Random configurations: self- and cross-attention, kdim/vdim, bias on/off, key_padding_mask (bool/float), attn_mask
(bool/float, (Tq, Tk) or (B*H, Tq, Tk)), need_weights averaged or per head, is_causal with the causal attn_mask that
PyTorch requires. Outputs and weights must meet torch_parity.assert_parity. Beyond PyTorch: window_size and softcap
against the module written out over qkv.scaled_dot_product_attention with the same options, and their errors.
"""
import warnings

import numpy as np
import pytest
import torch

import qkv
from torch_parity import assert_parity, double_copy, rand, state_dict_numpy, tmask

N_CASES = 40


def mha_case(seed):
    rng = np.random.default_rng(2000 + seed)
    H = int(rng.choice([1, 2, 4]))
    E = H * int(rng.choice([2, 4, 8]))
    B, Tq = int(rng.integers(1, 4)), int(rng.integers(1, 8))
    self_attn = bool(rng.random() < 0.5)
    kdim = vdim = None
    if not self_attn and rng.random() < 0.5:
        kdim, vdim = int(rng.integers(1, 12)), int(rng.integers(1, 12))
    Tk = Tq if self_attn else int(rng.integers(1, 8))
    cfg = dict(embed_dim=E, num_heads=H, bias=bool(rng.random() < 0.7), kdim=kdim, vdim=vdim)
    x = rand(rng, B, Tq, E)
    if self_attn:
        q = k = v = x
    else:
        q, k, v = x, rand(rng, B, Tk, kdim or E), rand(rng, B, Tk, vdim or E)
    # Masks never block key 0 (nor does a top-left causal mask), so no query row is fully masked here.
    kpm_kind = rng.choice(["none", "bool", "float"])
    kpm = None
    if kpm_kind == "bool":
        kpm = rng.random((B, Tk)) < 0.3
        kpm[:, 0] = False
    elif kpm_kind == "float":
        kpm = rng.standard_normal((B, Tk)).astype(np.float32)
        kpm[rng.random((B, Tk)) < 0.2] = -np.inf
        kpm[:, 0] = 0.0
    is_causal = self_attn and bool(rng.random() < 0.3)
    am_kind = "causal_bool" if is_causal else rng.choice(["none", "bool", "float"])
    am_shape = (Tq, Tk) if rng.random() < 0.6 else (B * H, Tq, Tk)
    am = None
    if am_kind == "causal_bool":
        am = ~np.tril(np.ones((Tq, Tk), bool))  # True = not allowed, as PyTorch's MHA reads it
    elif am_kind == "bool":
        am = rng.random(am_shape) < 0.3
        am[..., 0] = False
    elif am_kind == "float":
        am = rng.standard_normal(am_shape).astype(np.float32)
        am[rng.random(am_shape) < 0.2] = -np.inf
        am[..., 0] = 0.0
    call = dict(key_padding_mask=kpm, attn_mask=am, need_weights=bool(rng.random() < 0.7),
                average_attn_weights=bool(rng.random() < 0.5), is_causal=is_causal)
    return cfg, (q, k, v), call


def torch_mha(mod, qkv_in, call, dtype):
    q, k, v = qkv_in
    tq = torch.from_numpy(q.astype(np.float64)).to(dtype)
    tk = tq if k is q else torch.from_numpy(k.astype(np.float64)).to(dtype)
    tv = tq if v is q else torch.from_numpy(v.astype(np.float64)).to(dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # mixing bool and float mask types is deprecated, not an error
        out, w = mod(tq, tk, tv, key_padding_mask=tmask(call["key_padding_mask"], dtype),
                     need_weights=call["need_weights"], attn_mask=tmask(call["attn_mask"], dtype),
                     average_attn_weights=call["average_attn_weights"], is_causal=call["is_causal"])
    return out.detach().numpy(), None if w is None else w.detach().numpy()


def torch_and_qkv(cfg, seed=0):
    torch.manual_seed(seed)
    ref = torch.nn.MultiheadAttention(cfg["embed_dim"], cfg["num_heads"], bias=cfg["bias"], kdim=cfg["kdim"],
                                      vdim=cfg["vdim"], batch_first=True).eval()
    if cfg["bias"]:  # PyTorch zero-initialises the biases; random ones test that they are used
        with torch.no_grad():
            ref.in_proj_bias.normal_()
            ref.out_proj.bias.normal_()
    mine = qkv.MultiheadAttention(**cfg, batch_first=True)
    mine.load_state_dict(state_dict_numpy(ref))
    return ref, mine


@pytest.mark.parametrize("seed", range(N_CASES))
def test_matches_torch_on_random_configurations(seed):
    cfg, qkv_in, call = mha_case(seed)
    ref, mine = torch_and_qkv(cfg, seed)
    out64, w64 = torch_mha(double_copy(ref), qkv_in, call, torch.float64)
    out32, w32 = torch_mha(ref, qkv_in, call, torch.float32)
    out, w = mine(*qkv_in, **call)
    assert_parity(f"mha[{seed}].out", out, out64, out32)
    if call["need_weights"]:
        assert_parity(f"mha[{seed}].weights", w, w64, w32)
    else:
        assert w is None and w64 is None


def test_fully_masked_query_row_gives_out_proj_bias_where_torch_gives_nan():
    rng = np.random.default_rng(3)
    cfg = dict(embed_dim=8, num_heads=2, bias=True, kdim=None, vdim=None)
    ref, mine = torch_and_qkv(cfg)
    x = rand(rng, 2, 4, 8)
    kpm = np.zeros((2, 4), bool)
    kpm[1] = True  # every key of sample 1 is padding
    out, w = mine(x, x, x, key_padding_mask=kpm)
    t_out, t_w = torch_mha(ref, (x, x, x), dict(key_padding_mask=kpm, attn_mask=None, need_weights=True,
                                                 average_attn_weights=True, is_causal=False), torch.float32)
    assert np.all(np.isnan(t_out[1])), "PyTorch behaviour changed: fully masked rows are no longer NaN"
    np.testing.assert_allclose(out[1], np.broadcast_to(ref.out_proj.bias.detach().numpy(), (4, 8)), atol=1e-6)
    assert np.all(w[1] == 0.0)
    np.testing.assert_allclose(out[0], t_out[0], atol=1e-5)


def test_bool_attn_mask_true_is_blocked_and_equals_minus_inf_float_mask():
    rng = np.random.default_rng(4)
    _, mine = torch_and_qkv(dict(embed_dim=8, num_heads=2, bias=True, kdim=None, vdim=None))
    x = rand(rng, 2, 5, 8)
    blocked = rng.random((5, 5)) < 0.4
    blocked[:, 0] = False
    out_b, w_b = mine(x, x, x, attn_mask=blocked)
    out_f, w_f = mine(x, x, x, attn_mask=np.where(blocked, -np.inf, 0.0).astype(np.float32))
    np.testing.assert_allclose(out_b, out_f, atol=1e-6)
    assert np.all(w_b[:, blocked] == 0.0)


def test_is_causal_without_attn_mask_applies_the_causal_mask():
    # PyTorch raises for is_causal without attn_mask; qkv applies the top-left causal mask it stands for.
    rng = np.random.default_rng(5)
    _, mine = torch_and_qkv(dict(embed_dim=8, num_heads=2, bias=True, kdim=None, vdim=None))
    x = rand(rng, 1, 4, 8)
    out_c, w_c = mine(x, x, x, is_causal=True)
    out_m, _ = mine(x, x, x, attn_mask=~np.tril(np.ones((4, 4), bool)))
    np.testing.assert_allclose(out_c, out_m, atol=1e-6)
    assert np.all(np.triu(w_c[0], 1) == 0.0)


def test_unbatched_input_matches_batch_of_one():
    rng = np.random.default_rng(6)
    _, mine = torch_and_qkv(dict(embed_dim=8, num_heads=4, bias=True, kdim=None, vdim=None))
    x = rand(rng, 5, 8)
    out, w = mine(x, x, x, average_attn_weights=False)
    out1, w1 = mine(x[None], x[None], x[None], average_attn_weights=False)
    assert out.shape == (5, 8) and w.shape == (4, 5, 5)
    np.testing.assert_allclose(out, out1[0], atol=1e-6)


def test_state_dict_round_trip_and_pytorch_names():
    mine = qkv.MultiheadAttention(12, 3, kdim=5, vdim=7, seed=1)
    sd = mine.state_dict()
    assert list(sd) == ["q_proj_weight", "k_proj_weight", "v_proj_weight", "in_proj_bias", "out_proj.weight",
                        "out_proj.bias"]
    assert sd["k_proj_weight"].shape == (12, 5) and sd["v_proj_weight"].shape == (12, 7)
    other = qkv.MultiheadAttention(12, 3, kdim=5, vdim=7, seed=2)
    assert not np.array_equal(other.state_dict()["q_proj_weight"], sd["q_proj_weight"])
    other.load_state_dict(sd)
    for name, a in other.state_dict().items():
        np.testing.assert_array_equal(a, sd[name])
    torch_names = set(torch.nn.MultiheadAttention(12, 3, kdim=5, vdim=7, batch_first=True).state_dict())
    assert set(sd) == torch_names


def test_load_state_dict_rejects_missing_unexpected_and_misshapen_entries():
    mine = qkv.MultiheadAttention(8, 2, seed=0)
    good = mine.state_dict()
    missing = dict(good)
    del missing["in_proj_bias"]
    with pytest.raises(ValueError, match=r"\[MultiheadAttention.load_state_dict\] missing: in_proj_bias"):
        mine.load_state_dict(missing)
    with pytest.raises(ValueError, match=r"unexpected: extra"):
        mine.load_state_dict({**good, "extra": np.zeros(3, np.float32)})
    bad = {**good, "out_proj.weight": np.zeros((8, 7), np.float32)}
    with pytest.raises(ValueError, match=r"out_proj.weight has shape \(8, 7\) but the module expects \(8, 8\)"):
        mine.load_state_dict(bad)
    # Nothing changed on error; strict=False ignores unknown and missing names.
    np.testing.assert_array_equal(mine.state_dict()["out_proj.weight"], good["out_proj.weight"])
    missing_keys, unexpected_keys = mine.load_state_dict({"extra": np.zeros(3, np.float32)}, strict=False)
    assert missing_keys == list(good) and unexpected_keys == ["extra"]
    with pytest.raises(TypeError, match="in_proj_bias'] must be array-like"):
        mine.load_state_dict({**good, "in_proj_bias": "zeros"})
    with pytest.raises(TypeError, match="dict"):
        mine.load_state_dict([("in_proj_bias", good["in_proj_bias"])])


def test_batch_first_defaults_to_false_and_both_layouts_match_torch():
    rng = np.random.default_rng(11)
    torch.manual_seed(3)
    ref_tbe = torch.nn.MultiheadAttention(8, 2).eval()  # torch's default: (T, B, E)
    mine_tbe = qkv.MultiheadAttention(8, 2)
    assert mine_tbe.batch_first is False
    mine_tbe.load_state_dict(ref_tbe.state_dict())
    mine_bte = qkv.MultiheadAttention(8, 2, batch_first=True)
    assert mine_bte.batch_first is True
    mine_bte.load_state_dict(ref_tbe.state_dict())
    q, kv = rand(rng, 5, 3, 8), rand(rng, 7, 3, 8)  # (T, B, E)
    kpm = np.zeros((3, 7), bool)
    kpm[1, -2:] = True
    with torch.no_grad():
        ref_out, ref_w = ref_tbe(torch.from_numpy(q), torch.from_numpy(kv), torch.from_numpy(kv),
                                 key_padding_mask=torch.from_numpy(kpm))
    out, w = mine_tbe(q, kv, kv, key_padding_mask=kpm)
    assert out.shape == (5, 3, 8) and w.shape == (3, 5, 7)
    np.testing.assert_allclose(out, ref_out.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(w, ref_w.numpy(), rtol=1e-5, atol=1e-6)
    out_bf, w_bf = mine_bte(q.transpose(1, 0, 2), kv.transpose(1, 0, 2), kv.transpose(1, 0, 2), key_padding_mask=kpm)
    np.testing.assert_allclose(out_bf.transpose(1, 0, 2), out, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(w_bf, w, rtol=1e-6, atol=1e-7)


def test_unsupported_options_raise_value_error():
    with pytest.raises(ValueError, match="add_bias_kv"):
        qkv.MultiheadAttention(8, 2, add_bias_kv=True)
    with pytest.raises(ValueError, match=r"\[MultiheadAttention\] embed_dim 8 must be divisible by num_heads 3"):
        qkv.MultiheadAttention(8, 3)


def test_dropout_acts_only_in_training_mode():
    rng = np.random.default_rng(7)
    mine = qkv.MultiheadAttention(8, 2, dropout=0.5, batch_first=True, seed=3)
    x = rand(rng, 2, 6, 8)
    assert mine.training
    out_train, _ = mine(x, x, x)
    mine.eval()
    assert not mine.training
    out_eval, _ = mine(x, x, x)
    out_eval2, _ = mine(x, x, x)
    np.testing.assert_array_equal(out_eval, out_eval2)
    assert not np.allclose(out_train, out_eval)


# ----- beyond PyTorch: window_size and softcap (keyword-only), as qkv.scaled_dot_product_attention takes them -------

def written_out(mine, q, k, v, kpm, is_causal, window, softcap):
    """The module written out: its projections (float64), qkv.scaled_dot_product_attention with the same options,
    out_proj; beside it the per-head weights in float64 (scores, cap, masks, softmax; a row that sees no key: 0)."""
    sd, H = {n: a.astype(np.float64) for n, a in mine.state_dict().items()}, mine.num_heads
    if "in_proj_weight" in sd:
        wq, wk, wv = np.split(sd["in_proj_weight"], 3)
    else:
        wq, wk, wv = sd["q_proj_weight"], sd["k_proj_weight"], sd["v_proj_weight"]
    bq, bk, bv = np.split(sd["in_proj_bias"], 3) if "in_proj_bias" in sd else (0.0, 0.0, 0.0)

    def heads(x, w, b):  # (B, T, d) -> (B, H, T, D)
        y = x.astype(np.float64) @ w.T + b
        return y.reshape(y.shape[0], y.shape[1], H, -1).transpose(0, 2, 1, 3)

    qh, kh, vh = heads(q, wq, bq), heads(k, wk, bk), heads(v, wv, bv)
    keep = None if kpm is None else ~kpm[:, None, None, :]
    o = qkv.scaled_dot_product_attention(*(a.astype(np.float32) for a in (qh, kh, vh)), attn_mask=keep,
                                         is_causal=is_causal, window_size=window, softcap=softcap)
    B, _, Tq, D = o.shape
    out = o.transpose(0, 2, 1, 3).reshape(B, Tq, H * D).astype(np.float64) @ sd["out_proj.weight"].T
    out = out + sd.get("out_proj.bias", 0.0)
    s = qh @ kh.swapaxes(-1, -2) / np.sqrt(D)
    if softcap > 0:
        s = softcap * np.tanh(s / softcap)
    Tk = k.shape[1]
    i, j = np.arange(Tq)[:, None], np.arange(Tk)[None, :]
    allowed = np.ones((Tq, Tk), bool)
    if is_causal:
        allowed &= j <= i  # top-left, as MultiheadAttention's is_causal
    if window[0] >= 0:
        allowed &= j >= i + Tk - Tq - window[0]  # the window aligned bottom-right
    if window[1] >= 0:
        allowed &= j <= i + Tk - Tq + window[1]
    allowed = np.broadcast_to(allowed, s.shape) & (True if keep is None else keep)
    s = np.where(allowed, s, -np.inf)
    mx = np.max(s, -1, keepdims=True)
    e = np.where(allowed, np.exp(s - np.where(np.isfinite(mx), mx, 0.0)), 0.0)
    w = e / np.maximum(e.sum(-1, keepdims=True), 1e-300)
    return out, w


WINDOWED = {
    "self_window_causal": dict(E=8, H=2, Tq=9, Tk=9, window=(2, 0), is_causal=True),
    "cross_window_softcap_padding": dict(E=12, H=3, Tq=5, Tk=11, window=(3, 1), softcap=0.8, padding=True),
    "right_window_softcap_kdim": dict(E=8, H=4, Tq=7, Tk=6, window=(-1, 1), softcap=2.0, kdim=5, vdim=3,
                                      padding=True),
    "rows_see_nothing": dict(E=8, H=2, Tq=8, Tk=3, window=(0, 0)),
}


@pytest.mark.parametrize("name", sorted(WINDOWED))
def test_window_and_softcap_match_the_functional_attention_with_the_same_options(name):
    c = WINDOWED[name]
    rng = np.random.default_rng(len(name))
    E, H, Tq, Tk = c["E"], c["H"], c["Tq"], c["Tk"]
    mine = qkv.MultiheadAttention(E, H, kdim=c.get("kdim"), vdim=c.get("vdim"), batch_first=True, seed=5)
    mine.eval()
    sd = mine.state_dict()
    mine.load_state_dict({**sd, "in_proj_bias": rand(rng, *sd["in_proj_bias"].shape),
                          "out_proj.bias": rand(rng, E)})  # nonzero biases, so that they are checked
    q = rand(rng, 2, Tq, E, scale=2.0)
    k, v = (q, q) if Tq == Tk and "kdim" not in c else (rand(rng, 2, Tk, c.get("kdim", E), scale=2.0),
                                                         rand(rng, 2, Tk, c.get("vdim", E)))
    kpm = None
    if c.get("padding"):
        kpm = np.zeros((2, Tk), bool)
        kpm[1, -2:] = True
    opts = dict(window_size=c["window"], softcap=c.get("softcap", 0.0))
    out, w = mine(q, k, v, key_padding_mask=kpm, is_causal=c.get("is_causal", False), average_attn_weights=False,
                  **opts)
    want_out, want_w = written_out(mine, q, k, v, kpm, c.get("is_causal", False), c["window"], opts["softcap"])
    np.testing.assert_allclose(out, want_out, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(w, want_w, atol=1e-6)
    assert np.all(w[~np.broadcast_to(want_w > 0, w.shape)] == 0.0)  # outside the window: exactly 0
    plain, _ = mine(q, k, v, key_padding_mask=kpm, window_size=(-1, -1), softcap=0.0)
    np.testing.assert_array_equal(plain, mine(q, k, v, key_padding_mask=kpm)[0])  # the defaults are no window


@pytest.mark.parametrize("kwargs, message", [
    (dict(window_size=(-2, 0)), r"\[MultiheadAttention\] window_size \(-2, 0\) must be >= -1 on each side"),
    (dict(window_size=(0, -5)), r"\[MultiheadAttention\] window_size \(0, -5\) must be >= -1 on each side"),
    (dict(softcap=-1.0), r"\[MultiheadAttention\] softcap must be a finite float >= 0"),
    (dict(softcap=float("nan")), r"\[MultiheadAttention\] softcap must be a finite float >= 0"),
    (dict(softcap=float("inf")), r"\[MultiheadAttention\] softcap must be a finite float >= 0"),
])
def test_bad_window_or_softcap_raise_one_line_value_error(kwargs, message):
    mine = qkv.MultiheadAttention(8, 2, batch_first=True, seed=0)
    x = np.zeros((1, 3, 8), np.float32)
    with pytest.raises(ValueError, match=message) as e:
        mine(x, x, x, **kwargs)
    assert "\n" not in str(e.value)
