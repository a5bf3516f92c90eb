"""Options that must not be accepted silently and errors that must say what is wrong: `qkv generate`'s beam, sampling,
eos and seed options, `qkv train`'s threads, seed and resume rules, `qkv translate`'s characters outside the
vocabulary, CLI11's own messages in qkv's one-line style, sharded and oversized Hugging Face folders, and the
one-line errors of qkv.CausalLM and qkv.SentenceEncoder. Each test is named after the defect it guards against.

The command is the one built next to the module (<build>/qkv)."""
import json
import os
import pathlib
import shutil
import subprocess

import numpy as np
import pytest
import torch
import transformers as hf

import qkv

BUILD = pathlib.Path(qkv.__file__).resolve().parents[2]
QKV = str(BUILD / "qkv")
VOCAB = 97
CONFIG = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=128, initializer_range=0.1, bos_token_id=1,
              eos_token_id=2)
TASK = ["--model", "transformer", "--task", "copy", "--min-len", "2", "--max-len", "4", "--train-size", "200",
        "--test-size", "10", "--d-model", "16", "--heads", "2", "--layers", "1", "--batch-size", "8", "--seed", "5",
        "--threads", "1", "--eval-every", "100"]


def run(*args, stdin=None):
    assert os.access(QKV, os.X_OK), f"the qkv command was not built next to the module: {QKV}"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.run([QKV, *args], input=stdin, capture_output=True, text=True, env=env, timeout=120)


def ok(r):
    assert r.returncode == 0, f"exit {r.returncode}\nstderr:\n{r.stderr}"
    return r


def one_line_error(r, *needles):
    assert r.returncode > 0 and r.stdout == "", f"exit {r.returncode}\nstdout:\n{r.stdout}\nstderr:\n{r.stderr}"
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("qkv: error: "), r.stderr
    for n in needles:
        assert n in lines[0], f"'{n}' not in: {lines[0]}"
    return lines[0]


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """A tiny random Llama saved whole and sharded (max_shard_size 20KB: several shards) by transformers."""
    root = tmp_path_factory.mktemp("llama")
    torch.manual_seed(1234)
    model = hf.LlamaForCausalLM(hf.LlamaConfig(**CONFIG)).eval()
    model.save_pretrained(root / "whole")
    model.save_pretrained(root / "sharded", max_shard_size="20KB")
    assert len(list((root / "sharded").glob("model-*.safetensors"))) > 1
    return root


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    out = tmp_path_factory.mktemp("run") / "run"
    ok(run("train", *TASK, "--dropout", "0.1", "--steps", "4", "--out", str(out)))
    return out


def gen(llama, *args):
    return run("generate", "--model", str(llama / "whole"), "--prompt-ids", "5,17", *args)


# --- generate ------------------------------------------------------------------------------------------------

def test_generate_beam_wider_than_the_vocabulary_is_refused(llama):
    one_line_error(gen(llama, "--beam", str(VOCAB + 1)), "--beam 98", "wider than the vocabulary (97 tokens)")
    ok(gen(llama, "--beam", str(VOCAB), "--max-new-tokens", "2"))


def test_generate_beam_memory_estimate_over_the_limit_is_refused_naming_both(llama):
    # 4 rows of KV cache for 10^9 positions: hundreds of GiB, refused before anything is allocated.
    line = one_line_error(gen(llama, "--beam", "4", "--max-new-tokens", "1000000000"), "[beam_search] 4 beams")
    assert "GiB (KV caches" in line and "more than the limit of" in line


@pytest.mark.parametrize("flag,value", [("--top-k", "5"), ("--top-p", "0.5")])
def test_generate_top_k_or_top_p_without_temperature_is_refused(llama, flag, value):
    one_line_error(gen(llama, flag, value), flag.split("-")[-1], "--temperature > 0")
    ok(gen(llama, flag, value, "--temperature", "0.8", "--max-new-tokens", "3"))


@pytest.mark.parametrize("eos", ["97", "100000"])
def test_generate_out_of_range_eos_is_refused_for_greedy(llama, eos):
    one_line_error(gen(llama, "--eos", eos), f"--eos {eos} is not a token id", "[0, 97)")
    one_line_error(gen(llama, "--eos", "-2"), "--eos", ">= -1")


