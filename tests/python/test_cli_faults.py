"""The `qkv` command under faults: missing, empty, directory, unreadable and truncated files for every subcommand,
corrupted checkpoints, a full device on stdout, signals at random moments of training, readers racing the pruning
of checkpoints, and the defects of "no silent wrong answer, no lost work" (each test named after its defect).
Every failure must be one line on stderr starting with "qkv: error: " and a positive exit status (never a crash),
and after each fault the run directory must still resume.

The command is taken from $QKV_BIN, else <repo>/build/qkv."""
import json
import os
import pathlib
import random
import shutil
import signal
import subprocess
import time

import numpy as np
import pytest
import torch
from safetensors.numpy import load_file, save_file

import qkv as qkv_module
import torch_parity  # noqa: F401  (puts scripts/ on sys.path, for export_torch)

REPO = pathlib.Path(__file__).resolve().parents[2]
QKV = os.environ.get("QKV_BIN", str(REPO / "build" / "qkv"))

SMALL = ["--model", "transformer", "--task", "copy", "--min-len", "2", "--max-len", "4", "--train-size", "200",
         "--test-size", "10", "--d-model", "16", "--heads", "2", "--layers", "1", "--batch-size", "8", "--seed", "5",
         "--threads", "1"]


def small(**changes):
    """SMALL with some values changed: small(test_size="400") -> ... "--test-size", "400" ..."""
    out = list(SMALL)
    for key, value in changes.items():
        flag = "--" + key.replace("_", "-")
        if flag in out:
            out[out.index(flag) + 1] = value
        else:
            out += [flag, value]
    return out


def run(*args, stdin=None, timeout=120, stdout=None):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    if stdout is None:
        return subprocess.run([QKV, *args], input=stdin, capture_output=True, text=True, env=env, timeout=timeout)
    return subprocess.run([QKV, *args], input=stdin, stdout=stdout, stderr=subprocess.PIPE, text=True, env=env,
                          timeout=timeout)


def ok(r):
    assert r.returncode == 0, f"exit {r.returncode}\nstdout:\n{r.stdout}\nstderr:\n{r.stderr}"
    return r


def one_line_error(r, *needles):
    """A clean failure: positive exit status (not killed by a signal), exactly one line on stderr, naming needles."""
    assert r.returncode > 0, f"exit {r.returncode}\nstderr:\n{r.stderr}"
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got:\n{r.stderr}"
    assert lines[0].startswith("qkv: error: "), lines[0]
    for n in needles:
        assert n in lines[0], f"'{n}' not in: {lines[0]}"
    return lines[0]


@pytest.fixture(scope="module", autouse=True)
def binary_exists():
    if not os.access(QKV, os.X_OK):
        pytest.fail(f"qkv command not built at {QKV} (set QKV_BIN)")


@pytest.fixture(scope="module")
def base_run(tmp_path_factory):
    """A finished tiny run with two checkpoints (steps 4 and 6); tests copy it before damaging anything."""
    out = tmp_path_factory.mktemp("base") / "run"
    ok(run("train", *SMALL, "--steps", "6", "--checkpoint-every", "4", "--eval-every", "100", "--out", str(out)))
    return out


def copy_run(base_run, tmp_path):
    dst = tmp_path / "run"
    shutil.copytree(base_run, dst)
    return dst


def latest(run_dir):
    steps = sorted(p for p in (run_dir / "checkpoints").iterdir() if p.name.startswith("step-"))
    return steps[-1]


def assert_resumes(run_dir, steps):
    r = ok(run("train", "--resume", str(run_dir), "--steps", str(steps), "--checkpoint-every", "1000"))
    ev = json.loads(ok(run("eval", str(run_dir), "--json", "--limit", "3")).stdout)
    assert ev["step"] == steps, (ev, r.stdout)


def unreadable(path):
    """A path that cannot be opened for reading, also as root (for whom chmod 000 changes nothing)."""
    if os.geteuid() != 0:
        path.write_text("secret")
        path.chmod(0)
        return path
    blocker = path.parent / (path.name + ".notadir")
    blocker.write_text("a file, so nothing can be below it")
    return blocker / path.name


