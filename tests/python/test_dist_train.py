"""`mpirun -np N qkv train`: data parallelism equals one process, refuses what cannot work, and survives a lost rank.

- the loss curve of N = 2 and N = 4 equals the one-process run within 1e-5 relative over 100 steps of the
  Transformer copy task (variable lengths, so shards pad differently), with the parameters hash-checked identical on
  every rank after every step (the run fails otherwise) and only rank 0 printing;
- --resume with the same N continues the uninterrupted N = 2 curve bit for bit;
- --no-overlap (the gradient all-reduce after the backward instead of during it) changes no bit;
- a global --batch-size that does not divide by N, and ranks started with different settings, are refused;
- a SIGKILLed rank makes the others exit non-zero within 30 s with a message naming it, and the last checkpoint
  stays loadable;
- a run resumed on another number of ranks is refused;
- `--context-parallel N` (the N ranks split every sequence of a decoder-only or Llama model, ring attention) gives
  the one-process losses and parameters within float32 rounding, writes its checkpoints from rank 0 alone, resumes
  bit for bit on N ranks, and refuses the combinations it cannot run.

The command is taken from $QKV_BIN, else <repo>/build/qkv; mpirun runs as root with --oversubscribe (2 cores)."""
import os
import pathlib
import re
import json
import shutil
import signal
import struct
import subprocess
import time

