"""qkv.attention against PyTorch 2.13 run in float64: the module is importable and agrees on the basics."""
import os

import numpy as np
import pytest
import torch

import qkv

torch.set_num_threads(2)


def oracle(q, k, v, mask=None, causal=False, scale=None):
    t = [torch.from_numpy(np.asarray(a, dtype=np.float64)) for a in (q, k, v)]
    m = None if mask is None else torch.from_numpy(mask)
    return torch.nn.functional.scaled_dot_product_attention(*t, attn_mask=m, is_causal=causal, scale=scale).numpy()


def test_module_is_built_from_this_tree():
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert os.path.realpath(qkv.__file__).startswith(os.path.realpath(here))


@pytest.mark.parametrize("shape", [(2, 4, 10, 16), (1, 1, 1, 3), (3, 7, 5)])
def test_matches_float64_torch(shape):
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal(shape).astype(np.float32) for _ in range(3))
    out = qkv.attention(q, k, v)
    ref = oracle(q, k, v)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-6)


def test_keep_mask_and_top_left_causal_match_torch():
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal((2, 3, 6, 8)).astype(np.float32) for _ in range(3))
    keep = rng.random((6, 6)) > 0.3
    keep[:, 0] = True
    np.testing.assert_allclose(qkv.attention(q, k, v, mask=keep, mask_kind="keep"), oracle(q, k, v, mask=keep),
                               rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(qkv.attention(q, k, v, causal="top_left"), oracle(q, k, v, causal=True),
                               rtol=1e-5, atol=1e-6)


def test_shape_error_is_value_error_naming_the_op():
    q = np.zeros((2, 4, 8), np.float32)
    k = np.zeros((2, 4, 7), np.float32)
    with pytest.raises(ValueError, match=r"\[attention\]"):
        qkv.attention(q, k, k)


def test_non_array_is_type_error_and_lists_are_arrays():
    with pytest.raises(TypeError, match="query must be array-like"):
        qkv.attention(None, np.zeros((1, 1), np.float32), np.zeros((1, 1), np.float32))
    out = qkv.attention([[1.0]], np.zeros((1, 1), np.float32), np.ones((1, 1), np.float32))
    np.testing.assert_array_equal(out, np.ones((1, 1), np.float32))


def test_mask_kind_defaults_to_additive_for_float_masks_and_is_required_otherwise():
    rng = np.random.default_rng(2)
    q, k, v = (rng.standard_normal((2, 5, 8)).astype(np.float32) for _ in range(3))
    bias = rng.standard_normal((5, 5)).astype(np.float32)
    np.testing.assert_array_equal(qkv.attention(q, k, v, mask=bias), qkv.attention(q, k, v, mask=bias,
                                                                                     mask_kind="additive"))
    for mask in (np.ones((5, 5), bool), np.ones((5, 5), np.int64)):
        with pytest.raises(ValueError, match=r"\[attention\] mask of dtype .* needs mask_kind"):
            qkv.attention(q, k, v, mask=mask)
    np.testing.assert_array_equal(qkv.attention(q, k, v, mask=np.ones((5, 5), bool), mask_kind="keep"),
                                  qkv.attention(q, k, v))
