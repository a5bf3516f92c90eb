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
    mine = qkv.TransformerEncoderLayer(E, H, F, dropout=0.1, activation=activation, batch_first=True,
                                       norm_first=norm_first).eval()
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
    mine = qkv.TransformerDecoderLayer(E, H, F, activation=activation, batch_first=True, norm_first=norm_first).eval()
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
    layer = qkv.TransformerEncoderLayer(8, 2, 16, dropout=0.5, batch_first=True, seed=0)
    x = rand(rng, 2, 5, 8)
    assert layer.training
    a, b = layer(x), layer(x)
    assert not np.allclose(a, b)  # fresh dropout masks each call
    assert layer.eval() is layer and not layer.training
    np.testing.assert_array_equal(layer(x), layer(x))
    assert layer.train() is layer and layer.training
    no_dropout = qkv.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True, seed=0)
    np.testing.assert_array_equal(no_dropout(x), no_dropout.eval()(x))


def test_unbatched_input_matches_batch_of_one():
    rng = np.random.default_rng(6)
    enc = qkv.TransformerEncoderLayer(8, 2, 16, batch_first=True, seed=1).eval()
    dec = qkv.TransformerDecoderLayer(8, 2, 16, batch_first=True, seed=2).eval()
    x, m = rand(rng, 5, 8), rand(rng, 3, 8)
    kpm = np.array([False, False, True, False, False])
    np.testing.assert_allclose(enc(x, src_key_padding_mask=kpm), enc(x[None], src_key_padding_mask=kpm[None])[0],
                               atol=1e-6)
    np.testing.assert_allclose(dec(x, m), dec(x[None], m[None])[0], atol=1e-6)


def test_batch_first_defaults_to_false_as_torch_and_both_layouts_agree():
    rng = np.random.default_rng(9)
    torch.manual_seed(4)
    ref_enc = torch.nn.TransformerEncoderLayer(8, 2, 16).eval()  # torch's default layout: (T, B, E)
    ref_dec = torch.nn.TransformerDecoderLayer(8, 2, 16).eval()
    enc, dec = qkv.TransformerEncoderLayer(8, 2, 16).eval(), qkv.TransformerDecoderLayer(8, 2, 16).eval()
    enc_bf = qkv.TransformerEncoderLayer(8, 2, 16, batch_first=True).eval()
    dec_bf = qkv.TransformerDecoderLayer(8, 2, 16, batch_first=True).eval()
    assert enc.batch_first is False and dec_bf.batch_first is True
    for m in (enc, enc_bf):
        m.load_state_dict(ref_enc.state_dict())
    for m in (dec, dec_bf):
        m.load_state_dict(ref_dec.state_dict())
    src, tgt = rand(rng, 6, 2, 8), rand(rng, 4, 2, 8)  # (T, B, E)
    kpm = np.zeros((2, 6), bool)
    kpm[0, -2:] = True
    with torch.no_grad():
        t_enc = ref_enc(torch.from_numpy(src), src_key_padding_mask=torch.from_numpy(kpm)).numpy()
        t_dec = ref_dec(torch.from_numpy(tgt), torch.from_numpy(src)).numpy()
    y = enc(src, src_key_padding_mask=kpm)
    assert y.shape == (6, 2, 8)
    np.testing.assert_allclose(y, t_enc, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(enc_bf(src.transpose(1, 0, 2), src_key_padding_mask=kpm).transpose(1, 0, 2), y,
                               rtol=1e-6, atol=1e-6)
    z = dec(tgt, src)
    assert z.shape == (4, 2, 8)
    np.testing.assert_allclose(z, t_dec, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(dec_bf(tgt.transpose(1, 0, 2), src.transpose(1, 0, 2)).transpose(1, 0, 2), z,
                               rtol=1e-6, atol=1e-6)


def test_constructor_and_call_errors_name_the_layer():
    with pytest.raises(ValueError, match=r"\[TransformerDecoderLayer\].*divisible"):
        qkv.TransformerDecoderLayer(10, 3)
    with pytest.raises(ValueError, match=r"TransformerEncoderLayer.*activation"):
        qkv.TransformerEncoderLayer(8, 2, activation="swish")
    with pytest.raises(TypeError, match="activation"):
        qkv.TransformerEncoderLayer(8, 2, activation=torch.nn.functional.relu)
    enc = qkv.TransformerEncoderLayer(8, 2, 16, batch_first=True)
    with pytest.raises(ValueError, match=r"\[TransformerEncoderLayer\] src \(2, 5, 7\)"):
        enc(np.zeros((2, 5, 7), np.float32))
    dec = qkv.TransformerDecoderLayer(8, 2, 16, batch_first=True)
    with pytest.raises(ValueError, match=r"\[TransformerDecoderLayer\]"):
        dec(np.zeros((2, 5, 8), np.float32), np.zeros((3, 5, 8), np.float32))


def test_encoder_decoder_stacks_and_transformer_match_torch():
    rng = np.random.default_rng(12)
    torch.manual_seed(5)
    E, H, F = 8, 2, 16
    t_layer = torch.nn.TransformerEncoderLayer(E, H, F)
    t_enc = torch.nn.TransformerEncoder(t_layer, 2, norm=torch.nn.LayerNorm(E), enable_nested_tensor=False).eval()
    t_dec = torch.nn.TransformerDecoder(torch.nn.TransformerDecoderLayer(E, H, F), 3).eval()
    t_tr = torch.nn.Transformer(E, H, 1, 2, F).eval()
    layer = qkv.TransformerEncoderLayer(E, H, F)
    layer.load_state_dict(t_layer.state_dict())
    enc = qkv.TransformerEncoder(layer, 2, norm=torch.nn.LayerNorm(E)).eval()
    assert list(enc.state_dict()) == list(t_enc.state_dict()) and enc.num_layers == 2
    # Each layer starts as a copy of the given one, as torch's deep copies.
    for name, t in t_enc.state_dict().items():
        np.testing.assert_array_equal(enc.state_dict()[name], t.numpy(), err_msg=name)
    dec = qkv.TransformerDecoder(qkv.TransformerDecoderLayer(E, H, F), 3).eval()
    assert dec.load_state_dict(t_dec.state_dict()) == ([], [])
    tr = qkv.Transformer(E, H, 1, 2, F).eval()
    assert list(tr.state_dict()) == list(t_tr.state_dict())
    assert tr.load_state_dict(t_tr.state_dict()) == ([], [])
    src, tgt = rand(rng, 6, 2, E), rand(rng, 4, 2, E)  # (T, B, E): torch's default layout
    mask = qkv.Transformer.generate_square_subsequent_mask(4)
    np.testing.assert_array_equal(mask, torch.nn.Transformer.generate_square_subsequent_mask(4).numpy())
    with torch.no_grad():
        s, t = torch.from_numpy(src), torch.from_numpy(tgt)
        ref_enc = t_enc(s).numpy()
        ref_dec = t_dec(t, s, tgt_mask=torch.from_numpy(mask)).numpy()
        ref_tr = t_tr(s, t, tgt_mask=torch.from_numpy(mask)).numpy()
    np.testing.assert_allclose(enc(src), ref_enc, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(dec(tgt, src, tgt_mask=mask), ref_dec, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(tr(src, tgt, tgt_mask=mask), ref_tr, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match=r"\[Transformer\] custom_encoder"):
        qkv.Transformer(E, H, custom_encoder=object())
