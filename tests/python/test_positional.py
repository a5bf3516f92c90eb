"""qkv.positional against the reference code each scheme is known by: the Transformer paper's formula (float64),
HF transformers' rotate_half RoPE and LLaMA's complex RoPE (torch, float32 recipe), the ALiBi authors' get_slopes,
and HF's T5 _relative_position_bucket (torch).
"""
import math

import numpy as np
import pytest
import torch

import qkv
from torch_parity import rand

P = qkv.positional
EPS32 = float(np.finfo(np.float32).eps)


def test_sinusoidal_table_matches_the_formula_in_float64():
    for T, E, offset in ((50, 16, 0), (7, 9, 1000), (1, 1, 0), (0, 4, 0)):
        got = P.sinusoidal_table(T, E, offset=offset)
        pos = np.arange(offset, offset + T, dtype=np.float64)[:, None]
        i = np.arange(E)
        angle = pos / np.power(10000.0, (i - i % 2) / E)
        ref = np.where(i % 2 == 0, np.sin(angle), np.cos(angle))
        assert got.shape == (T, E) and got.dtype == np.float32
        np.testing.assert_allclose(got, ref, rtol=0, atol=EPS32)  # rounded once from float64


def test_add_sinusoidal_adds_the_table():
    rng = np.random.default_rng(1)
    x = rand(rng, 2, 6, 10)
    np.testing.assert_allclose(P.add_sinusoidal(x, offset=3), x + P.sinusoidal_table(6, 10, offset=3), atol=1e-6)