def test_generate_beam_with_eos_minus_one_never_stops_early(llama):
    # The config's EOS is 2: a beam that may stop there still runs to the length when --eos -1 says never.
    tokens = ok(gen(llama, "--beam", "2", "--eos", "-1", "--max-new-tokens", "24")).stdout.strip().split(",")
    assert len(tokens) == 24
    stop = ok(gen(llama, "--max-new-tokens", "1")).stdout.strip()  # the greedy first token, as an end token
    assert ok(gen(llama, "--beam", "1", "--eos", stop, "--max-new-tokens", "24")).stdout.strip() == stop


@pytest.mark.parametrize("cmd", [["generate", "--model", "unused", "--prompt-ids", "5", "--temperature", "1"],
                                 ["train", *TASK, "--steps", "1", "--out", "unused"], ["demo", "--out", "unused"]])
def test_negative_seed_is_refused_not_wrapped(cmd):
    one_line_error(run(*cmd, "--seed", "-1"), "--seed", "[0, 2^64)", "'-1'")


@pytest.mark.parametrize("threads", ["0", "-1"])
def test_train_threads_zero_or_negative_is_refused(tmp_path, threads):
    one_line_error(run("train", *TASK, "--steps", "1", "--out", str(tmp_path / "r"), "--threads", threads),
                   "--threads", ">= 1")
    assert not (tmp_path / "r").exists()


# --- translate -------------------------------------------------------------------------------------------------

def test_translate_names_characters_outside_the_vocabulary_and_strict_refuses_them(trained):
    r = ok(run("translate", str(trained), stdin="0123abc\n"))
    assert len(r.stdout.strip().splitlines()) == 1
    warning = r.stderr.strip().splitlines()
    assert len(warning) == 1 and warning[0].startswith("qkv: warning: [translate] 3 tokens"), r.stderr
    assert "'a', 'b', 'c'" in warning[0] and "<unk>" in warning[0]
    one_line_error(run("translate", str(trained), "--strict", stdin="0123abc\n"), "--strict", "'a', 'b', 'c'")
    r = ok(run("translate", str(trained), "--strict", stdin="0123\n"))
    assert r.stderr == ""


# --- train: resume and mpirun messages -------------------------------------------------------------------------

