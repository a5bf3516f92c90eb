"""Garbage in, clear exception out: every public qkv callable fed wrong ranks, empty dims, NaN, huge sizes, None,
ragged lists and odd dtypes must raise TypeError (not array-like / not numeric) or ValueError "[function] ... shapes"
(bad shape or value), each in one short line, or return a well-formed result, and never crash the interpreter.
"""
import numpy as np
import pytest

import qkv

f32 = np.float32


def z(*shape):
    return np.zeros(shape, f32)


SDPA = qkv.scaled_dot_product_attention
SDPA_BWD = qkv.scaled_dot_product_attention_backward
MHA = qkv.MultiheadAttention(8, 2, batch_first=True, seed=0)
ENC = qkv.TransformerEncoderLayer(8, 2, 16, batch_first=True, seed=0)
DEC = qkv.TransformerDecoderLayer(8, 2, 16, batch_first=True, seed=0)
GRU = qkv.GRU(4, 6, batch_first=True, seed=0)
LSTM = qkv.LSTM(4, 6, batch_first=True, seed=0)
P = qkv.positional

# (case name, call, exception type, regex the message must match)
RAISES = [
    # not arrays / not numeric -> TypeError naming the function and the argument
    ("sdpa_none", lambda: SDPA(None, z(2, 4), z(2, 4)), TypeError, r"scaled_dot_product_attention: query .*NoneType"),
    ("sdpa_ragged_list", lambda: SDPA([[1.0], [1.0, 2.0]], z(2, 1), z(2, 1)), TypeError,
     r"query \(list\) could not be read as an array: .*inhomogeneous"),
    ("sdpa_str", lambda: SDPA(z(2, 1), "k", z(2, 1)), TypeError, r"key must be array-like .*got str"),
    ("sdpa_dict", lambda: SDPA(z(2, 1), z(2, 1), {"v": 1}), TypeError, r"value must be array-like .*got dict"),
    ("sdpa_scalar", lambda: SDPA(f32(1), z(2, 1), z(2, 1)), ValueError, r"\[scaled_dot_product_attention\] q \(\)"),
    ("sdpa_unknown_kwarg", lambda: SDPA(z(2, 4), z(2, 4), z(2, 4), enable_gqaa=True), TypeError,
     r"^scaled_dot_product_attention: arguments \(ndarray \(2, 4\), ndarray \(2, 4\), ndarray \(2, 4\), "
     r"enable_gqaa=bool\) match no signature \(query"),
    ("mha_unknown_kwarg", lambda: qkv.MultiheadAttention(8, 2, batch_frist=True), TypeError,
     r"^MultiheadAttention: arguments \(int, int, batch_frist=bool\) match no signature"),
    ("mha_call_unknown_kwarg", lambda: MHA(z(1, 2, 8), z(1, 2, 8), z(1, 2, 8), need_weight=False), TypeError,
     r"^MultiheadAttention.__call__: arguments .*need_weight=bool"),
    ("rope_unknown_kwarg", lambda: P.rope_apply(z(3, 4), offsett=1), TypeError, r"^rope_apply: arguments"),
    ("sdpa_gqa_heads", lambda: SDPA(z(1, 3, 2, 4), z(1, 2, 2, 4), z(1, 2, 2, 4), enable_gqa=True), ValueError,
     r"\[scaled_dot_product_attention\] enable_gqa: the query heads .*\(1, 3, 2, 4\).*\(1, 2, 2, 4\)"),
    ("sdpa_dropout_one", lambda: SDPA(z(2, 4), z(2, 4), z(2, 4), dropout_p=1.0), ValueError, r"dropout_p"),
    ("attention_bool_mask_needs_kind", lambda: qkv.attention(z(2, 4), z(2, 4), z(2, 4), mask=np.ones((2, 2), bool)),
     ValueError, r"\[attention\] mask of dtype bool needs mask_kind"),
    ("sdpa_complex", lambda: SDPA(z(2, 2).astype(complex), z(2, 2), z(2, 2)), TypeError, r"dtype complex128"),
    ("sdpa_object", lambda: SDPA(np.array([[None]]), z(2, 1), z(2, 1)), TypeError, r"dtype object"),
    ("sdpa_strings", lambda: SDPA(np.array([["a"]]), z(2, 1), z(2, 1)), TypeError, r"dtype <U1"),
    ("sdpa_int_mask", lambda: SDPA(z(3, 4), z(3, 4), z(3, 4), attn_mask=np.ones((3, 3), int)), TypeError,
     r"attn_mask has dtype int64; only bool and floating"),
    ("mha_none", lambda: MHA(None, None, None), TypeError, r"MultiheadAttention: query"),
    ("mha_ragged_mask", lambda: MHA(z(1, 2, 8), z(1, 2, 8), z(1, 2, 8), key_padding_mask=[[True], [True, False]]),
     TypeError, r"MultiheadAttention: key_padding_mask \(list\) could not be read as an array"),
    ("enc_ragged", lambda: ENC([[0.0] * 8, [0.0]]), TypeError, r"TransformerEncoderLayer: src"),
    ("torch_tensor_requiring_grad", lambda: SDPA(__import__("torch").ones(2, 4, requires_grad=True), z(2, 4), z(2, 4)),
     TypeError, r"query \(Tensor\) could not be read as an array: .*detach"),
    ("dec_none_memory", lambda: DEC(z(1, 2, 8), None), TypeError, r"TransformerDecoderLayer: memory"),
    ("gru_none", lambda: GRU(None), TypeError, r"GRU: input"),
    ("lstm_bad_hx", lambda: LSTM(z(1, 2, 4), z(1, 1, 6)), TypeError, r"LSTM: hx must be"),
    ("rope_none", lambda: P.rope_apply(None), TypeError, r"rope_apply: x"),
    ("load_state_dict_list", lambda: MHA.load_state_dict([1, 2]), TypeError, r"state_dict must be a dict"),
    ("load_state_dict_key", lambda: MHA.load_state_dict({1: z(2)}), TypeError, r"keys must be str"),
    ("seed_str", lambda: qkv.GRU(4, 6, seed="x"), TypeError, r"seed must be an int"),
    # wrong ranks and shapes -> ValueError "[function] ... (shapes)"
    ("sdpa_rank1", lambda: SDPA(z(8), z(8), z(8)), ValueError, r"\[scaled_dot_product_attention\] q \(8,\)"),
    ("sdpa_rank0", lambda: SDPA(np.array(1, f32), z(1, 1), z(1, 1)), ValueError,
     r"\[scaled_dot_product_attention\] q \(\)"),
    ("sdpa_d_mismatch", lambda: SDPA(z(2, 3, 4), z(2, 3, 5), z(2, 3, 5)), ValueError,
     r"\[scaled_dot_product_attention\] q \(2, 3, 4\) and k \(2, 3, 5\)"),
    ("sdpa_batch_mismatch", lambda: SDPA(z(2, 3, 4), z(3, 3, 4), z(3, 3, 4)), ValueError, r"do not broadcast"),
    ("sdpa_empty_d_mismatch", lambda: SDPA(z(2, 0, 4), z(2, 3, 5), z(2, 3, 4)), ValueError,
     r"\[scaled_dot_product_attention\] q \(2, 0, 4\) and k \(2, 3, 5\)"),
    ("sdpa_mask_shape", lambda: SDPA(z(2, 3, 4), z(2, 3, 4), z(2, 3, 4), attn_mask=np.ones((4, 3), bool)),
     ValueError, r"mask \(4, 3\) does not broadcast"),
    ("sdpa_scale_nan", lambda: SDPA(z(3, 4), z(3, 4), z(3, 4), scale=float("nan")), ValueError, r"scale"),
    ("sdpa_scale_huge", lambda: SDPA(z(3, 4), z(3, 4), z(3, 4), scale=1e300), ValueError, r"scale"),
    ("bwd_grad_shape", lambda: SDPA_BWD(z(2, 3, 4), z(2, 3, 4), z(2, 3, 4), z(2, 3, 5)), ValueError,
     r"\[scaled_dot_product_attention_backward\] grad_out \(2, 3, 5\)"),
    ("bwd_none_grad", lambda: SDPA_BWD(z(2, 3, 4), z(2, 3, 4), z(2, 3, 4), None), TypeError, r"grad_out"),
    ("mha_rank4", lambda: MHA(z(1, 2, 3, 8), z(1, 2, 3, 8), z(1, 2, 3, 8)), ValueError,
     r"\[MultiheadAttention\] query \(1, 2, 3, 8\)"),
    ("mha_width", lambda: MHA(z(1, 2, 7), z(1, 2, 7), z(1, 2, 7)), ValueError, r"query \(1, 2, 7\)"),
    ("mha_kpm_shape", lambda: MHA(z(2, 3, 8), z(2, 3, 8), z(2, 3, 8), key_padding_mask=np.ones((2, 4), bool)),
     ValueError, r"key_padding_mask \(2, 4\) must be \(2, 3\)"),
    ("mha_attn_mask_shape", lambda: MHA(z(2, 3, 8), z(2, 3, 8), z(2, 3, 8), attn_mask=np.ones((5, 3, 3), bool)),
     ValueError, r"attn_mask \(5, 3, 3\)"),
    ("enc_rank1", lambda: ENC(z(8)), ValueError, r"\[TransformerEncoderLayer\] src \(1, 8\)|src \(8,\)"),
    ("dec_mixed_batching", lambda: DEC(z(2, 8), z(1, 2, 8)), ValueError, r"\[TransformerDecoderLayer\] tgt \(2, 8\)"),
    ("gru_width", lambda: GRU(z(2, 3, 5)), ValueError, r"\[GRU\]"),
    ("gru_empty", lambda: GRU(z(2, 0, 4)), ValueError, r"\[GRU\] input \(2, 0, 4\)"),
    ("lstm_state_shape", lambda: LSTM(z(2, 3, 4), (z(1, 3, 6), z(1, 3, 6))), ValueError, r"\[LSTM\]"),
    ("rope_odd", lambda: P.rope_apply(z(3, 5)), ValueError, r"\[rope_apply\] x \(3, 5\)"),
    # absurd sizes: refused before any allocation
    ("mha_huge", lambda: qkv.MultiheadAttention(2 ** 40, 1), ValueError, r"\[MultiheadAttention\] sizes too large"),
    ("mha_negative", lambda: qkv.MultiheadAttention(-8, 2), ValueError, r"embed_dim must be >= 1"),
    ("mha_kdim_overflow", lambda: qkv.MultiheadAttention(8, 2, kdim=2 ** 70), ValueError, r"kdim is too large"),
    ("enc_huge", lambda: qkv.TransformerEncoderLayer(2 ** 30, 2 ** 10, 2 ** 30), ValueError, r"sizes too large"),
    ("gru_huge", lambda: qkv.GRU(2 ** 20, 2 ** 20), ValueError, r"\[GRU\] sizes too large"),
    ("lstm_zero_layers", lambda: qkv.LSTM(4, 6, num_layers=0), ValueError, r"num_layers must be >= 1"),
    ("alibi_huge", lambda: P.alibi_bias(2 ** 20, 2 ** 20, 2 ** 20), ValueError, r"\[alibi_bias\] sizes too large"),
    ("t5_bucket_huge", lambda: P.t5_relative_bucket(2 ** 70), ValueError, r"does not fit in int64"),
    ("huge_broadcast_view", lambda: SDPA(np.broadcast_to(f32(0), (2 ** 20, 2 ** 20, 2)), z(1, 2), z(1, 2)),
     MemoryError, r"1048576"),
]


