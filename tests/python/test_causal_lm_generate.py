"""qkv.CausalLM on real files: SmolLM2-135M-Instruct's GGUF (fp32) against transformers on the same model's HF folder
(config, greedy chat reply stopping at the model's end-of-generation ids), batches of prompts of different lengths
equal to each prompt alone, beam search against transformers' on a tiny random Llama folder, and one-line errors."""
import pathlib

import numpy as np
import pytest
import torch
import transformers as hf

import qkv
import smollm2

CHAT = [{"role": "user", "content": "What is the capital of France?"}]
NEW = 20


@pytest.fixture(scope="module")
def smol():
    torch.set_num_threads(2)
    folder = smollm2.hf_folder()
    ref = hf.AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    tok = qkv.Tokenizer.from_pretrained(folder)
    return ref, qkv.CausalLM.from_pretrained(smollm2.gguf_path(), precision="fp32"), tok, folder


def test_config_has_transformers_names_and_values(smol):
    ref, model, _, _ = smol
    c, want = model.config, ref.config
    for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "head_dim", "max_position_embeddings", "model_type", "tie_word_embeddings",
                "bos_token_id", "eos_token_id"):
        assert getattr(c, key) == getattr(want, key), key
    assert c.rope_theta == pytest.approx(want.rope_parameters["rope_theta"])
    assert ref.generation_config.eos_token_id in model.generation_config.eos_token_id
    assert model.generation_config.eos_token_id == sorted(model.generation_config.eos_token_id)


def test_greedy_chat_reply_matches_transformers(smol):
    ref, model, tok, _ = smol
    prompt = tok.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=True)
    with torch.inference_mode():
        out = ref.generate(torch.tensor([prompt]), max_new_tokens=NEW, do_sample=False)
    want = out[0, len(prompt):].tolist()
    got = model.generate(prompt, NEW).tolist()
    assert got == want
    if len(got) < NEW:  # it stopped: at an end-of-generation id, the reply's last id
        assert got[-1] in model.generation_config.eos_token_id
    assert "Paris" in tok.decode(got, skip_special_tokens=True)
    never = model.generate(prompt, len(got) + 3, eos_token_id=-1).tolist()
    assert len(never) == len(got) + 3 and never[:len(got)] == got
    assert model.generate(prompt, len(got) + 3, eos_token_id=[]).tolist() == never


def test_loads_from_pathlib_and_str_with_the_files_own_precision(smol):
    _, model, _, _ = smol
    ids = [1, 9690, 198, 504, 3458, 282, 4649, 314]
    fp32 = model.logits(ids)
    got = [qkv.CausalLM.from_pretrained(path).logits(ids)  # precision=None: the GGUF's Q4_1 / Q8_0 as stored
           for path in (smollm2.gguf_path(), str(smollm2.gguf_path()))]
    np.testing.assert_array_equal(got[0], got[1])
    # Stored weights are the file's, so only the activations' int8 rounding per 32 separates them from the
    # dequantized float32 run: the same next token at most positions, and logits far closer than to chance.
    assert (got[0].argmax(-1) == fp32.argmax(-1)).mean() >= 0.75
    assert np.abs(got[0] - fp32).mean() < 0.1 * np.abs(fp32 - fp32.mean()).mean()


def test_a_batch_equals_each_prompt_alone(smol):
    _, model, tok, _ = smol
    a = tok.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=True)
    b = tok.encode("The quick brown fox", add_special_tokens=False)
    alone = [model.generate(p, 8, eos_token_id=-1).tolist() for p in (a, b)]
    got = model.generate([a, b], 8, eos_token_id=-1)
    assert [g.tolist() for g in got] == alone
    # a left-padded (B, T) batch with its attention mask: the ids as given, then the new ids (transformers' layout)
    pad = 2
    T = max(len(a), len(b))
    ids = np.array([[pad] * (T - len(p)) + p for p in (a, b)])
    mask = np.array([[0] * (T - len(p)) + [1] * len(p) for p in (a, b)])
    out = model.generate(ids, 8, attention_mask=mask, eos_token_id=-1)
    assert out.shape == (2, T + 8)
    np.testing.assert_array_equal(out[:, :T], ids)
    assert [out[0, T:].tolist(), out[1, T:].tolist()] == alone
    # a row that stops early is padded with pad_token_id after its stop id
    stop = alone[1][3]
    out = model.generate(ids, 8, attention_mask=mask, eos_token_id=stop, pad_token_id=77)
    row = out[1, T:].tolist()
    assert row[:4] == alone[1][:4] and set(row[4:]) <= {77}