def test_resume_with_train_size_says_the_vocabulary_changes_not_task_or_data(trained, tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(trained, run_dir)
    line = one_line_error(run("train", "--resume", str(run_dir), "--train-size", "300", "--steps", "6"),
                          "--train-size 300", "vocabulary")
    assert "exactly one of --task" not in line
    # A data option that keeps the vocabulary is applied alone (the saved task stays).
    ok(run("train", "--resume", str(run_dir), "--test-size", "12", "--steps", "6", "--threads", "1"))
    assert json.loads((run_dir / "config.json").read_text())["test_size"] == 12


def test_resume_compares_dropout_by_value_and_prints_the_shortest_form(trained, tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(trained, run_dir)
    assert '"dropout": 0.1,' in (run_dir / "config.json").read_text()
    ok(run("train", "--resume", str(run_dir), "--dropout", "0.10000000000000001", "--steps", "5", "--threads", "1"))
    line = one_line_error(run("train", "--resume", str(run_dir), "--dropout", "0.2", "--steps", "6"))
    assert "--dropout 0.2 differs from the run's 0.1 in" in line


# --- CLI11's messages --------------------------------------------------------------------------------------------

def test_option_given_twice_is_one_qkv_line_naming_the_flag():
    one_line_error(run("train", *TASK, "--lr", "1e-3", "--lr", "2e-3", "--out", "unused"),
                   "--lr was given 2 values; it takes one")


@pytest.mark.parametrize("flag,value,want", [("--lr", "abc", "is not a number"),
                                              ("--steps", "1.5", "is not an integer")])
def test_value_of_the_wrong_type_is_one_qkv_line_naming_the_flag(flag, value, want):
    line = one_line_error(run("train", *TASK, flag, value, "--out", "unused"), f"{flag}: '{value}' {want}")
    assert "Could not convert" not in line


# --- Hugging Face folders ------------------------------------------------------------------------------------------

def test_sharded_folder_loads_through_its_index_with_the_same_logits(llama):
    ids = np.random.default_rng(0).integers(0, VOCAB, size=(2, 11))
    whole = qkv.CausalLM.from_pretrained(str(llama / "whole")).logits(ids)
    sharded = qkv.CausalLM.from_pretrained(llama / "sharded").logits(ids)  # a pathlib.Path, too
    np.testing.assert_array_equal(sharded, whole)
    assert ok(gen(llama, "--max-new-tokens", "6")).stdout == ok(
        run("generate", "--model", str(llama / "sharded"), "--prompt-ids", "5,17", "--max-new-tokens", "6")).stdout


def _sharded_copy(llama, dst, edit):
    shutil.copytree(llama / "sharded", dst)
    index = json.loads((dst / "model.safetensors.index.json").read_text())
    edit(dst, index)
    (dst / "model.safetensors.index.json").write_text(json.dumps(index))
    return dst


def test_sharded_folder_with_a_missing_shard_or_a_tensor_in_two_shards_is_one_line(llama, tmp_path):
    def drop_shard(dst, index):
        (dst / index["weight_map"]["model.norm.weight"]).unlink()

    def move_tensor(dst, index):  # the map sends a tensor to another shard than the one holding it
        wm = index["weight_map"]
        files = sorted(set(wm.values()))
        name = next(k for k, v in wm.items() if v == files[0])
        wm[name] = files[1]

    def unlisted(dst, index):
        del index["weight_map"]["model.norm.weight"]

    for i, (edit, needle) in enumerate([(drop_shard, "which is not in"), (move_tensor, "maps to"),
                                        (unlisted, "does not list")]):
        dst = _sharded_copy(llama, tmp_path / str(i), edit)
        with pytest.raises(ValueError, match=needle) as e:
            qkv.CausalLM.from_pretrained(dst)
        assert "\n" not in str(e.value)
    dup = tmp_path / "dup"
    shutil.copytree(llama / "sharded", dup)
    text = (dup / "model.safetensors.index.json").read_text()
    first = json.loads(text)["weight_map"]
    key = next(iter(first))
    text = text.replace('"weight_map": {', f'"weight_map": {{"{key}": "{first[key]}", ', 1)
    (dup / "model.safetensors.index.json").write_text(text)
    with pytest.raises(ValueError, match="twice|duplicate") as e:
        qkv.CausalLM.from_pretrained(dup)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("key", ["num_hidden_layers", "vocab_size", "hidden_size", "intermediate_size"])
def test_config_with_a_billion_of_a_size_names_the_key_not_bad_alloc(llama, tmp_path, key):
    dst = tmp_path / "big"
    shutil.copytree(llama / "whole", dst)
    cfg = json.loads((dst / "config.json").read_text())
    cfg[key] = 1_000_000_000
    (dst / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=f'"{key}" is 1000000000, more than') as e:
        qkv.CausalLM.from_pretrained(dst)
    assert "\n" not in str(e.value)
    one_line_error(run("generate", "--model", str(dst), "--prompt-ids", "5"), key)


# --- Python: CausalLM and SentenceEncoder ----------------------------------------------------------------------------

def test_causal_lm_and_sentence_encoder_mismatched_arguments_are_one_line(llama):
    model = qkv.CausalLM.from_pretrained(str(llama / "whole"))
    ids = np.arange(300)
    for call, name in [(lambda: model.generate(ids, "x"), "CausalLM.generate"),
                       (lambda: model.logits(ids, 5), "CausalLM.logits"),
                       (lambda: qkv.CausalLM.from_pretrained(str(llama / "whole"), precison="bf16"),
                        "CausalLM.from_pretrained"),
                       (lambda: qkv.SentenceEncoder(str(llama), batch=2), "SentenceEncoder")]:
        with pytest.raises(TypeError, match=rf"^{name}: arguments .* match no signature") as e:
            call()
        assert "\n" not in str(e.value) and "299" not in str(e.value)  # no array contents


def test_missing_folder_is_value_error_for_both_and_pathlib_paths_are_taken(tmp_path, llama):
    for cls in (qkv.CausalLM.from_pretrained, qkv.SentenceEncoder):
        for path in (str(tmp_path / "nope"), tmp_path / "nope"):
            with pytest.raises(ValueError, match="does not exist") as e:
                cls(path)
            assert "\n" not in str(e.value)
    assert qkv.CausalLM.from_pretrained(llama / "whole").vocab_size == VOCAB


def test_generate_on_a_uint64_id_reports_its_value_not_a_wrapped_negative(llama):
    model = qkv.CausalLM.from_pretrained(llama / "whole")
    with pytest.raises(ValueError, match=r"^\[CausalLM.generate\] id 18446744073709551615 at 1 is outside") as e:
        model.generate(np.array([5, 2**64 - 1], dtype=np.uint64), 3)
    assert "-1" not in str(e.value)
    with pytest.raises(ValueError, match=r"\[generate\] prompt id 200 at 1 is outside \[0, vocab_size = 97\)"):
        model.generate(np.array([5, 200], dtype=np.uint64), 3)
    assert model.generate(np.array([5, 17], dtype=np.uint64), 3).tolist() == model.generate([5, 17], 3).tolist()
