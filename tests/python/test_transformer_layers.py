"""qkv.TransformerEncoderLayer / TransformerDecoderLayer against torch.nn's (batch_first=True, eval mode).

Every combination of norm_first and activation, with and without masks (bool/float src/tgt masks, key padding
masks, is_causal with its causal mask), must meet torch_parity.assert_parity.
"""
import itertools
import warnings

import numpy as np
import pytest
import torch

import qkv
from torch_parity import assert_parity, double_copy, rand, state_dict_numpy, tmask

LAYER_OPTIONS = list(itertools.product([False, True], ["relu", "gelu"], ["none", "bool", "float", "causal"]))


def randomise_biases_and_norms(layer):
    # PyTorch initialises biases to 0 and LayerNorm to (1, 0); random values test that each one is wired in.
    with torch.no_grad():
        for name, p in layer.named_parameters():
            if p.dim() == 1:
                p.add_(0.1 * torch.randn_like(p))


def masks(rng, kind, B, Tq, Tk, H):
    """(attn_mask, key_padding_mask, is_causal); key 0 is never blocked, so no row is fully masked."""
    if kind == "none":
        return None, None, False
    if kind == "causal":
        return ~np.tril(np.ones((Tq, Tk), bool)), None, True
    kpm = rng.random((B, Tk)) < 0.3
    kpm[:, 0] = False
    shape = (Tq, Tk) if rng.random() < 0.5 else (B * H, Tq, Tk)
    if kind == "bool":
        am = rng.random(shape) < 0.3
        am[..., 0] = False
    else:
        am = (rng.standard_normal(shape)).astype(np.float32)
        am[..., 1:][rng.random(shape)[..., 1:] < 0.2] = -np.inf
    return am, kpm, False


def run_torch(layer, args, dtype):
    conv = [None if a is None else (torch.from_numpy(a) if a.dtype == np.bool_ else
                                    torch.from_numpy(a.astype(np.float64)).to(dtype)) for a in args[0]]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return layer(*conv, **args[1]).detach().numpy()


@pytest.mark.parametrize("norm_first,activation,mask_kind", LAYER_OPTIONS)
def test_encoder_layer_matches_torch(norm_first, activation, mask_kind):
    seed = LAYER_OPTIONS.index((norm_first, activation, mask_kind))
    rng = np.random.default_rng(3000 + seed)
    torch.manual_seed(seed)
    E, H, F, B, T = 16, 4, 24, 2, 7
    ref = torch.nn.TransformerEncoderLayer(E, H, F, dropout=0.1, activation=activation, batch_first=True,
                                           norm_first=norm_first).eval()
    randomise_biases_and_norms(ref)
    mine = qkv.TransformerEncoderLayer(E, H, F, dropout=0.1, activation=activation, norm_first=norm_first).eval()
    mine.load_state_dict(state_dict_numpy(ref))
    x = rand(rng, B, T, E)
    am, kpm, causal = masks(rng, mask_kind, B, T, T, H)
    out = mine(x, src_mask=am, src_key_padding_mask=kpm, is_causal=causal)
    args = ([x], dict(src_mask=None if am is None else tmask(am, torch.float64),
                      src_key_padding_mask=None if kpm is None else torch.from_numpy(kpm), is_causal=causal))
    ref64 = run_torch(double_copy(ref), args, torch.float64)
    args32 = ([x], dict(args[1], src_mask=None if am is None else tmask(am, torch.float32)))
    ref32 = run_torch(ref, args32, torch.float32)
    assert_parity(f"encoder[{norm_first},{activation},{mask_kind}]", out, ref64, ref32)