MAX_MESSAGE = 400  # characters: enough for a function, an argument and three shapes; never an array dump


@pytest.mark.parametrize("name,call,exc,pattern", RAISES, ids=[r[0] for r in RAISES])
def test_garbage_raises_a_clear_exception(name, call, exc, pattern):
    with pytest.raises(exc, match=pattern) as info:
        call()
    message = str(info.value)
    assert "\n" not in message and len(message) <= MAX_MESSAGE, f"{name}: {len(message)} chars: {message[:200]}"


def test_nan_and_inf_inputs_do_not_crash():
    nan = np.full((2, 3, 4), np.nan, f32)
    assert SDPA(nan, z(2, 3, 4), z(2, 3, 4)).shape == (2, 3, 4)
    assert SDPA_BWD(nan, z(2, 3, 4), z(2, 3, 4), z(2, 3, 4))[0].shape == (2, 3, 4)
    out, w = MHA(np.full((1, 3, 8), np.nan, f32), z(1, 3, 8), z(1, 3, 8))
    assert out.shape == (1, 3, 8) and w.shape == (1, 3, 3)
    assert ENC.eval()(np.full((1, 2, 8), np.inf, f32)).shape == (1, 2, 8)
    o, h = GRU(np.full((1, 2, 4), np.nan, f32))
    assert np.all(np.isnan(h))
    sd = MHA.state_dict()
    other = qkv.MultiheadAttention(8, 2)
    other.load_state_dict({k: np.full_like(v, np.nan) for k, v in sd.items()})
    assert np.all(np.isnan(other(z(1, 2, 8), z(1, 2, 8), z(1, 2, 8))[0]))