# --- 1. run-layer honours batch_first from the export metadata --------------------------------------------------

def _export(layer, path):
    from export_torch import export  # scripts/ is on sys.path (conftest / torch_parity)
    return export(layer, str(path))


def test_run_layer_honours_batch_first_false_from_the_metadata(tmp_path):
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0).eval()  # torch's default: batch_first=False
    meta = _export(layer, tmp_path / "w.safetensors")
    assert meta["batch_first"] == "false"
    x = np.random.default_rng(0).standard_normal((5, 3, 16)).astype(np.float32)  # (T, B, E)
    save_file({"src": x}, str(tmp_path / "x.safetensors"))
    ok(run("run-layer", "--weights", str(tmp_path / "w.safetensors"), "--input", str(tmp_path / "x.safetensors"),
           "--output", str(tmp_path / "y.safetensors")))
    got = load_file(str(tmp_path / "y.safetensors"))["output"]
    with torch.no_grad():
        want = layer(torch.from_numpy(x)).numpy()
    assert got.shape == (5, 3, 16)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


# --- 2. a bool mask written by qkv.save_safetensors masks in run-layer -------------------------------------------

def test_bool_key_padding_mask_saved_by_qkv_masks_in_run_layer(tmp_path):
    torch.manual_seed(1)
    layer = torch.nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True).eval()
    _export(layer, tmp_path / "w.safetensors")
    x = np.random.default_rng(1).standard_normal((2, 6, 16)).astype(np.float32)
    kpm = np.zeros((2, 6), bool)
    kpm[0, 3:] = True
    qkv_module.save_safetensors(str(tmp_path / "x.safetensors"), {"src": x, "src_key_padding_mask": kpm})
    ok(run("run-layer", "--weights", str(tmp_path / "w.safetensors"), "--input", str(tmp_path / "x.safetensors"),
           "--output", str(tmp_path / "y.safetensors")))
    got = load_file(str(tmp_path / "y.safetensors"))["output"]
    with torch.no_grad():
        want = layer(torch.from_numpy(x), src_key_padding_mask=torch.from_numpy(kpm)).numpy()
        unmasked = layer(torch.from_numpy(x)).numpy()
    valid = ~kpm
    np.testing.assert_allclose(got[valid], want[valid], rtol=1e-4, atol=1e-4)
    assert np.abs(got[0, :3] - unmasked[0, :3]).max() > 1e-3  # the mask did change the real tokens' outputs


# --- 4. a failed write to stdout is an error --------------------------------------------------------------------

def test_write_to_a_full_stdout_is_an_error_not_exit_0(base_run):
    with open("/dev/full", "w") as full:
        one_line_error(run("eval", str(base_run), "--json", stdout=full), "cannot write to standard output")
        one_line_error(run("translate", str(base_run), stdin="12\n34\n", stdout=full),
                       "cannot write to standard output")
        one_line_error(run("demo", "--out", str(base_run.parent / "demo"), stdout=full),
                       "cannot write to standard output")
        one_line_error(run("--version", stdout=full), "cannot write to standard output")


def test_embed_and_search_into_a_full_stdout_name_the_failure(tmp_path):
    import minilm_corpus
    model = minilm_corpus.model_dir()
    (tmp_path / "docs.txt").write_text("a cat\na dog\n")
    with open("/dev/full", "w") as full:
        one_line_error(run("embed", "--model", model, "hello", stdout=full), "[embed] cannot write to standard output")
        one_line_error(run("search", "--model", model, "--corpus", str(tmp_path / "docs.txt"), "cat", stdout=full),
                       "[search] cannot write to standard output")


# --- 5. --max-tokens: an overlong TSV line is skipped and counted ------------------------------------------------