import numpy as np
import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
QKV = os.environ.get("QKV_BIN", str(REPO / "build" / "qkv"))
MPIRUN = shutil.which("mpirun") or "mpirun"
ENV = dict(os.environ, OMP_NUM_THREADS="1", OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
# A tiny Transformer on copy with lengths 3..8: seconds per run.
TINY = ["train", "--model", "transformer", "--task", "copy", "--min-len", "3", "--max-len", "8", "--train-size", "200",
        "--test-size", "10", "--d-model", "16", "--heads", "2", "--layers", "1", "--ffn", "32", "--batch-size", "8",
        "--log-every", "1", "--eval-every", "1000", "--eval-size", "0", "--seed", "5", "--threads", "1"]
LOSS_RTOL = 1e-5


def run(np, *args, timeout=300):
    cmd = [QKV, *args] if np == 1 else [MPIRUN, "--oversubscribe", "-np", str(np), QKV, *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=timeout)


def ok(r):
    assert r.returncode == 0, f"exit {r.returncode}\nstdout:\n{r.stdout[-3000:]}\nstderr:\n{r.stderr[-3000:]}"
    return r


def losses(stdout):
    return {int(m.group(1)): m.group(2) for m in re.finditer(r"^step (\d+)/\d+ loss (\S+)", stdout, re.M)}


def test_this_build_has_mpi():
    assert shutil.which("mpirun"), "mpirun not found (scripts/install-deps.sh installs openmpi-bin)"
    assert re.search(r"^mpi: yes \(", ok(run(1, "info")).stdout, re.M)


def test_loss_curve_of_2_and_4_ranks_equals_one_process(tmp_path):
    curves = {}
    for np in (1, 2, 4):
        r = ok(run(np, *TINY, "--steps", "100", "--checkpoint-every", "50", "--out", str(tmp_path / f"n{np}")))
        curves[np] = {s: float(v) for s, v in losses(r.stdout).items()}
        assert sorted(curves[np]) == list(range(1, 101)), r.stdout[-2000:]
        assert r.stdout.count("step 1/100 ") == 1, "only rank 0 logs"
        if np > 1:
            assert f"data parallel: {np} ranks, global batch 8; parameters identical on every rank" in r.stdout
        assert (tmp_path / f"n{np}" / "checkpoints" / "step-00000100").is_dir()
    for np in (2, 4):
        worst = max(abs(curves[np][s] - curves[1][s]) / abs(curves[1][s]) for s in curves[1])
        assert worst <= LOSS_RTOL, f"N={np}: worst relative loss difference {worst:.3g}"
    assert curves[1][100] < curves[1][1], "the run did not learn at all"


def test_resume_with_the_same_ranks_continues_the_curve_exactly(tmp_path):
    full = losses(ok(run(2, *TINY, "--steps", "12", "--checkpoint-every", "3", "--out", str(tmp_path / "full"))).stdout)
    ok(run(2, *TINY, "--steps", "6", "--checkpoint-every", "3", "--out", str(tmp_path / "part")))
    shutil.rmtree(tmp_path / "part" / "checkpoints" / "step-00000006")  # back to the checkpoint of step 3
    resumed = ok(run(2, "train", "--resume", str(tmp_path / "part"), "--steps", "12"))
    assert "from step 3" in resumed.stdout
    assert losses(resumed.stdout) == {s: full[s] for s in range(4, 13)}


def test_no_overlap_gives_the_same_bits(tmp_path):
    """--no-overlap starts every bucket's all-reduce after the backward instead of during it: the same collectives
    on the same buffers in the same order, so the same losses and weights, bit for bit."""
    curves, weights = {}, {}
    for name, extra in (("overlap", []), ("after", ["--no-overlap"])):
        out = tmp_path / name
        curves[name] = losses(ok(run(2, *TINY, *extra, "--steps", "10", "--out", str(out))).stdout)
        weights[name] = read_safetensors(out / "checkpoints" / "step-00000010" / "model.safetensors")
    assert sorted(curves["overlap"]) == list(range(1, 11))
    assert curves["overlap"] == curves["after"]
    for name, w in weights["overlap"].items():
        assert np.array_equal(w, weights["after"][name]), name


def test_batch_that_does_not_split_is_refused(tmp_path):
    args = [("6" if a == "8" and TINY[i - 1] == "--batch-size" else a) for i, a in enumerate(TINY)]
    r = run(4, *args, "--steps", "3", "--out", str(tmp_path / "r"))
    assert r.returncode != 0
    assert "qkv: error: [train] --batch-size 6 (the global batch) does not divide by the 4 ranks" in r.stderr
    assert not (tmp_path / "r" / "config.json").exists()


def test_ranks_with_different_settings_are_refused_naming_the_flag(tmp_path):
    out = str(tmp_path / "r")
    cmd = [MPIRUN, "--oversubscribe", "-np", "1", QKV, *TINY, "--steps", "3", "--out", out, ":",
           "-np", "1", QKV, *TINY, "--steps", "3", "--lr", "0.5", "--out", out]
    r = subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=120)
    assert r.returncode != 0
    assert "the ranks of mpirun were given different --lr: every rank must train the same run" in r.stderr, r.stderr
    assert not (tmp_path / "r" / "config.json").exists()