def test_nan_in_one_key_propagates_to_every_query_as_in_pytorch():
    k = np.ones((1, 3, 4), f32)
    k[0, 1, 0] = np.nan
    out = SDPA(np.ones((1, 3, 4), f32), k, np.ones((1, 3, 4), f32))
    assert np.all(np.isnan(out))


def test_empty_batches_give_empty_results():
    assert SDPA(z(0, 4, 8), z(0, 4, 8), z(0, 4, 8)).shape == (0, 4, 8)
    assert SDPA(z(2, 0, 4), z(2, 3, 4), z(2, 3, 4)).shape == (2, 0, 4)  # Tq == 0, as torch
    np.testing.assert_array_equal(SDPA(z(2, 1, 4) + 1, z(2, 0, 4), z(2, 0, 6)), np.zeros((2, 1, 6)))  # Tk == 0
    assert all(g.shape == s for g, s in zip(SDPA_BWD(z(2, 1, 4), z(2, 0, 4), z(2, 0, 6), z(2, 1, 6)),
                                            [(2, 1, 4), (2, 0, 4), (2, 0, 6)]))
    assert all(g.shape == (0, 3, 4) for g in SDPA_BWD(z(0, 3, 4), z(0, 3, 4), z(0, 3, 4), z(0, 3, 4)))
    out, w = MHA(z(0, 3, 8), z(0, 3, 8), z(0, 3, 8))
    assert out.shape == (0, 3, 8) and w.shape == (0, 3, 3)
    out, w = MHA(z(2, 0, 8), z(2, 0, 8), z(2, 0, 8))
    assert out.shape == (2, 0, 8)
    assert ENC(z(0, 3, 8)).shape == (0, 3, 8)
    assert P.sinusoidal_table(0, 4).shape == (0, 4)


