"""Shared helpers of the PyTorch parity tests: the tolerance rule, float64/float32 torch runs, weight copies.

The tolerance rule (the only one the parity tests use): qkv's largest error against a float64 PyTorch run must be
at most PARITY_FACTOR times PyTorch float32's own largest error against that run, plus a tiny absolute floor
(PARITY_ATOL_REL · max|reference|) for outputs where float32 PyTorch happens to be exact.
Set QKV_PARITY_LOG=<file> to append one JSON line per comparison (the numbers quoted in docs and reports).
"""
import copy
import json
import os
import sys

import numpy as np
import torch

torch.set_num_threads(2)

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "scripts"))
from export_torch import state_dict_numpy  # noqa: E402,F401  (re-exported for the tests)

PARITY_FACTOR = 4.0
PARITY_ATOL_REL = 1e-6


def assert_parity(name, got, ref64, ref32, factor=PARITY_FACTOR, atol_rel=PARITY_ATOL_REL, magnitude=None):
    """max|got - ref64| <= factor * max|ref32 - ref64| + atol_rel * max(1, magnitude); shapes must match.

    magnitude defaults to max|ref64|. Pass the size of the terms the result is computed from where the exact
    answer cancels to ~0 (a gradient through a one-key softmax is exactly 0 in float64, a few ulps in float32).
    """
    got = np.asarray(got, dtype=np.float64)
    ref = np.asarray(ref64, dtype=np.float64)
    t32 = np.asarray(ref32, dtype=np.float64)
    assert got.shape == ref.shape == t32.shape, f"{name}: shapes qkv {got.shape}, torch {ref.shape}, {t32.shape}"
    assert np.all(np.isfinite(ref)), f"{name}: the float64 reference has non-finite values"
    assert np.all(np.isfinite(got)), f"{name}: qkv gave non-finite values"
    err_qkv = float(np.max(np.abs(got - ref))) if got.size else 0.0
    err_t32 = float(np.max(np.abs(t32 - ref))) if got.size else 0.0
    scale = float(np.max(np.abs(ref))) if got.size else 0.0
    if magnitude is not None:
        scale = max(scale, float(magnitude))
    atol = atol_rel * max(1.0, scale)
    bound = factor * err_t32 + atol
    log = os.environ.get("QKV_PARITY_LOG")
    if log:
        with open(log, "a") as f:
            f.write(json.dumps({"name": name, "qkv": err_qkv, "torch32": err_t32, "scale": scale}) + "\n")
    assert err_qkv <= bound, (f"{name}: qkv max error {err_qkv:.3g} vs float64 torch exceeds {factor} x torch "
                              f"float32's {err_t32:.3g} + {atol:.3g} (max |ref| {scale:.3g})")


def t64(a):
    """float64 torch tensor of a numpy array (None passes through)."""
    return None if a is None else torch.from_numpy(np.asarray(a, dtype=np.float64))


def t32(a):
    return None if a is None else torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32))


def tmask(m, dtype):
    """A mask as torch: bool stays bool, float becomes `dtype`."""
    if m is None:
        return None
    if m.dtype == np.bool_:
        return torch.from_numpy(m)
    return torch.from_numpy(m.astype(np.float64)).to(dtype)


def double_copy(module):
    """A float64 deep copy of a torch module (the oracle)."""
    return copy.deepcopy(module).double()


def rand(rng, *shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)
