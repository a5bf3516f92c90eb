"""qkv.train / qkv.train.Run: the library's training run from Python. A run stopped by a callback and resumed ends
with the same losses and weights as one run straight through and as `qkv train` (the same run); options are
`qkv train`'s; a resume keeps the run's settings; errors are one-line ValueError / TypeError; the gradient probes
of the parity tests are not in the shipped module."""
import pathlib

import numpy as np
import pytest

import qkv

SMALL = dict(model="transformer", task="reverse", min_len=3, max_len=8, train_size=300, test_size=40, d_model=32,
             heads=2, layers=1, dropout=0.1, batch_size=16, eval_every=5, eval_size=20, seed=3)


def newest_weights(run_dir):
    ckpts = sorted((pathlib.Path(run_dir) / "checkpoints").glob("step-*"))
    return ckpts[-1].name, qkv.load_safetensors(ckpts[-1] / "model.safetensors")


def test_stop_and_resume_equals_one_run(tmp_path):
    straight = []
    r = qkv.train(out=tmp_path / "full", steps=12, on_step=lambda s: straight.append(s["loss"]), **SMALL)
    assert r["step"] == 12 and r["first_step"] == 0 and not r["stopped"]
    assert r["checkpoint"].endswith("step-00000012")

    part = []
    run = qkv.train.Run(out=tmp_path / "part", steps=12, **SMALL)
    r1 = run.train(on_step=lambda s: part.append(s["loss"]) or s["step"] == 7)  # True: stop after step 7
    assert r1["stopped"] and r1["step"] == 7 and run.step == 7
    assert r1["checkpoint"].endswith("step-00000007")

    resumed = qkv.train.Run(resume=tmp_path / "part")
    assert resumed.step == 7 and resumed.resumed_from.endswith("step-00000007")
    r2 = resumed.train(on_step=lambda s: part.append(s["loss"]))
    assert r2["first_step"] == 7 and r2["step"] == 12
    assert part == straight  # bit-exact: the same float losses at every step
    name_a, a = newest_weights(tmp_path / "full")
    name_b, b = newest_weights(tmp_path / "part")
    assert name_a == name_b == "step-00000012"
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])


def test_python_run_is_the_cli_run(tmp_path):
    """The same options through qkv.train and through the command's config give the same config.json."""
    run = qkv.train.Run(out=tmp_path / "r", steps=3, **SMALL)
    saved = (tmp_path / "r" / "config.json").read_text()
    assert '"model": "transformer"' in saved and '"steps": 3' in saved and '"d_model": 32' in saved
    assert run.config["task"] == "reverse" and run.config["batch_size"] == "16"
    assert run.num_parameters > 0 and run.num_train == 300 and run.num_test == 40
    evals = []
    run.train(on_eval=evals.append)
    assert [e["step"] for e in evals] == [3]
    assert set(run.evaluate(limit=5)) == {"exact_match", "token_accuracy", "examples", "tokens"}


def test_callback_error_is_raised_after_the_checkpoint(tmp_path):
    def boom(s):
        if s["step"] == 2:
            raise RuntimeError("stop here")

    with pytest.raises(RuntimeError, match="stop here"):
        qkv.train(out=tmp_path / "r", steps=6, on_step=boom, **SMALL)
    assert newest_weights(tmp_path / "r")[0] == "step-00000002"


def test_resume_keeps_the_run_settings(tmp_path):
    qkv.train(out=tmp_path / "r", steps=2, **SMALL)
    with pytest.raises(ValueError, match=r"\[train\] d_model 64 differs from the run's 32"):
        qkv.train.Run(resume=tmp_path / "r", d_model=64)
    run = qkv.train.Run(resume=tmp_path / "r", steps=4, eval_every=2, d_model=32)  # the same value is accepted
    assert run.train()["step"] == 4
    with pytest.raises(ValueError, match="already holds a run"):
        qkv.train.Run(out=tmp_path / "r", **SMALL)


def test_errors_are_one_line(tmp_path):
    with pytest.raises(ValueError, match="out= .* or resume= .* is required"):
        qkv.train(steps=1)
    with pytest.raises(ValueError, match="unknown setting 'stepz'"):
        qkv.train(out=tmp_path / "a", stepz=1)
    with pytest.raises(ValueError, match="bad value 'x' for 'steps'"):
        qkv.train(out=tmp_path / "b", steps="x")
    with pytest.raises(TypeError, match=r"\[train\] steps must be a str, int, float or bool, got list"):
        qkv.train(out=tmp_path / "c", steps=[1])
    with pytest.raises(ValueError, match="is not a training run"):
        qkv.train(resume=tmp_path / "none")
    with pytest.raises(ValueError, match="name different directories"):
        qkv.train(out=tmp_path / "a", resume=tmp_path / "b")


def test_gradient_probes_left_the_shipped_module():
    assert not hasattr(qkv._qkv, "autograd")