def test_module_seeds_are_reproducible_and_distinct():
    a = qkv.GRU(4, 6, seed=7).state_dict()["weight_ih_l0"]
    b = qkv.GRU(4, 6, seed=7).state_dict()["weight_ih_l0"]
    np.testing.assert_array_equal(a, b)
    qkv.manual_seed(3)
    c = qkv.GRU(4, 6).state_dict()["weight_ih_l0"]
    d = qkv.GRU(4, 6).state_dict()["weight_ih_l0"]
    qkv.manual_seed(3)
    e = qkv.GRU(4, 6).state_dict()["weight_ih_l0"]
    assert not np.array_equal(c, d)
    np.testing.assert_array_equal(c, e)
    qkv.GRU(4, 6, seed=-1)
    qkv.GRU(4, 6, seed=2 ** 100)  # any Python int is a seed (reduced modulo 2^64)


def test_threads_can_share_a_module():
    import threading

    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 16, 8)).astype(f32)
    layer = qkv.TransformerEncoderLayer(8, 2, 16, seed=4).eval()
    expected = layer(x)
    results, errors = [], []

    def work():
        try:
            for _ in range(20):
                results.append(layer(x))
                layer.load_state_dict(layer.state_dict())
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for r in results:
        np.testing.assert_array_equal(r, expected)


def test_sdpa_float64_input_past_float32_range_raises_not_nan():
    q = np.ones((1, 2, 4))
    q[0, 1, 2] = 1e39  # finite in float64, inf in float32
    with pytest.raises(ValueError, match=r"^\[scaled_dot_product_attention\] query holds 1e\+39 \(flat index 6\)"):
        SDPA(q, np.ones((1, 2, 4)), np.ones((1, 2, 4)))
    mask = np.zeros((2, 2))
    mask[0, 1] = -np.inf  # an infinite float64 mask value is meant, not an overflow
    out = SDPA(np.ones((1, 2, 4)), np.ones((1, 2, 4)), np.ones((1, 2, 4)), attn_mask=mask)
    assert np.isfinite(out).all()


def test_mha_batch_first_false_shape_error_shows_the_callers_shape_and_layout():
    mha = qkv.MultiheadAttention(16, 2, seed=0)  # batch_first=False: (T, B, E)
    x = z(4, 2, 15)
    with pytest.raises(ValueError, match=r"query \(4, 2, 15\) must have last dim embed_dim = 16") as e:
        mha(x, x, x)
    assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match=r"query \(4, 2, 16\), key \(3, 16\) .* must all be \(T, B, dim\)"):
        mha(z(4, 2, 16), z(3, 16), z(3, 16))
    with pytest.raises(ValueError, match=r"query \(2, 4, 15\) must have last dim"):
        qkv.MultiheadAttention(16, 2, batch_first=True, seed=0)(z(2, 4, 15), z(2, 4, 15), z(2, 4, 15))