def test_overlong_tsv_line_is_skipped_with_a_warning_by_max_tokens(tmp_path):
    lines = [f"{i} {i + 1}\t{i + 1} {i}" for i in range(40)] + ["x" * 200_000 + "\ty"]
    (tmp_path / "long.tsv").write_text("\n".join(lines) + "\n")
    t0 = time.time()
    r = ok(run("train", "--data", str(tmp_path / "long.tsv"), "--model", "transformer", "--d-model", "16",
               "--heads", "2", "--layers", "1", "--steps", "3", "--test-fraction", "0", "--out", str(tmp_path / "o")))
    assert time.time() - t0 < 60
    assert "skipped 1 of 41 pairs with more than --max-tokens 256 char tokens" in r.stderr, r.stderr
    assert "longest 200000" in r.stderr
    one_line_error(run("train", "--data", str(tmp_path / "long.tsv"), "--max-tokens", "2", "--steps", "1",
                       "--test-fraction", "0", "--out", str(tmp_path / "o2")), "longer than --max-tokens 2")
    one_line_error(run("train", "--data", str(tmp_path / "long.tsv"), "--max-tokens", "0", "--out",
                       str(tmp_path / "o3")), "--max-tokens", ">= 1")


# --- 6. train --out DIR never overwrites a vocab.txt it did not write --------------------------------------------

def test_train_out_refuses_to_overwrite_a_foreign_vocab_txt(tmp_path):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "vocab.txt").write_text("my own notes\n")
    one_line_error(run("train", *SMALL, "--steps", "1", "--out", str(out)), "vocab.txt", "not written by this run")
    assert (out / "vocab.txt").read_text() == "my own notes\n"
    assert not (out / "config.json").exists()


def test_train_out_accepts_its_own_vocab_txt_left_by_a_killed_start(tmp_path, base_run):
    out = tmp_path / "again"
    out.mkdir()
    shutil.copy(base_run / "vocab.txt", out / "vocab.txt")  # as if killed between vocab.txt and config.json
    ok(run("train", *SMALL, "--steps", "1", "--out", str(out)))


# --- 7. SIGINT / SIGTERM: finish the step, checkpoint, exit 130 / 143 -------------------------------------------

