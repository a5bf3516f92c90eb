"""Property-based tests (hypothesis) of the Python attention API: random shapes, strides, dtypes, masks and NaN/inf
patterns. Every call gives either the float64 reference answer (PyTorch in float64) or a one-line ValueError /
TypeError; never a crash, never a silent NaN, never an answer where the reference refuses.

Only behaviour that holds under PyTorch's conventions is asserted: a float mask is added to the scores; a bool mask
keeps its True entries in SDPA; in MultiheadAttention a bool True means "not allowed" / "padding". Inputs are given
batch-first and batch_first=True is passed explicitly.
"""
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import qkv

SETTINGS = settings(max_examples=120, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
DTYPES = [np.float32, np.float64, np.float16]


def tolerance(ref):
    """float32 compute against a float64 reference: a few ulps of float32 at the reference's magnitude."""
    return 2e-5 + 2e-5 * np.abs(ref)


def one_line_error(exc):
    msg = str(exc)
    assert isinstance(exc, (ValueError, TypeError)), f"{type(exc).__name__}: {msg}"
    assert msg and "\n" not in msg, f"not one line: {msg!r}"


def strided(data, shape, dtype):
    """An array of `shape` and `dtype` drawn as C order, a transposed view, or every other element of a bigger one."""
    layout = data.draw(st.sampled_from(["c", "transposed", "step"]))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    if layout == "transposed" and len(shape) >= 2:
        base = rng.uniform(-2, 2, size=shape[:-2] + (shape[-1], shape[-2])).astype(dtype)
        return np.swapaxes(base, -1, -2)
    if layout == "step" and len(shape) >= 1:
        base = rng.uniform(-2, 2, size=shape[:-1] + (2 * shape[-1],)).astype(dtype)
        return base[..., ::2]
    return rng.uniform(-2, 2, size=shape).astype(dtype)


def torch_sdpa64(q, k, v, mask=None, is_causal=False, scale=None):
    t = lambda a: torch.from_numpy(np.asarray(a, dtype=np.float64))  # noqa: E731
    m = None if mask is None else (torch.from_numpy(mask) if mask.dtype == bool else t(mask))
    with torch.no_grad():
        return torch.nn.functional.scaled_dot_product_attention(t(q), t(k), t(v), attn_mask=m, is_causal=is_causal,
                                                                scale=scale).numpy()


def assert_matches(got, ref, what):
    assert got.shape == ref.shape, (what, got.shape, ref.shape)
    assert np.isfinite(got).all(), f"{what}: non-finite output from finite input"
    bad = np.abs(got.astype(np.float64) - ref) > tolerance(ref)
    assert not bad.any(), f"{what}: max error {np.abs(got - ref).max():.3g}"


# --- scaled_dot_product_attention: valid inputs give the float64 answer ------------------------------------------

@st.composite
def sdpa_case(draw):
    lead = tuple(draw(st.lists(st.integers(1, 3), min_size=0, max_size=2)))
    tq, tk = draw(st.integers(1, 9)), draw(st.integers(1, 9))
    dk, dv = draw(st.integers(1, 17)), draw(st.integers(1, 17))
    dtypes = [draw(st.sampled_from(DTYPES)) for _ in range(3)]
    data = draw(st.data())
    q = strided(data, lead + (tq, dk), dtypes[0])
    k = strided(data, lead + (tk, dk), dtypes[1])
    v = strided(data, lead + (tk, dv), dtypes[2])
    kind = draw(st.sampled_from(["none", "bool", "float", "causal"]))
    mask = None
    if kind in ("bool", "float"):
        mshape = draw(st.sampled_from([(tq, tk), (1, tk), (tq, 1), lead + (tq, tk)]))
        rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
        if kind == "bool":
            mask = rng.random(mshape) < draw(st.sampled_from([0.3, 0.7, 1.0]))
        else:
            mask = rng.uniform(-3, 3, mshape).astype(draw(st.sampled_from([np.float32, np.float64])))
            mask[rng.random(mshape) < 0.3] = -np.inf
    scale = draw(st.sampled_from([None, 0.5, 2.0]))
    return q, k, v, mask, kind == "causal", scale


def rows_fully_blocked(mask, shape_q, tk, causal):
    """(…, Tq) True where a query row has no key to attend to (output 0 in both qkv and PyTorch 2.13's math)."""
    if mask is None:
        return None
    keep = mask if mask.dtype == bool else np.isfinite(mask)
    keep = np.broadcast_to(keep, np.broadcast_shapes(keep.shape, shape_q[:-1] + (tk,)))
    return ~keep.any(axis=-1)


@SETTINGS
@given(sdpa_case())
def test_sdpa_gives_the_float64_answer_for_any_shape_stride_dtype_and_mask(case):
    q, k, v, mask, causal, scale = case
    got = qkv.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, scale=scale)
    ref = torch_sdpa64(q, k, v, mask, causal, scale)
    blocked = rows_fully_blocked(mask, q.shape, k.shape[-2], causal)
    if blocked is not None and blocked.any():
        # A row with no key: qkv gives 0 (never NaN); compare the other rows with the reference.
        assert (got[np.broadcast_to(blocked, got.shape[:-1])] == 0).all()
        ref = np.where(np.broadcast_to(blocked[..., None], ref.shape), 0.0, ref)
    assert got.dtype == np.float32
    assert_matches(got, ref, "sdpa")