def rank_pid(mpirun_pid, rank):
    """The pid of the qkv process of `rank` below mpirun (its environment names the rank)."""
    for d in pathlib.Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            env = (d / "environ").read_bytes().split(b"\0")
            exe = os.path.basename(os.readlink(d / "exe"))
        except OSError:
            continue
        if exe == "qkv" and f"OMPI_COMM_WORLD_RANK={rank}".encode() in env:
            # below this mpirun: its ancestry reaches mpirun_pid
            pid = int(d.name)
            while pid > 1:
                try:
                    pid = int((pathlib.Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[1])
                except OSError:
                    break
                if pid == mpirun_pid:
                    return int(d.name)
    return None


def test_a_killed_rank_ends_the_run_and_keeps_the_last_checkpoint(tmp_path):
    out = tmp_path / "run"
    args = [MPIRUN, "--oversubscribe", "-np", "2", QKV, *TINY, "--steps", "100000", "--checkpoint-every", "5",
            "--keep-checkpoints", "2", "--out", str(out)]
    p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    try:
        deadline = time.time() + 120
        while time.time() < deadline and not list((out / "checkpoints").glob("step-*")):
            assert p.poll() is None, p.communicate()
            time.sleep(0.2)
        assert list((out / "checkpoints").glob("step-*")), "no checkpoint within 120 s"
        pid = rank_pid(p.pid, 1)
        assert pid is not None, "rank 1 not found"
        os.kill(pid, signal.SIGKILL)
        t0 = time.time()
        stdout, stderr = p.communicate(timeout=30)
        assert time.time() - t0 <= 30
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
    assert p.returncode != 0
    assert re.search(r"rank 1 .*(signal 9|Killed)", stderr + stdout), stderr[-2000:]
    # The last checkpoint loads: evaluation reads it, and the run resumes from it (same N).
    ev = subprocess.run([QKV, "eval", str(out), "--json"], capture_output=True, text=True, env=ENV, timeout=120)
    assert ev.returncode == 0, ev.stderr
    last = max(int(c.name.split("-")[1]) for c in (out / "checkpoints").glob("step-*"))
    resumed = ok(run(2, "train", "--resume", str(out), "--steps", str(last + 2)))
    assert f"from step {last}" in resumed.stdout


def test_resume_on_another_number_of_ranks_is_refused(tmp_path):
    ok(run(2, *TINY, "--steps", "2", "--out", str(tmp_path / "r")))
    for np_ in (1, 4):
        r = run(np_, "train", "--resume", str(tmp_path / "r"), "--steps", "4")
        assert r.returncode != 0
        assert (f"[train] '{tmp_path / 'r'}' was trained on 2 ranks (data parallel); resuming it on {np_} is refused"
                in r.stderr), r.stderr
    assert sorted(c.name for c in (tmp_path / "r" / "checkpoints").iterdir()) == ["step-00000002"]


# A tiny decoder-only model on copy, lengths 3..8: sequences src + BOS + tgt of 7..17 tokens, padded under
# --context-parallel N to a multiple of 2N (20 for N = 2, 18 for N = 3; the default 26 learned positions hold both).
DECODER = ["train", "--model", "decoder", "--task", "copy", "--min-len", "3", "--max-len", "8", "--train-size", "64",
           "--test-size", "4", "--d-model", "16", "--heads", "2", "--layers", "2", "--ffn", "32", "--batch-size", "8",
           "--log-every", "1", "--eval-every", "1000", "--eval-size", "0", "--seed", "3", "--threads", "1",
           "--optimizer", "sgd", "--lr", "0.2"]
# Float32 rounding only: the N ranks sum each attention row's keys in N blocks merged through their log-sum-exp, and
# add the loss and the gradients in another order than one process. One such difference is a few float32 ulps
# (1.2e-7 each) of the quantity, and 8 SGD steps carry it on without amplifying it by more than ~10. (SGD, not Adam:
# Adam divides every gradient by its own RMS, so a gradient that is zero in exact arithmetic, such as the key bias's,
# which softmax ignores, turns its rounding noise into lr-sized steps that differ between any two summation orders.)
CP_RTOL = 1e-5


def read_safetensors(path):
    raw = pathlib.Path(path).read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        assert info["dtype"] == "F32", (name, info["dtype"])
        a, b = info["data_offsets"]
        out[name] = np.frombuffer(raw[8 + n + a:8 + n + b], dtype="<f4").reshape(info["shape"])
    return out


def with_model(args, model):
    """DECODER with another --model (the Llama kind: RMSNorm, rotary positions, SwiGLU)."""
    return [model if a == "decoder" and args[i - 1] == "--model" else a for i, a in enumerate(args)]


@pytest.mark.parametrize("model", ["decoder", "llama"])
def test_context_parallel_equals_one_process(tmp_path, model):
    curves, weights = {}, {}
    for np_ in (1, 2, 3):
        extra = ["--context-parallel", str(np_)] if np_ > 1 else []
        out = tmp_path / f"n{np_}"
        r = ok(run(np_, *with_model(DECODER, model), *extra, "--steps", "8", "--checkpoint-every", "4",
                   "--out", str(out)))
        curves[np_] = {s: float(v) for s, v in losses(r.stdout).items()}
        assert sorted(curves[np_]) == list(range(1, 9)), r.stdout[-2000:]
        assert r.stdout.count("step 1/8 ") == 1, "only rank 0 logs"
        if np_ > 1:
            assert f"context parallel: {np_} ranks, global batch 8; parameters identical on every rank" in r.stdout
        # rank 0 alone writes, atomically: the finished checkpoints and nothing half-written beside them
        assert sorted(c.name for c in (out / "checkpoints").iterdir()) == ["step-00000004", "step-00000008"]
        weights[np_] = read_safetensors(out / "checkpoints" / "step-00000008" / "model.safetensors")
    for np_ in (2, 3):
        worst = max(abs(curves[np_][s] - curves[1][s]) / abs(curves[1][s]) for s in curves[1])
        assert worst <= CP_RTOL, f"N={np_}: worst relative loss difference {worst:.3g}"
        assert weights[np_].keys() == weights[1].keys()
        for name, w in weights[1].items():
            d = np.linalg.norm(weights[np_][name] - w) / max(np.linalg.norm(w), 1e-30)
            assert d <= CP_RTOL, f"N={np_}: {name} differs by {d:.3g} (normwise relative)"
    assert curves[1][8] < curves[1][1], "the run did not learn at all"


@pytest.mark.parametrize("model", ["decoder", "llama"])
def test_context_parallel_resumes_exactly_on_the_same_ranks(tmp_path, model):
    args = [*with_model(DECODER, model), "--context-parallel", "2", "--checkpoint-every", "3"]
    full = losses(ok(run(2, *args, "--steps", "6", "--out", str(tmp_path / "full"))).stdout)
    ok(run(2, *args, "--steps", "3", "--out", str(tmp_path / "part")))
    resumed = ok(run(2, "train", "--resume", str(tmp_path / "part"), "--steps", "6"))
    assert "from step 3" in resumed.stdout
    assert losses(resumed.stdout) == {s: full[s] for s in range(4, 7)}
    r = run(1, "train", "--resume", str(tmp_path / "part"), "--steps", "6")
    assert r.returncode != 0
    assert "was trained on 2 ranks (context parallel); resuming it on 1 is refused" in r.stderr, r.stderr


def test_context_parallel_refuses_what_it_cannot_run(tmp_path):
    cases = [
        (4, ["--context-parallel", "2"], "[train] --context-parallel 2 needs exactly 2 ranks (mpirun -np 2), got 4: "
                                         "context and data parallelism together are not supported"),
        (1, ["--context-parallel", "2"], "[train] --context-parallel 2 needs exactly 2 ranks (mpirun -np 2), got 1"),
        (2, ["--context-parallel", "2", "--max-positions", "18"],
         "[train] --context-parallel 2 pads the longest training sequence (17 tokens) to 20 positions (2 x 2 equal "
         "chunks), more than --max-positions 18: raise --max-positions to at least 20"),
        (2, ["--context-parallel", "2", "--model", "transformer"],
         "[train] --context-parallel 2 runs --model decoder or llama only"),
        (2, ["--context-parallel", "2", "--dropout", "0.1"], "ring attention has no dropout on the attention weights"),
    ]
    for i, (np_, extra, message) in enumerate(cases):
        out = tmp_path / f"r{i}"
        base = DECODER if "--model" not in extra else [a for a in DECODER if a not in ("--model", "decoder")]
        r = run(np_, *base, *extra, "--steps", "2", "--out", str(out))
        assert r.returncode != 0, (extra, r.stdout[-1000:])
        lines = [ln for ln in r.stderr.splitlines() if ln.startswith("qkv: error:")]
        assert lines and message in lines[0], (extra, r.stderr[-2000:])
        assert not (out / "config.json").exists()