@pytest.mark.parametrize("norm_first,activation,mask_kind", LAYER_OPTIONS)
def test_decoder_layer_matches_torch(norm_first, activation, mask_kind):
    seed = LAYER_OPTIONS.index((norm_first, activation, mask_kind))
    rng = np.random.default_rng(4000 + seed)
    torch.manual_seed(100 + seed)
    E, H, F, B, Tt, Ts = 16, 2, 20, 2, 6, 5
    ref = torch.nn.TransformerDecoderLayer(E, H, F, dropout=0.1, activation=activation, batch_first=True,
                                           norm_first=norm_first).eval()
    randomise_biases_and_norms(ref)
    mine = qkv.TransformerDecoderLayer(E, H, F, activation=activation, norm_first=norm_first).eval()
    mine.load_state_dict(state_dict_numpy(ref))
    tgt, mem = rand(rng, B, Tt, E), rand(rng, B, Ts, E)
    tm, tkpm, causal = masks(rng, mask_kind, B, Tt, Tt, H)
    mm, mkpm, _ = masks(rng, "bool" if mask_kind == "causal" else mask_kind, B, Tt, Ts, H)
    out = mine(tgt, mem, tgt_mask=tm, memory_mask=mm, tgt_key_padding_mask=tkpm, memory_key_padding_mask=mkpm,
               tgt_is_causal=causal)

    def torch_args(dtype):
        return ([tgt, mem], dict(tgt_mask=tmask(tm, dtype), memory_mask=tmask(mm, dtype),
                                 tgt_key_padding_mask=tmask(tkpm, dtype), memory_key_padding_mask=tmask(mkpm, dtype),
                                 tgt_is_causal=causal))

    ref64 = run_torch(double_copy(ref), torch_args(torch.float64), torch.float64)
    ref32 = run_torch(ref, torch_args(torch.float32), torch.float32)
    assert_parity(f"decoder[{norm_first},{activation},{mask_kind}]", out, ref64, ref32)


def test_state_dict_names_are_pytorch_names():
    for mine, ref in ((qkv.TransformerEncoderLayer(8, 2, 16), torch.nn.TransformerEncoderLayer(8, 2, 16)),
                      (qkv.TransformerDecoderLayer(8, 2, 16), torch.nn.TransformerDecoderLayer(8, 2, 16))):
        assert list(mine.state_dict()) == list(ref.state_dict())
        for name, a in mine.state_dict().items():
            assert a.shape == tuple(ref.state_dict()[name].shape), name


def test_train_mode_applies_dropout_and_eval_mode_is_deterministic():
    rng = np.random.default_rng(5)
    layer = qkv.TransformerEncoderLayer(8, 2, 16, dropout=0.5, seed=0)
    x = rand(rng, 2, 5, 8)
    assert layer.training
    a, b = layer(x), layer(x)
    assert not np.allclose(a, b)  # fresh dropout masks each call
    assert layer.eval() is layer and not layer.training
    np.testing.assert_array_equal(layer(x), layer(x))
    assert layer.train() is layer and layer.training
    no_dropout = qkv.TransformerEncoderLayer(8, 2, 16, dropout=0.0, seed=0)
    np.testing.assert_array_equal(no_dropout(x), no_dropout.eval()(x))


def test_unbatched_input_matches_batch_of_one():
    rng = np.random.default_rng(6)
    enc = qkv.TransformerEncoderLayer(8, 2, 16, seed=1).eval()
    dec = qkv.TransformerDecoderLayer(8, 2, 16, seed=2).eval()
    x, m = rand(rng, 5, 8), rand(rng, 3, 8)
    kpm = np.array([False, False, True, False, False])
    np.testing.assert_allclose(enc(x, src_key_padding_mask=kpm), enc(x[None], src_key_padding_mask=kpm[None])[0],
                               atol=1e-6)
    np.testing.assert_allclose(dec(x, m), dec(x[None], m[None])[0], atol=1e-6)


def test_constructor_and_call_errors_name_the_layer():
    with pytest.raises(ValueError, match="only batch_first=True"):
        qkv.TransformerEncoderLayer(8, 2, batch_first=False)
    with pytest.raises(ValueError, match=r"\[TransformerDecoderLayer\].*divisible"):
        qkv.TransformerDecoderLayer(10, 3)
    with pytest.raises(ValueError, match=r"TransformerEncoderLayer.*activation"):
        qkv.TransformerEncoderLayer(8, 2, activation="swish")
    with pytest.raises(TypeError, match="activation"):
        qkv.TransformerEncoderLayer(8, 2, activation=torch.nn.functional.relu)
    enc = qkv.TransformerEncoderLayer(8, 2, 16)
    with pytest.raises(ValueError, match=r"\[TransformerEncoderLayer\] src \(2, 5, 7\)"):
        enc(np.zeros((2, 5, 7), np.float32))
    dec = qkv.TransformerDecoderLayer(8, 2, 16)
    with pytest.raises(ValueError, match=r"\[TransformerDecoderLayer\]"):
        dec(np.zeros((2, 5, 8), np.float32), np.zeros((3, 5, 8), np.float32))