# A tiny random Llama saved as transformers does (config.json + generation_config.json, no tokenizer).
def tiny_llama(folder):
    torch.manual_seed(7)
    cfg = hf.LlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                         initializer_range=0.3, bos_token_id=1, eos_token_id=2)
    model = hf.LlamaForCausalLM(cfg).eval()
    model.save_pretrained(folder)
    return model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny-llama")
    return tiny_llama(folder), qkv.CausalLM.from_pretrained(folder)


def test_beam_search_matches_transformers(tiny):
    ref, model = tiny
    assert model.generation_config.eos_token_id == [2]
    cases = 0
    for prompt in ([5, 17, 42], [3], [60, 61, 62, 63, 64, 65, 66]):
        greedy = model.generate(prompt, 6, eos_token_id=-1).tolist()
        # the model's eos, then ids the search meets early, so that hypotheses finish on the way
        for eos in (2, greedy[1], greedy[3]):
            with torch.inference_mode():
                out = ref.generate(torch.tensor([prompt]), max_new_tokens=10, num_beams=2, do_sample=False,
                                   eos_token_id=eos, pad_token_id=eos)
            want = out[0, len(prompt):].tolist()
            while len(want) > 1 and want[-1] == eos and want[-2] == eos:  # transformers pads after the eos
                want.pop()
            got = model.generate(prompt, 10, num_beams=2, eos_token_id=eos).tolist()
            assert got == want, (prompt, eos)
            cases += 1
    assert cases == 9


def test_errors_are_one_line(smol, tiny, tmp_path):
    _, model, _, _ = smol
    _, small = tiny
    calls = [
        (lambda: small.generate([5, 17], 4, eos_token_id=97), ValueError, r"^\[CausalLM.generate\] eos_token_id 97"),
        (lambda: small.generate([5, 17], 4, eos_token_id="x"), TypeError, r"^\[CausalLM.generate\] eos_token_id must"),
        (lambda: small.generate([5, 17], 4, num_beams=0), ValueError, r"num_beams must be >= 1"),
        (lambda: small.generate([5, 17], -1), ValueError, r"max_new_tokens must be >= 0"),
        (lambda: small.generate([5, 17], 4, do_sample=True, temperature=0.0), ValueError, r"temperature > 0"),
        (lambda: small.generate([5, 17], 4, num_beams=2, do_sample=True), ValueError, r"does not sample"),
        (lambda: small.generate([[5, 17], []], 4), ValueError, r"prompt 1 is empty"),
        (lambda: small.generate([[5, 17], [3]], 4, attention_mask=[[1, 1], [0, 1]]), ValueError, r"attention_mask"),
        (lambda: small.generate(np.array([[5, 17]]), 4, attention_mask=np.array([[1, 1, 1]])), ValueError,
         r"attention_mask must have the shape"),
        (lambda: small.generate(np.array([[5, 17, 4]]), 4, attention_mask=np.array([[1, 0, 1]])), ValueError,
         r"has a hole"),
        (lambda: small.generate([5, 17], 4, eos_token_id=[2, 3], num_beams=2), ValueError,
         r"beam search ends hypotheses at one id; the stop ids are \[2, 3\]"),
        (lambda: small.generate([5, 200], 4), ValueError, r"^\[generate\] prompt id 200"),
        (lambda: qkv.CausalLM.from_pretrained(tmp_path / "absent.gguf"), ValueError, r"absent.gguf"),
        (lambda: qkv.CausalLM.from_pretrained(smollm2.gguf_path(), precision="int4"), ValueError, r"int4"),
    ]
    for call, error, message in calls:
        with pytest.raises(error, match=message) as e:
            call()
        assert "\n" not in str(e.value), message
    assert len(model.generate([1, 2, 3], 0)) == 0
