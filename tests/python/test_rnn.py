"""qkv.GRU / qkv.LSTM against torch.nn.GRU / torch.nn.LSTM (batch_first=True) with copied weights.

num_layers 1-2, bias on/off, zero or given initial states, batched and unbatched input: output and final states
must meet torch_parity.assert_parity.
"""
import itertools

import numpy as np
import pytest
import torch

import qkv
from torch_parity import assert_parity, double_copy, rand, state_dict_numpy, t64

RNN_OPTIONS = list(itertools.product(["GRU", "LSTM"], [1, 2], [True, False], [False, True]))


def run_torch(mod, kind, x, h0, c0, dtype):
    conv = (lambda a: None if a is None else torch.from_numpy(a.astype(np.float64)).to(dtype))
    if kind == "GRU":
        out, h = mod(conv(x), conv(h0))
        return [out.detach().numpy(), h.detach().numpy()]
    out, (h, c) = mod(conv(x), None if h0 is None else (conv(h0), conv(c0)))
    return [out.detach().numpy(), h.detach().numpy(), c.detach().numpy()]


@pytest.mark.parametrize("kind,num_layers,bias,with_state", RNN_OPTIONS)
def test_matches_torch(kind, num_layers, bias, with_state):
    seed = RNN_OPTIONS.index((kind, num_layers, bias, with_state))
    rng = np.random.default_rng(5000 + seed)
    torch.manual_seed(seed)
    E, H, B, T = 5, 7, 3, 9
    ref = getattr(torch.nn, kind)(E, H, num_layers=num_layers, bias=bias, batch_first=True)
    mine = getattr(qkv, kind)(E, H, num_layers=num_layers, bias=bias, batch_first=True)
    mine.load_state_dict(state_dict_numpy(ref))
    x = rand(rng, B, T, E)
    h0 = rand(rng, num_layers, B, H) if with_state else None
    c0 = rand(rng, num_layers, B, H) if with_state and kind == "LSTM" else None
    ref64 = run_torch(double_copy(ref), kind, x, h0, c0, torch.float64)
    ref32 = run_torch(ref, kind, x, h0, c0, torch.float32)
    if kind == "GRU":
        got = list(mine(x, h0))
    else:
        out, (h, c) = mine(x, None if h0 is None else (h0, c0))
        got = [out, h, c]
    for name, g, r64, r32 in zip(("output", "h_n", "c_n"), got, ref64, ref32):
        assert_parity(f"{kind}[L{num_layers},bias={bias},state={with_state}].{name}", g, r64, r32)


def test_unbatched_input_matches_torch():
    rng = np.random.default_rng(6)
    ref = torch.nn.LSTM(4, 6, num_layers=2, batch_first=True)
    mine = qkv.LSTM(4, 6, num_layers=2, batch_first=True)
    mine.load_state_dict(state_dict_numpy(ref))
    x, h0, c0 = rand(rng, 5, 4), rand(rng, 2, 6), rand(rng, 2, 6)
    out, (h, c) = mine(x, (h0, c0))
    t_out, (t_h, t_c) = ref(t64(x).float(), (t64(h0).float(), t64(c0).float()))
    assert out.shape == (5, 6) and h.shape == (2, 6) and c.shape == (2, 6)
    np.testing.assert_allclose(out, t_out.detach().numpy(), atol=1e-5)
    np.testing.assert_allclose(c, t_c.detach().numpy(), atol=1e-5)
    gru = qkv.GRU(4, 6)
    o, hn = gru(x)
    assert o.shape == (5, 6) and hn.shape == (1, 6)


def test_parameter_names_and_gate_packing_are_pytorch_s():
    for kind, gates in (("GRU", 3), ("LSTM", 4)):
        mine = getattr(qkv, kind)(4, 6, num_layers=2, seed=0)
        ref = getattr(torch.nn, kind)(4, 6, num_layers=2, batch_first=True)
        assert list(mine.state_dict()) == list(ref.state_dict())
        assert mine.state_dict()["weight_ih_l1"].shape == (gates * 6, 6)
        no_bias = getattr(qkv, kind)(4, 6, bias=False)
        assert list(no_bias.state_dict()) == ["weight_ih_l0", "weight_hh_l0"]


@pytest.mark.parametrize("kind", ["GRU", "LSTM"])
def test_batch_first_defaults_to_false_as_torch_and_both_layouts_agree(kind):
    rng = np.random.default_rng(8)
    ref = getattr(torch.nn, kind)(4, 6, num_layers=2)  # torch's default layout: (T, B, E)
    seq_first = getattr(qkv, kind)(4, 6, num_layers=2)
    batch_first = getattr(qkv, kind)(4, 6, num_layers=2, batch_first=True)
    assert seq_first.batch_first is False and batch_first.batch_first is True
    seq_first.load_state_dict(ref.state_dict())
    batch_first.load_state_dict(ref.state_dict())
    x = rand(rng, 5, 3, 4)  # (T, B, E)
    with torch.no_grad():
        t_out = ref(torch.from_numpy(x))[0].numpy()
    out = seq_first(x)[0]
    assert out.shape == (5, 3, 6)
    np.testing.assert_allclose(out, t_out, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(batch_first(x.transpose(1, 0, 2))[0].transpose(1, 0, 2), out, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(seq_first(x[:, 0])[0], out[:, 0], rtol=1e-5, atol=1e-6)  # unbatched (T, E)


def test_unsupported_options_and_bad_states_raise():
    with pytest.raises(ValueError, match="bidirectional"):
        qkv.LSTM(4, 6, bidirectional=True)
    with pytest.raises(ValueError, match="dropout"):
        qkv.GRU(4, 6, num_layers=2, dropout=0.2)
    with pytest.raises(ValueError, match="proj_size"):
        qkv.LSTM(4, 6, proj_size=2)
    gru = qkv.GRU(4, 6, batch_first=True)
    with pytest.raises(ValueError, match=r"\[GRU\]"):
        gru(np.zeros((2, 3, 5), np.float32))
    with pytest.raises(ValueError, match=r"\[GRU\]"):
        gru(np.zeros((2, 3, 4), np.float32), np.zeros((1, 3, 6), np.float32))
    lstm = qkv.LSTM(4, 6, batch_first=True)
    with pytest.raises(TypeError, match=r"LSTM: hx must be"):
        lstm(np.zeros((2, 3, 4), np.float32), np.zeros((1, 2, 6), np.float32))
