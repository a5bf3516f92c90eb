"""qkv.CausalLM(ids, output_attentions=True, output_hidden_states=True) against transformers' eager attention: every
layer's attention probabilities (B, H, T, T) and the L + 1 hidden states (the embeddings, each layer's output, the
last after the final norm) within 1e-4, on SmolLM2-135M-Instruct (the GGUF at fp32 and the HF folder) and on tiny
random Llama, Mistral (sliding window) and Gemma 2 (window on alternating layers, soft-caps, GQA) models; a left- or
right-padded batch with attention_mask at each row's tokens, a left-padded one with position_ids (transformers'
generate's prefill), a row of zeros (finite, probabilities 0)."""
import numpy as np
import pytest
import torch
import transformers as hf

import qkv
from smollm2 import gguf_path, hf_folder
from test_llama_parity import KINDS, build, relative_error

TOL = 1e-4


def reference(folder, ids):
    ref = hf.AutoModelForCausalLM.from_pretrained(str(folder), attn_implementation="eager",
                                                  torch_dtype=torch.float32).eval()
    with torch.no_grad():
        return ref(torch.tensor(ids), output_attentions=True, output_hidden_states=True)


def hidden_error(got, want):
    return float(np.max(np.abs(got - want)) / max(1.0, float(np.max(np.abs(want)))))


def compare(out, want, layers):
    assert len(out.attentions) == len(want.attentions) == layers
    assert len(out.hidden_states) == len(want.hidden_states) == layers + 1
    att = max(float(np.max(np.abs(a - w.numpy()))) for a, w in zip(out.attentions, want.attentions))
    hid = max(hidden_error(h, w.numpy()) for h, w in zip(out.hidden_states, want.hidden_states))
    assert att <= TOL and hid <= TOL, (att, hid)
    return att, hid


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_tiny_models_match_eager_transformers(kind, tmp_path):
    torch.set_num_threads(2)
    ref = build(kind, str(tmp_path))
    ref.set_attn_implementation("eager")  # the probabilities (sdpa returns none)
    ids = np.random.default_rng(1).integers(0, 97, size=(2, 19))  # longer than the windows (5 and 4)
    with torch.no_grad():
        want = ref(torch.tensor(ids), output_attentions=True, output_hidden_states=True)
    model = qkv.CausalLM.from_pretrained(tmp_path)
    out = model(ids, output_attentions=True, output_hidden_states=True)
    assert out.attentions[0].shape == (2, 4, 19, 19)
    assert out.hidden_states[0].shape == (2, 19, 32)
    compare(out, want, 2)
    np.testing.assert_array_equal(out.logits, model.logits(ids))  # the fused kernel still gives the output
    one = model.forward(ids[1], output_attentions=True)  # 1-D ids: no batch axis
    assert one.hidden_states is None and one.attentions[1].shape == (4, 19, 19)
    np.testing.assert_allclose(one.attentions[1], out.attentions[1][1], atol=1e-6)


def test_plain_call_and_asked_layers():
    model = qkv.CausalLM.from_pretrained(gguf_path())
    ids = [1, 2, 3, 4]
    out = model(ids)
    assert out.attentions is None and out.hidden_states is None and out.logits.shape == (4, 49152)
    some = model(ids, output_attentions=True, attention_layers=[0, 29])
    assert some.attentions[0].shape == (9, 4, 4) and some.attentions[1] is None and some.attentions[29] is not None
    np.testing.assert_allclose(some.attentions[29].sum(-1), 1.0, atol=1e-5)
    assert np.all(np.triu(some.attentions[0][0], 1) == 0)  # causal
    with pytest.raises(ValueError, match=r"\[llama\] attention layer 30 is outside \[0, 30\)"):
        model(ids, output_attentions=True, attention_layers=[30])
    with pytest.raises(ValueError, match="attention_layers goes with output_attentions"):
        model(ids, attention_layers=[0])


def test_smollm2_matches_eager_transformers():
    torch.set_num_threads(2)
    folder = hf_folder()
    tok = hf.AutoTokenizer.from_pretrained(str(folder))
    ids = np.array([tok.encode("The attention of a language model, layer by layer: what does it look at?")])
    want = reference(folder, ids)
    for path in (gguf_path(), folder):  # the GGUF dequantized to float32 and the folder hold the same weights
        out = qkv.CausalLM.from_pretrained(path, precision="fp32")(ids, True, True)
        assert out.attentions[0].shape == (1, 9, ids.shape[1], ids.shape[1])
        att, hid = compare(out, want, 30)
        print(f"{path.name}: attentions max |diff| {att:.2e}, hidden states {hid:.2e}")


def padded_batch(left, t=19, short=12):
    """Two prompts of lengths t and `short` in one (2, t) batch, the short one padded on the left or the right."""
    rng = np.random.default_rng(4)
    ids = rng.integers(0, 97, size=(2, t))
    mask = np.ones((2, t), np.int64)
    first = t - short if left else 0
    mask[1] = 0
    mask[1, first:first + short] = 1
    ids[1, mask[1] == 0] = 0  # the pad id
    return ids, mask, first, short


