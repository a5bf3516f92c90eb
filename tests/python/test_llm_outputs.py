"""qkv.CausalLM(ids, output_attentions=True, output_hidden_states=True) against transformers' eager attention: every
layer's attention probabilities (B, H, T, T) and the L + 1 hidden states (the embeddings, each layer's output, the
last after the final norm) within 1e-4, on SmolLM2-135M-Instruct (the GGUF at fp32 and the HF folder) and on tiny
random Llama, Mistral (sliding window) and Gemma 2 (window on alternating layers, soft-caps, GQA) models."""
import numpy as np
import pytest
import torch
import transformers as hf

import qkv
from smollm2 import gguf_path, hf_folder
from test_llama_parity import KINDS, build

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