# --- invalid inputs: a one-line ValueError / TypeError, and never an answer where the reference refuses ----------

@st.composite
def sdpa_maybe_invalid(draw):
    def shape():
        return tuple(draw(st.lists(st.integers(0, 4), min_size=draw(st.integers(0, 4)), max_size=4)))
    q, k, v = shape(), shape(), shape()
    dtype = draw(st.sampled_from([np.float32, np.float64, np.int32, np.bool_, np.complex64, object, "U1"]))
    mask = draw(st.sampled_from([None, "bool", "float", "int"]))
    return q, k, v, dtype, mask, draw(st.booleans())


@SETTINGS
@given(sdpa_maybe_invalid())
def test_sdpa_with_arbitrary_shapes_and_dtypes_answers_right_or_refuses_in_one_line(case):
    qs, ks, vs, dtype, mask_kind, causal = case
    make = lambda s: np.ones(s, dtype=dtype) if dtype not in (object, "U1") else np.full(s, "a", dtype=dtype)  # noqa
    q, k, v = make(qs), make(ks), make(vs)
    mask = None
    if mask_kind is not None and len(qs) >= 1 and len(ks) >= 2:
        mshape = (qs[-2] if len(qs) >= 2 else 1, ks[-2])
        mask = {"bool": np.ones(mshape, bool), "float": np.zeros(mshape, np.float32),
                "int": np.ones(mshape, np.int32)}[mask_kind]
    try:
        got = qkv.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal and mask is None)
    except Exception as e:  # noqa: BLE001 - the property is about which exceptions
        one_line_error(e)
        return
    # qkv answered: the reference must answer the same
    ref = torch_sdpa64(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64),
                       None if mask is None else mask, causal and mask is None)
    assert got.shape == ref.shape
    if got.size:
        assert np.isfinite(got).all()
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)


# --- NaN / inf patterns ---------------------------------------------------------------------------------------------

@st.composite
def nan_case(draw):
    b, tq, tk, d = draw(st.integers(1, 2)), draw(st.integers(1, 8)), draw(st.integers(1, 8)), draw(st.integers(1, 9))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    q = rng.uniform(-2, 2, (b, tq, d)).astype(np.float32)
    k = rng.uniform(-2, 2, (b, tk, d)).astype(np.float32)
    v = rng.uniform(-2, 2, (b, tk, d)).astype(np.float32)
    for _ in range(draw(st.integers(1, 3))):  # a few non-finite entries anywhere in q, k or v
        a = draw(st.sampled_from([q, k, v]))
        idx = tuple(int(rng.integers(0, n)) for n in a.shape)
        a[idx] = np.nan if a is not v else draw(st.sampled_from([np.nan, np.inf, -np.inf]))
    keep = rng.random((tq, tk)) < 0.6
    keep[np.arange(tq), np.arange(tq) % tk] = True  # every query keeps a key: no fully masked row
    return q, k, v, keep


@SETTINGS
@given(nan_case())
def test_non_finite_inputs_give_the_reference_non_finite_pattern_and_exact_values_elsewhere(case):
    """NaN in q/k/v (and inf in v) propagate exactly where PyTorch's float64 SDPA propagates them; a masked-out
    entry never leaks into rows that do not attend to it."""
    q, k, v, keep = case
    got = qkv.scaled_dot_product_attention(q, k, v, attn_mask=keep)
    ref = torch_sdpa64(q, k, v, keep)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(ref), err_msg="NaN pattern differs from the reference")
    np.testing.assert_array_equal(np.isinf(got), np.isinf(ref), err_msg="inf pattern differs from the reference")
    fin = np.isfinite(ref)
    assert not (np.abs(got[fin] - ref[fin]) > tolerance(ref[fin])).any()


# --- qkv.attention: mask kinds and causal variants against the same reference --------------------------------------

