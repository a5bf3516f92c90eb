"""qkv.SentenceEncoder(ids, attention_mask, output_attentions=True, output_hidden_states=True) against transformers'
BertModel (eager attention, the same call) on the real all-MiniLM-L6-v2: a right-padded batch of sentences and a
sentence pair with token types. Every layer's attention probabilities within 2e-5 (test_viz.py's tolerance), the
L + 1 hidden states within 1e-4 of the largest value (test_llm_outputs.py's), the last one the model's output;
0 at padded keys; the argument errors in one line."""
import numpy as np
import pytest

import minilm_corpus as corpus
from test_viz import enc, hf  # noqa: F401 (the shared fixtures: qkv's model and transformers' eager one)

ATT_ATOL = 2e-5
HIDDEN_TOL = 1e-4


def reference(hf, ids, mask, types):
    import torch

    _, model = hf  # (tokenizer, BertModel)
    with torch.no_grad():
        return model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask),
                     token_type_ids=torch.tensor(types), output_attentions=True, output_hidden_states=True)


def hidden_error(got, want):
    return float(np.max(np.abs(got - want)) / max(1.0, float(np.max(np.abs(want)))))


def compare(out, want, mask):
    assert len(out.attentions) == len(want.attentions) == 6
    assert len(out.hidden_states) == len(want.hidden_states) == 7
    b, t = mask.shape
    for a, w in zip(out.attentions, want.attentions):
        assert a.shape == (b, 12, t, t) and a.dtype == np.float32
        np.testing.assert_allclose(a, w.numpy(), rtol=0, atol=ATT_ATOL)
        np.testing.assert_allclose(a.sum(-1), 1.0, rtol=0, atol=1e-5)
        assert np.all(a[mask[:, None, None, :].repeat(12, 1).repeat(t, 2) == 0] == 0)  # padded keys: exactly 0
    real = mask.astype(bool)  # transformers' padded rows are its own; compare the tokens'
    for h, w in zip(out.hidden_states, want.hidden_states):
        assert h.shape == (b, t, 384)
        assert hidden_error(h[real], w.numpy()[real]) <= HIDDEN_TOL
    np.testing.assert_array_equal(out.hidden_states[-1], out.last_hidden_state)
    assert hidden_error(out.last_hidden_state[real], want.last_hidden_state.numpy()[real]) <= HIDDEN_TOL
    return (max(float(np.max(np.abs(a - w.numpy()))) for a, w in zip(out.attentions, want.attentions)),
            max(hidden_error(h[real], w.numpy()[real]) for h, w in zip(out.hidden_states, want.hidden_states)))


def test_padded_batch_matches_transformers(enc, hf):
    texts = ["The cat sat on the mat.", corpus.HANDWRITTEN[30], "Attention is all you need.",
             corpus.HANDWRITTEN[50]]
    ids, mask = enc.tokenize(texts)
    assert (mask == 0).any()  # the batch is padded
    out = enc(ids, attention_mask=mask, output_attentions=True, output_hidden_states=True)
    att, hid = compare(out, reference(hf, ids, mask, np.zeros_like(ids)), mask)
    print(f"\nall-MiniLM-L6-v2, padded batch: attentions max |diff| {att:.2e}, hidden states {hid:.2e}")


def test_sentence_pair_with_token_types_matches_transformers(enc, hf):
    b = hf[0]("Where is Paris?", "Paris is in France.", return_tensors="np")
    ids, mask, types = b["input_ids"], b["attention_mask"], b["token_type_ids"]
    assert types.any()
    out = enc.forward(ids, mask, types, output_attentions=True, output_hidden_states=True)
    compare(out, reference(hf, ids, mask, types), mask)
    one = enc(ids[0], token_type_ids=types[0], output_attentions=True)  # 1-D ids: no batch axis
    assert one.hidden_states is None and one.attentions[2].shape == (12, ids.shape[1], ids.shape[1])
    np.testing.assert_allclose(one.attentions[2], out.attentions[2][0], rtol=0, atol=1e-6)


def test_viewer_attentions_are_the_forward_ones(enc):
    text = "The capital of France is Paris."
    tokens, att = enc.attentions(text)
    ids, _ = enc.tokenize([text])
    out = enc(ids, output_attentions=True)
    assert len(tokens) == ids.shape[1]
    for a, b in zip(att, out.attentions):
        np.testing.assert_array_equal(a, b)


def test_nothing_asked_gives_none_and_layers_can_be_picked(enc):
    ids, mask = enc.tokenize(["A man is eating food.", "Hi"])
    plain = enc(ids, mask)
    assert plain.attentions is None and plain.hidden_states is None
    assert plain.last_hidden_state.shape == (2, ids.shape[1], 384)
    some = enc(ids, mask, output_attentions=True, attention_layers=[0, 5])
    assert some.attentions[1] is None and some.attentions[5].shape == (2, 12, ids.shape[1], ids.shape[1])
    with pytest.raises(ValueError, match=r"^\[bert\] attention layer 6 is outside \[0, 6\)$"):
        enc(ids, mask, output_attentions=True, attention_layers=[6])
    with pytest.raises(ValueError, match="attention_layers goes with output_attentions"):
        enc(ids, mask, attention_layers=[0])


def test_bad_arguments_are_refused_in_one_line(enc):
    ids, mask = enc.tokenize(["A man is eating food."])
    with pytest.raises(ValueError, match=r"^\[SentenceEncoder.forward\] attention_mask must have the shape of ids$"):
        enc(ids, mask[:, 1:])
    with pytest.raises(ValueError, match=r"token_type_ids must have the shape of ids"):
        enc(ids, token_type_ids=mask[0])
    with pytest.raises(TypeError, match="ids must hold integers"):
        enc(ids.astype(np.float32))
    with pytest.raises(ValueError, match=r"ids must be \(T\) or \(B, T\), got 3 dimensions"):
        enc(ids[None])
    with pytest.raises(ValueError, match=r"\[bert\] token id 30522 at 0 is outside \[0, 30522\)"):
        enc(np.array([30522, 1]))
    with pytest.raises(ValueError, match=r"\[bert\] sequence length 513 must be in \[1, max_position_embeddings"):
        enc(np.ones(513, dtype=np.int64))