def hf_rope_half_split(x, positions, base=10000.0):
    # transformers' LlamaRotaryEmbedding + rotate_half, float32 as HF computes it.
    D = x.shape[-1]
    inv_freq = 1.0 / (base ** (torch.arange(0, D, 2, dtype=torch.int64).float() / D))
    freqs = torch.outer(torch.tensor(positions, dtype=torch.float32), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    xt = torch.from_numpy(x)
    x1, x2 = xt[..., : D // 2], xt[..., D // 2:]
    return (xt * emb.cos() + torch.cat((-x2, x1), dim=-1) * emb.sin()).numpy()


def llama_rope_interleaved(x, positions, base=10000.0):
    # Meta LLaMA's precompute_freqs_cis / apply_rotary_emb (complex pairs (2i, 2i+1)), float32.
    D = x.shape[-1]
    freqs = 1.0 / (base ** (torch.arange(0, D, 2)[: D // 2].float() / D))
    freqs_cis = torch.polar(torch.ones(len(positions), D // 2),
                            torch.outer(torch.tensor(positions, dtype=torch.float32), freqs))
    xc = torch.view_as_complex(torch.from_numpy(x).reshape(*x.shape[:-1], D // 2, 2))
    return torch.view_as_real(xc * freqs_cis).flatten(-2).numpy()


@pytest.mark.parametrize("variant,ref_fn", [("half_split", hf_rope_half_split),
                                            ("interleaved", llama_rope_interleaved)])
def test_rope_matches_reference_implementations(variant, ref_fn):
    rng = np.random.default_rng(2)
    x = rand(rng, 2, 3, 11, 16)
    for offset in (0, 5, 4000):
        positions = list(range(offset, offset + 11))
        got = P.rope_apply(x, offset=offset, variant=variant)
        ref = ref_fn(x, positions)
        # Same float32 angle recipe, so the angles agree; only sin/cos and the products round differently.
        tol = 4 * EPS32 * float(np.max(np.abs(x)))
        np.testing.assert_allclose(got, ref, rtol=0, atol=tol)
        np.testing.assert_array_equal(P.rope_apply(x, positions=positions, variant=variant), got)


def test_rope_scores_depend_only_on_the_distance():
    rng = np.random.default_rng(3)
    q, k = rand(rng, 1, 6, 8), rand(rng, 1, 6, 8)
    s0 = P.rope_apply(q) @ P.rope_apply(k).swapaxes(-1, -2)
    s7 = P.rope_apply(q, offset=7) @ P.rope_apply(k, offset=7).swapaxes(-1, -2)
    np.testing.assert_allclose(s0, s7, atol=1e-4)


def alibi_get_slopes(n):
    # From ofirpress/attention_with_linear_biases (fairseq/models/transformer.py).
    def get_slopes_power_of_2(n):
        start = 2 ** (-2 ** -(math.log2(n) - 3))
        ratio = start
        return [start * ratio ** i for i in range(n)]

    if math.log2(n).is_integer():
        return get_slopes_power_of_2(n)
    closest = 2 ** math.floor(math.log2(n))
    return get_slopes_power_of_2(closest) + alibi_get_slopes(2 * closest)[0::2][: n - closest]


@pytest.mark.parametrize("H", [1, 2, 3, 5, 8, 12, 16])
def test_alibi_slopes_match_the_authors_code(H):
    np.testing.assert_allclose(P.alibi_slopes(H), alibi_get_slopes(H), rtol=2 * EPS32)


def test_alibi_bias_causal_and_symmetric():
    H, Tq, Tk, off = 4, 3, 6, 3
    slopes = np.asarray(alibi_get_slopes(H))[:, None, None]
    p = np.arange(Tq)[:, None] + off
    j = np.arange(Tk)[None, :]
    causal = np.where(j <= p, -slopes * (p - j), -np.inf)
    np.testing.assert_allclose(P.alibi_bias(H, Tq, Tk, mode="causal", query_offset=off)[0], causal, rtol=1e-6)
    sym = -slopes * np.abs(p - j)
    np.testing.assert_allclose(P.alibi_bias(H, Tq, Tk, mode="symmetric", query_offset=off)[0], sym, rtol=1e-6)
    with pytest.raises(ValueError, match="mode"):
        P.alibi_bias(H, Tq, Tk, mode="both")


def hf_t5_bucket(relative_position, bidirectional=True, num_buckets=32, max_distance=128):
    # transformers.models.t5.modeling_t5.T5Attention._relative_position_bucket
    relative_buckets = 0
    if bidirectional:
        num_buckets //= 2
        relative_buckets += (relative_position > 0).to(torch.long) * num_buckets
        relative_position = torch.abs(relative_position)
    else:
        relative_position = -torch.min(relative_position, torch.zeros_like(relative_position))
    max_exact = num_buckets // 2
    is_small = relative_position < max_exact
    relative_position_if_large = max_exact + (
        torch.log(relative_position.float() / max_exact) / math.log(max_distance / max_exact)
        * (num_buckets - max_exact)).to(torch.long)
    relative_position_if_large = torch.min(relative_position_if_large,
                                           torch.full_like(relative_position_if_large, num_buckets - 1))
    relative_buckets += torch.where(is_small, relative_position, relative_position_if_large)
    return relative_buckets


@pytest.mark.parametrize("bidirectional,num_buckets,max_distance", [(True, 32, 128), (False, 32, 128),
                                                                   (True, 8, 20), (False, 10, 64)])
def test_t5_relative_bucket_is_bit_for_bit_hf(bidirectional, num_buckets, max_distance):
    rel = np.arange(-600, 601, dtype=np.int64)
    got = P.t5_relative_bucket(rel, bidirectional=bidirectional, num_buckets=num_buckets, max_distance=max_distance)
    ref = hf_t5_bucket(torch.from_numpy(rel), bidirectional, num_buckets, max_distance).numpy()
    np.testing.assert_array_equal(got, ref)
    assert P.t5_relative_bucket(-7, bidirectional, num_buckets, max_distance) == ref[600 - 7]


def test_t5_relative_bias_gathers_the_table():
    rng = np.random.default_rng(4)
    table = rand(rng, 32, 3)
    Tq, Tk = 4, 9
    got = P.t5_relative_bias(table, Tq, Tk, bidirectional=True, max_distance=128, query_offset=Tk - Tq)
    rel = np.arange(Tk)[None, :] - (np.arange(Tq)[:, None] + Tk - Tq)
    buckets = hf_t5_bucket(torch.from_numpy(rel), True, 32, 128).numpy()
    np.testing.assert_array_equal(got[0], table[buckets].transpose(2, 0, 1))


def test_positional_errors_name_the_function():
    with pytest.raises(ValueError, match=r"\[rope_apply\] x \(2, 5\)"):
        P.rope_apply(np.zeros((2, 5), np.float32))
    with pytest.raises(ValueError, match=r"rope_apply.*variant"):
        P.rope_apply(np.zeros((2, 4), np.float32), variant="neox")
    with pytest.raises(ValueError, match=r"\[sinusoidal_table\]"):
        P.sinusoidal_table(-1, 4)
    with pytest.raises(ValueError, match=r"\[sinusoidal_table\] sizes too large"):
        P.sinusoidal_table(2 ** 31, 2 ** 31)
    with pytest.raises(ValueError, match=r"\[alibi_slopes\]"):
        P.alibi_slopes(0)
    with pytest.raises(ValueError, match=r"t5_relative_bucket"):
        P.t5_relative_bucket(3, num_buckets=1)
    with pytest.raises(TypeError, match="t5_relative_bucket"):
        P.t5_relative_bucket(np.zeros(3, np.float32))
    with pytest.raises(ValueError, match=r"\[t5_relative_bias\] table"):
        P.t5_relative_bias(np.zeros(5, np.float32), 2, 2)