@st.composite
def attention_case(draw):
    b, h = draw(st.integers(1, 2)), draw(st.integers(1, 3))
    tq, tk, d = draw(st.integers(1, 8)), draw(st.integers(1, 8)), draw(st.integers(1, 12))
    data = draw(st.data())
    q = strided(data, (b, h, tq, d), draw(st.sampled_from(DTYPES)))
    k = strided(data, (b, h, tk, d), draw(st.sampled_from(DTYPES)))
    v = strided(data, (b, h, tk, d), draw(st.sampled_from(DTYPES)))
    kind = draw(st.sampled_from(["keep", "block", "additive"]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    if kind == "additive":
        mask = rng.uniform(-2, 2, (tq, tk)).astype(np.float32)
    else:
        mask = rng.random((tq, tk)) < 0.6
    return q, k, v, mask, kind


@SETTINGS
@given(attention_case())
def test_attention_mask_kinds_give_the_float64_answer(case):
    q, k, v, mask, kind = case
    try:
        out = qkv.attention(q, k, v, mask=mask, mask_kind=kind)
    except Exception as e:  # noqa: BLE001
        one_line_error(e)
        pytest.fail(f"valid call refused: {e}")
    out = out[0] if isinstance(out, tuple) else out
    if kind == "keep":
        ref_mask = mask
    elif kind == "block":
        ref_mask = ~mask
    else:
        ref_mask = mask
    ref = torch_sdpa64(q, k, v, ref_mask)
    if ref_mask.dtype == bool:
        blocked = ~ref_mask.any(axis=-1)
        ref[..., blocked, :] = 0.0
        assert (out[..., blocked, :] == 0).all()
    assert_matches(out, ref, f"attention {kind}")


# --- MultiheadAttention against torch.nn.MultiheadAttention in float64 ------------------------------------------------

@st.composite
def mha_case(draw):
    h = draw(st.integers(1, 3))
    e = h * draw(st.integers(1, 4))
    b, tq, tk = draw(st.integers(1, 2)), draw(st.integers(1, 6)), draw(st.integers(1, 6))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    x = rng.uniform(-1, 1, (b, tq, e)).astype(draw(st.sampled_from(DTYPES)))
    mem = rng.uniform(-1, 1, (b, tk, e)).astype(np.float32)
    kpm = None
    if draw(st.booleans()):
        kpm = rng.random((b, tk)) < 0.4
    attn = None
    kind = draw(st.sampled_from(["none", "bool", "float"]))
    if kind == "bool":
        attn = rng.random((tq, tk)) < 0.3
    elif kind == "float":
        attn = rng.uniform(-2, 2, (tq, tk)).astype(np.float32)
    return e, h, x, mem, kpm, attn, draw(st.booleans()), draw(st.integers(0, 1000))


@SETTINGS
@given(mha_case())
def test_multihead_attention_gives_torch_float64_answer_with_random_masks(case):
    e, h, x, mem, kpm, attn, self_attn, seed = case
    torch.manual_seed(seed)
    ref_mod = torch.nn.MultiheadAttention(e, h, batch_first=True).double().eval()
    mod = qkv.MultiheadAttention(e, h, batch_first=True, seed=0).eval()
    state = {k: v.detach().float().numpy() for k, v in ref_mod.state_dict().items()}
    mod.load_state_dict(state)
    with torch.no_grad():  # the reference gets the same float32-rounded weights
        for name, p in ref_mod.named_parameters():
            p.copy_(torch.from_numpy(state[name].astype(np.float64)))
    key = x if self_attn else mem
    if self_attn and kpm is not None:
        kpm = kpm[:, : x.shape[1]] if kpm.shape[1] >= x.shape[1] else None
    if self_attn and attn is not None:
        attn = attn[: x.shape[1], : x.shape[1]] if attn.shape[1] >= x.shape[1] else None
    out, _ = mod(x, key, key, key_padding_mask=kpm, attn_mask=attn, need_weights=False)
    t = lambda a: torch.from_numpy(np.asarray(a, np.float64))  # noqa: E731
    with torch.no_grad():
        ref, _ = ref_mod(t(x), t(key), t(key), key_padding_mask=None if kpm is None else torch.from_numpy(kpm),
                         attn_mask=None if attn is None else (torch.from_numpy(attn) if attn.dtype == bool
                                                              else t(attn)), need_weights=False)
    ref = ref.numpy()
    # A query with every key blocked: PyTorch's MHA gives NaN, qkv out_proj.bias (documented); compare the rest.
    nan_rows = np.isnan(ref).any(axis=-1)
    assert np.isfinite(out).all(), "qkv MultiheadAttention returned a non-finite value for finite input"
    assert_matches(out[~nan_rows], ref[~nan_rows], "mha")