@pytest.mark.parametrize("left", [True, False], ids=["left_padded", "right_padded"])
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_padded_batch_with_attention_mask_matches_eager_transformers(kind, left, tmp_path):
    """transformers' forward with attention_mask (positions 0 .. T-1, as its forward takes them): logits, every
    layer's probabilities and the hidden states at each row's tokens; the padded keys get 0 in both."""
    torch.set_num_threads(2)
    ref = build(kind, str(tmp_path))
    ref.set_attn_implementation("eager")
    ids, mask, first, n = padded_batch(left)
    with torch.no_grad():
        want = ref(torch.tensor(ids), attention_mask=torch.tensor(mask), output_attentions=True,
                   output_hidden_states=True)
    model = qkv.CausalLM.from_pretrained(tmp_path)
    out = model(ids, True, True, attention_mask=mask)
    tokens = slice(first, first + n)
    for b, at in ((0, slice(None)), (1, tokens)):  # row 0 has no padding
        got_logits, want_logits = out.logits[b, at], want.logits[b, at].numpy()
        assert relative_error(got_logits, want_logits) <= TOL, (kind, b)
        att = max(float(np.max(np.abs(a[b, :, at] - w[b, :, at].numpy())))
                  for a, w in zip(out.attentions, want.attentions))
        hid = max(hidden_error(h[b, at], w[b, at].numpy()) for h, w in zip(out.hidden_states, want.hidden_states))
        assert att <= TOL and hid <= TOL, (kind, b, att, hid)
    assert np.all(out.attentions[0][1][:, tokens][..., mask[1] == 0] == 0)  # the padded keys
    assert np.all(np.isfinite(out.logits))  # the padded queries too (attention output 0 there)
    alone = model(ids[1, tokens], True, True)  # the short row alone, 1-D
    np.testing.assert_allclose(out.logits[1, tokens], alone.logits, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out.attentions[1][1][:, tokens, tokens], alone.attentions[1], atol=1e-6)


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_left_padded_batch_with_position_ids_matches_eager_transformers(kind, tmp_path):
    """transformers' generate's prefill: attention_mask and position_ids = cumsum(mask) - 1 (the padding at 1), so
    each row's tokens sit at the positions they have alone: logits, probabilities and hidden states at each row's
    tokens as transformers', and the short row's logits as the row alone."""
    torch.set_num_threads(2)
    ref = build(kind, str(tmp_path))
    ref.set_attn_implementation("eager")
    ids, mask, first, n = padded_batch(True)
    positions = np.cumsum(mask, axis=1) - 1
    positions[mask == 0] = 1
    with torch.no_grad():
        want = ref(torch.tensor(ids), attention_mask=torch.tensor(mask), position_ids=torch.tensor(positions),
                   output_attentions=True, output_hidden_states=True)
    model = qkv.CausalLM.from_pretrained(tmp_path)
    out = model(ids, True, True, attention_mask=mask, position_ids=positions)
    tokens = slice(first, first + n)
    for b, at in ((0, slice(None)), (1, tokens)):
        assert relative_error(out.logits[b, at], want.logits[b, at].numpy()) <= TOL, (kind, b)
        att = max(float(np.max(np.abs(a[b, :, at] - w[b, :, at].numpy())))
                  for a, w in zip(out.attentions, want.attentions))
        hid = max(hidden_error(h[b, at], w[b, at].numpy()) for h, w in zip(out.hidden_states, want.hidden_states))
        assert att <= TOL and hid <= TOL, (kind, b, att, hid)
    alone = model(ids[1, tokens], True, True)
    np.testing.assert_allclose(out.logits[1, tokens], alone.logits, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out.attentions[1][1][:, tokens, tokens], alone.attentions[1], atol=1e-6)
    # positions shared by the rows: (T) or (1, T), as transformers broadcasts them; 0 .. T-1 is the default
    arange = np.arange(ids.shape[1])
    np.testing.assert_array_equal(model(ids, position_ids=arange).logits, model(ids).logits)
    np.testing.assert_array_equal(model(ids, position_ids=arange[None]).logits, model(ids).logits)
    with pytest.raises(ValueError, match=r"\[CausalLM.forward\] position_ids must have the shape of ids") as e:
        model(ids, position_ids=positions[:, 1:])
    assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match="position_ids holds -2 < 0"):
        model(ids, position_ids=positions - 2)
    with pytest.raises(TypeError, match="position_ids must hold integers"):
        model(ids, position_ids=positions.astype(np.float32))


def test_attention_mask_row_of_zeros_and_errors():
    model = qkv.CausalLM.from_pretrained(gguf_path())
    ids = np.array([[1, 2, 3, 4], [5, 6, 7, 8]])
    mask = np.array([[1, 1, 1, 1], [0, 0, 0, 0]])
    out = model(ids, output_attentions=True, attention_mask=mask)
    assert np.all(np.isfinite(out.logits))
    assert all(np.all(a[1] == 0) for a in out.attentions)  # every key masked: probabilities 0, not NaN
    np.testing.assert_allclose(out.logits[0], model.logits(ids[0]), rtol=1e-5, atol=1e-4)
    np.testing.assert_array_equal(model(ids, attention_mask=np.ones_like(ids)).logits, model.logits(ids))
    with pytest.raises(ValueError, match=r"\[CausalLM.forward\] attention_mask must have the shape of ids") as e:
        model(ids, attention_mask=mask[:, 1:])
    assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match="attention_mask must have the shape of ids"):
        model(ids[0], attention_mask=mask[:1])  # 1-D ids take a 1-D mask
    with pytest.raises(TypeError, match="attention_mask must hold integers"):
        model(ids, attention_mask=mask.astype(np.float32))