def _start(args):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.Popen([QKV, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def _wait_for_line(proc, prefix, timeout=60):
    t0 = time.time()
    while time.time() - t0 < timeout:
        line = proc.stdout.readline()
        if not line:
            break
        if line.startswith(prefix):
            return line
    raise AssertionError(f"no line starting with {prefix!r}")


@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_signal_finishes_the_step_writes_a_checkpoint_and_exits_128_plus_signal(tmp_path, sig, code):
    out = tmp_path / "run"
    proc = _start(["train", *SMALL, "--steps", "100000", "--checkpoint-every", "100000", "--eval-every", "100000",
                   "--log-every", "1", "--out", str(out)])
    line = _wait_for_line(proc, "step 3/")
    proc.send_signal(sig)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == code, (line, stderr)
    assert f"stopped by {sig.name}" in stderr and "checkpoint written" in stderr, stderr
    step = int(latest(out).name[5:])
    assert step >= 3  # no checkpoint was due before step 100000: this one was written because of the signal
    assert json.loads((latest(out) / "trainer.json").read_text())["step"] == step
    assert_resumes(out, step + 2)


def test_second_signal_stops_at_once(tmp_path):
    """The first signal only sets the flag (the step finishes, then a checkpoint of ~60 MB is written and fsynced);
    the second, 30 ms later, meets the default action (SA_RESETHAND) and ends the process at once."""
    out = tmp_path / "run"
    proc = _start(["train", *small(d_model="256", layers="3"), "--ffn", "1024", "--steps", "100000",
                   "--checkpoint-every", "1", "--eval-every", "100000", "--out", str(out)])
    _wait_for_line(proc, "checkpoint step 1 ")
    os.kill(proc.pid, signal.SIGINT)
    time.sleep(0.03)  # signals do not queue: let the first one be delivered
    os.kill(proc.pid, signal.SIGINT)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGINT, (proc.returncode, stderr)
    assert "stopped by" not in stderr  # it did not get to finish the step
    step = int(latest(out).name[5:])
    assert_resumes(out, step + 1)


def test_signals_at_random_moments_leave_a_run_that_resumes(tmp_path):
    out = tmp_path / "run"
    rng = random.Random(17)
    args = ["train", *SMALL, "--steps", "100000", "--checkpoint-every", "3", "--eval-every", "100000",
            "--keep-checkpoints", "2"]
    best = 0
    for _ in range(6):
        sig = rng.choice([signal.SIGINT, signal.SIGTERM, signal.SIGKILL])
        started = (out / "config.json").exists()  # a kill may land before the run directory exists
        proc = _start(args + (["--resume", str(out)] if started else ["--out", str(out)]))
        if sig != signal.SIGKILL:  # the handlers are installed before the first line ("training ...", "resuming ...")
            _wait_for_line(proc, "")
        time.sleep(rng.uniform(0.0, 1.2))
        proc.send_signal(sig)
        _, stderr = proc.communicate(timeout=60)
        if sig == signal.SIGKILL:
            assert proc.returncode == -signal.SIGKILL
        else:
            assert proc.returncode == 128 + sig, (sig, proc.returncode, stderr)
        if not (out / "checkpoints").exists():
            continue  # stopped before the model existed: nothing to lose yet
        for ckpt in (out / "checkpoints").iterdir():
            if ckpt.name.startswith("step-"):
                assert sorted(f.name for f in ckpt.iterdir()) == ["model.safetensors", "optimizer.safetensors",
                                                                  "trainer.json"], ckpt
        step = int(latest(out).name[5:]) if any(p.name.startswith("step-")
                                                for p in (out / "checkpoints").iterdir()) else 0
        assert step >= best, f"the latest checkpoint went back from {best} to {step}"
        best = step
    assert best > 0
    assert_resumes(out, best + 1)


# --- 8. readers never see a half-pruned checkpoint ---------------------------------------------------------------

def test_eval_during_training_never_fails_on_a_pruned_checkpoint(tmp_path):
    out = tmp_path / "run"
    ok(run("train", *SMALL, "--steps", "1", "--out", str(out)))
    proc = _start(["train", *SMALL, "--steps", "100000", "--checkpoint-every", "1", "--eval-every", "100000",
                   "--keep-checkpoints", "1", "--resume", str(out)])
    try:
        for _ in range(12):
            ok(run("eval", str(out), "--json", "--limit", "2"))
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)
    assert proc.returncode == 143


# --- 9. non-finite weights are refused at load, naming the tensor ------------------------------------------------

def _poison(path, name=None, value=np.nan):
    tensors = load_file(str(path))
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        meta = json.loads(f.read(n)).get("__metadata__")
    name = name or sorted(k for k, v in tensors.items() if v.dtype == np.float32 and v.size > 1)[0]
    tensors[name] = tensors[name].copy()
    tensors[name].reshape(-1)[1] = value
    save_file(tensors, str(path), metadata=meta)
    return name


@pytest.mark.parametrize("value", [np.nan, np.inf])
def test_checkpoint_with_non_finite_weights_is_refused_naming_the_tensor(tmp_path, base_run, value):
    out = copy_run(base_run, tmp_path)
    name = _poison(latest(out) / "model.safetensors", value=value)
    for args in (["eval", str(out)], ["translate", str(out)], ["train", "--resume", str(out), "--steps", "9"]):
        one_line_error(run(*args, stdin="12\n"), "model.safetensors", name, "non-finite")


def test_checkpoint_with_non_finite_optimizer_state_is_refused(tmp_path, base_run):
    out = copy_run(base_run, tmp_path)
    name = _poison(latest(out) / "optimizer.safetensors")
    one_line_error(run("train", "--resume", str(out), "--steps", "9"), "optimizer.safetensors", name, "non-finite")


def test_run_layer_refuses_non_finite_weights(tmp_path):
    layer = torch.nn.TransformerEncoderLayer(8, 2, 16, batch_first=True)
    _export(layer, tmp_path / "w.safetensors")
    _poison(tmp_path / "w.safetensors", "linear1.weight")
    save_file({"src": np.zeros((1, 2, 8), np.float32)}, str(tmp_path / "x.safetensors"))
    one_line_error(run("run-layer", "--weights", str(tmp_path / "w.safetensors"), "--input",
                       str(tmp_path / "x.safetensors"), "--output", str(tmp_path / "y.safetensors")),
                   "linear1.weight", "non-finite")


# --- 10. zero / negative sizes and extra TSV fields are refused ---------------------------------------------------

@pytest.mark.parametrize("flag, value", [("--d-model", "0"), ("--layers", "0"), ("--max-len", "-5"),
                                         ("--heads", "0"), ("--hidden", "-1"), ("--ffn", "0"),
                                         ("--checkpoint-every", "0"), ("--min-len", "0")])
def test_zero_or_negative_size_is_refused_not_replaced_by_a_default(tmp_path, flag, value):
    args = [a for a in SMALL if a not in (flag,)]
    if flag in SMALL:  # drop the flag's value from SMALL too
        i = SMALL.index(flag)
        args = SMALL[:i] + SMALL[i + 2:]
    one_line_error(run("train", *args, f"{flag}={value}", "--steps", "1", "--out", str(tmp_path / "o")), flag,
                   f"must be an integer >= 1, got '{value}'")
    assert not (tmp_path / "o").exists()


def test_min_len_above_max_len_is_refused(tmp_path):
    one_line_error(run("train", *small(min_len="5", max_len="3"), "--out", str(tmp_path / "o")),
                   "--max-len >= --min-len")


def test_beam_zero_is_a_short_clear_error(base_run):
    for cmd in (["eval", str(base_run)], ["translate", str(base_run)]):
        msg = one_line_error(run(*cmd, "--beam", "0", stdin="1\n"), "--beam", "must be an integer >= 1, got '0'")
        assert len(msg) < 120, msg


def test_run_layer_nhead_zero_says_so(tmp_path):
    layer = torch.nn.TransformerEncoderLayer(8, 2, 16, batch_first=True)
    _export(layer, tmp_path / "w.safetensors")
    save_file({"src": np.zeros((1, 2, 8), np.float32)}, str(tmp_path / "x.safetensors"))
    msg = one_line_error(run("run-layer", "--weights", str(tmp_path / "w.safetensors"), "--input",
                             str(tmp_path / "x.safetensors"), "--output", str(tmp_path / "y.safetensors"),
                             "--nhead", "0"), "--nhead must be >= 1, got 0")
    assert "pass --nhead" not in msg


def test_tsv_line_with_a_third_field_names_file_and_line(tmp_path):
    (tmp_path / "three.tsv").write_text("a\tb\nGo.\tVa !\tCC-BY 2.0\n")
    one_line_error(run("train", "--data", str(tmp_path / "three.tsv"), "--out", str(tmp_path / "o")),
                   "three.tsv:2", "3 tab-separated fields")


# --- 11. clear errors ---------------------------------------------------------------------------------------------

def test_unknown_subcommand_is_named():
    one_line_error(run("foo"), "unknown subcommand 'foo'", "train")
    one_line_error(run(), "a subcommand is required", "translate")


def test_version_prints_the_version():
    r = ok(run("--version"))
    assert r.stdout.strip() == f"qkv {qkv_module.__version__}"


def test_corrupted_trainer_json_names_the_file_and_the_field(tmp_path, base_run):
    out = copy_run(base_run, tmp_path)
    tj = latest(out) / "trainer.json"
    state = json.loads(tj.read_text())
    state["step"] = "12abc"
    tj.write_text(json.dumps(state))
    msg = one_line_error(run("eval", str(out)), str(tj), "'step'", "12abc")
    assert "stoll" not in msg
    del state["step"]
    tj.write_text(json.dumps(state))
    one_line_error(run("eval", str(out)), str(tj), "missing key 'step'")
    state["step"], state["extra"] = 6, 1
    tj.write_text(json.dumps(state))
    one_line_error(run("eval", str(out)), str(tj), "unexpected key 'extra'")


def test_config_json_with_a_bad_escape_names_the_file(tmp_path, base_run):
    out = copy_run(base_run, tmp_path)
    cfg = out / "config.json"
    cfg.write_text(cfg.read_text().replace('"cell": "gru"', '"cell": "g\\uZZZZ"'))
    msg = one_line_error(run("eval", str(out)), str(cfg), "hex digit")
    assert "stoul" not in msg


def test_missing_tensor_in_a_checkpoint_is_named_missing(tmp_path, base_run):
    out = copy_run(base_run, tmp_path)
    path = latest(out) / "model.safetensors"
    tensors = load_file(str(path))
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        meta = json.loads(f.read(n)).get("__metadata__")
    gone = sorted(tensors)[0]
    del tensors[gone]
    save_file(tensors, str(path), metadata=meta)
    msg = one_line_error(run("eval", str(out)), "missing: " + gone)
    assert "unexpected" not in msg


# --- file faults for every subcommand ------------------------------------------------------------------------------

def _bad_files(tmp_path, good_bytes):
    """name -> path: missing, empty, a directory, unreadable, truncated (half of a good file)."""
    (tmp_path / "empty").write_bytes(b"")
    (tmp_path / "adir").mkdir()
    (tmp_path / "truncated").write_bytes(good_bytes[: len(good_bytes) // 2])
    return {"missing": tmp_path / "missing", "empty": tmp_path / "empty", "directory": tmp_path / "adir",
            "unreadable": unreadable(tmp_path / "locked"), "truncated": tmp_path / "truncated"}


def test_run_layer_with_bad_weight_and_input_files(tmp_path):
    layer = torch.nn.TransformerEncoderLayer(8, 2, 16, batch_first=True)
    _export(layer, tmp_path / "w.safetensors")
    save_file({"src": np.zeros((1, 2, 8), np.float32)}, str(tmp_path / "x.safetensors"))
    bad = _bad_files(tmp_path, (tmp_path / "w.safetensors").read_bytes())
    for kind, path in bad.items():
        one_line_error(run("run-layer", "--weights", str(path), "--input", str(tmp_path / "x.safetensors"),
                           "--output", str(tmp_path / "y.safetensors")), "safetensors")
        one_line_error(run("run-layer", "--weights", str(tmp_path / "w.safetensors"), "--input", str(path),
                           "--output", str(tmp_path / "y.safetensors")), "safetensors")
    one_line_error(run("run-layer", "--weights", str(tmp_path / "w.safetensors"), "--input",
                       str(tmp_path / "x.safetensors"), "--output", str(tmp_path / "adir")))
    assert not (tmp_path / "y.safetensors").exists()


def test_train_with_bad_data_files(tmp_path):
    bad = _bad_files(tmp_path, b"hello\tbonjour\ncat\tchat\n")
    for kind, path in bad.items():
        if kind == "truncated":
            path.write_bytes(b"hello\tbon")  # a cut line still parses: the truncation is the data's, not ours
            ok(run("train", "--data", str(path), "--model", "rnn", "--d-model", "8", "--hidden", "8", "--steps",
                   "1", "--test-fraction", "0", "--out", str(tmp_path / "t")))
            continue
        one_line_error(run("train", "--data", str(path), "--steps", "1", "--out", str(tmp_path / kind)), "[tsv]")
        assert not (tmp_path / kind / "config.json").exists()


def test_eval_and_translate_with_a_damaged_run_directory(tmp_path, base_run):
    damaged = {
        "config.json": ["missing", "empty", "directory", "truncated"],
        "vocab.txt": ["missing", "empty", "directory", "truncated"],
    }
    for fname, kinds in damaged.items():
        good = (base_run / fname).read_bytes()
        for kind in kinds:
            out = tmp_path / f"{fname}-{kind}"
            shutil.copytree(base_run, out)
            target = out / fname
            target.unlink()
            if kind == "empty":
                target.write_bytes(b"")
            elif kind == "directory":
                target.mkdir()
            elif kind == "truncated":
                target.write_bytes(good[: len(good) // 2])
            for args in (["eval", str(out)], ["translate", str(out)], ["train", "--resume", str(out), "--steps", "8"]):
                one_line_error(run(*args, stdin="12\n"))
    one_line_error(run("eval", str(tmp_path / "nowhere")), "not a training run")
    (tmp_path / "plainfile").write_text("x")
    one_line_error(run("eval", str(tmp_path / "plainfile")), "not a training run")


@pytest.mark.parametrize("fname", ["model.safetensors", "optimizer.safetensors", "trainer.json"])
@pytest.mark.parametrize("kind", ["missing", "empty", "directory", "truncated", "garbage"])
def test_corrupted_checkpoint_is_a_clear_error_and_the_run_still_resumes(tmp_path, base_run, fname, kind):
    out = copy_run(base_run, tmp_path)
    target = latest(out) / fname
    good = target.read_bytes()
    target.unlink()
    if kind == "empty":
        target.write_bytes(b"")
    elif kind == "directory":
        target.mkdir()
    elif kind == "truncated":
        target.write_bytes(good[: len(good) // 2])
    elif kind == "garbage":
        target.write_bytes(bytes(random.Random(3).randrange(256) for _ in range(len(good))))
    r = run("train", "--resume", str(out), "--steps", "8")
    if kind == "missing" and fname == "trainer.json":
        # Without trainer.json a directory is not a complete checkpoint: the previous one is used.
        ok(r)
        return
    one_line_error(r, latest(out).name)
    if fname != "optimizer.safetensors":
        one_line_error(run("eval", str(out)), latest(out).name)
    # Removing the damaged checkpoint leaves the older complete one, from which the run resumes.
    shutil.rmtree(latest(out))
    assert_resumes(out, 8)


def test_embed_and_search_with_bad_model_and_corpus_files(tmp_path):
    import minilm_corpus
    model = pathlib.Path(minilm_corpus.model_dir())
    bad = _bad_files(tmp_path, b"")
    for kind in ("missing", "empty", "unreadable"):
        one_line_error(run("embed", "--model", str(bad[kind]), "x"))
    one_line_error(run("embed", "--model", str(tmp_path / "adir"), "x"))  # an empty directory
    broken = tmp_path / "broken-model"
    shutil.copytree(model, broken, ignore=shutil.ignore_patterns("*.onnx", "onnx", "openvino", "*.bin", "*.h5"))
    st = broken / "model.safetensors"
    st.write_bytes(st.read_bytes()[:4096])
    one_line_error(run("embed", "--model", str(broken), "x"), "safetensors")
    for kind, path in bad.items():
        if kind == "empty":
            continue
        one_line_error(run("search", "--model", str(model), "--corpus", str(path), "cat"))


def test_demo_into_an_unwritable_place_is_one_line(tmp_path):
    (tmp_path / "file").write_text("x")
    one_line_error(run("demo", "--out", str(tmp_path / "file" / "sub")))


def test_experiment_with_an_unknown_name_a_corrupt_result_or_an_unwritable_out(tmp_path):
    one_line_error(run("experiment", "nope", "--out", str(tmp_path / "e")), "unknown experiment 'nope'")
    (tmp_path / "file").write_text("x")
    one_line_error(run("experiment", "bottleneck", "--quick", "--quiet", "--out", str(tmp_path / "file" / "sub")))
    for content in ("", '{"broken', "[1, 2"):
        (tmp_path / "r" / "bottleneck").mkdir(parents=True, exist_ok=True)
        (tmp_path / "r" / "bottleneck" / "results.json").write_text(content)
        r = run("experiment", "report", "--out", str(tmp_path / "r"), "--doc", str(tmp_path / "doc.md"))
        assert r.returncode == 2, r.stderr
        last = r.stderr.strip().splitlines()[-1]
        assert last.startswith("qkv: error: [experiment] ") and "results.json" in last, last
        assert sum(line.startswith("qkv: error") for line in r.stderr.splitlines()) == 1


def test_viz_and_serve_with_a_missing_or_damaged_model_or_run(tmp_path, base_run):
    one_line_error(run("viz", "--model", str(tmp_path / "missing"), "hello", "--out", str(tmp_path / "v.html")),
                   "does not exist")
    one_line_error(run("viz", "--run", str(tmp_path / "missing"), "--input", "12", "--out", str(tmp_path / "v.html")),
                   "not a training run")
    one_line_error(run("serve", "--model", str(tmp_path / "missing"), timeout=30), "does not exist")
    out = copy_run(base_run, tmp_path)
    _poison(latest(out) / "model.safetensors")
    one_line_error(run("viz", "--run", str(out), "--input", "12", "--out", str(tmp_path / "v.html")), "non-finite")
    assert not (tmp_path / "v.html").exists()
