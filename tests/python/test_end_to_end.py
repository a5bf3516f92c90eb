"""End to end: a PyTorch layer exported with scripts/export_torch.py runs in C++ through `qkv run-layer` and gives
PyTorch's numbers. The binary is $QKV_BIN (default <repo>/build/qkv).
"""
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from safetensors.numpy import load_file, save_file

from torch_parity import REPO, assert_parity, double_copy, rand

from export_torch import export  # scripts/ is on sys.path (torch_parity)

QKV_BIN = os.environ.get("QKV_BIN", os.path.join(REPO, "build", "qkv"))
EXPORT_SCRIPT = os.path.join(REPO, "scripts", "export_torch.py")


def run_layer(*args):
    if not os.access(QKV_BIN, os.X_OK):
        pytest.fail(f"qkv binary not found at {QKV_BIN}: build it (make build) or set QKV_BIN")
    proc = subprocess.run([QKV_BIN, "run-layer", *args], capture_output=True, text=True, timeout=60)
    return proc


def test_encoder_layer_exported_from_torch_runs_in_cpp_with_torch_numbers(tmp_path):
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    layer = torch.nn.TransformerEncoderLayer(32, 4, 64, dropout=0.1, activation="gelu", batch_first=True,
                                             norm_first=True).eval()
    with torch.no_grad():
        for p in layer.parameters():
            if p.dim() == 1:
                p.add_(0.1 * torch.randn_like(p))
    weights, inputs, output = (str(tmp_path / n) for n in ("w.safetensors", "x.safetensors", "y.safetensors"))
    meta = export(layer, weights)
    assert meta["nhead"] == "4" and meta["activation"] == "gelu" and meta["norm_first"] == "true"
    x = rand(rng, 3, 10, 32)
    kpm = np.zeros((3, 10), bool)
    kpm[1, 7:] = True  # sample 1 has 3 padding positions
    save_file({"src": x, "src_key_padding_mask": kpm}, inputs)

    proc = run_layer("--weights", weights, "--input", inputs, "--output", output)
    assert proc.returncode == 0, proc.stderr
    got = load_file(output)["output"]

    def ref(mod, dtype):
        with torch.no_grad():  # also lets PyTorch take its fast path, as a deployed model would
            return mod(torch.from_numpy(x.astype(np.float64)).to(dtype),
                       src_key_padding_mask=torch.from_numpy(kpm)).numpy()

    r64, r32 = ref(double_copy(layer), torch.float64), ref(layer, torch.float32)
    valid = ~kpm  # PyTorch's fast path may zero padded rows; compare the real tokens
    assert_parity("run-layer.encoder", got[valid], r64[valid], r32[valid])


def test_decoder_layer_exported_by_the_script_runs_causally(tmp_path):
    rng = np.random.default_rng(1)
    weights, inputs, output = (str(tmp_path / n) for n in ("w.safetensors", "x.safetensors", "y.safetensors"))
    spec = "nn.TransformerDecoderLayer(16, 2, 24, batch_first=True)"
    proc = subprocess.run([sys.executable, EXPORT_SCRIPT, "--module", spec, "--seed", "3", "--out", weights],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    torch.manual_seed(3)
    layer = torch.nn.TransformerDecoderLayer(16, 2, 24, batch_first=True).eval()  # the same weights
    tgt, mem = rand(rng, 2, 6, 16), rand(rng, 2, 4, 16)
    save_file({"tgt": tgt, "memory": mem}, inputs)
    proc = run_layer("--weights", weights, "--input", inputs, "--output", output, "--causal")
    assert proc.returncode == 0, proc.stderr
    got = load_file(output)["output"]
    causal = torch.nn.Transformer.generate_square_subsequent_mask(6)

    def ref(mod, dtype):
        return mod(torch.from_numpy(tgt.astype(np.float64)).to(dtype), torch.from_numpy(mem.astype(np.float64)).to(dtype),
                   tgt_mask=causal.to(dtype), tgt_is_causal=True).detach().numpy()

    assert_parity("run-layer.decoder", got, ref(double_copy(layer), torch.float64), ref(layer, torch.float32))


def test_run_layer_reports_bad_inputs_in_one_line(tmp_path):
    weights, inputs = str(tmp_path / "w.safetensors"), str(tmp_path / "x.safetensors")
    export(torch.nn.TransformerEncoderLayer(8, 2, 16, batch_first=True), weights)
    save_file({"src": np.zeros((1, 3, 7), np.float32)}, inputs)
    proc = run_layer("--weights", weights, "--input", inputs, "--output", str(tmp_path / "y.safetensors"))
    assert proc.returncode != 0
    assert "[TransformerEncoderLayer] src (1, 3, 7)" in proc.stderr
    save_file({"x": np.zeros((1, 3, 8), np.float32)}, inputs)
    proc = run_layer("--weights", weights, "--input", inputs, "--output", str(tmp_path / "y.safetensors"))
    assert proc.returncode != 0 and "has no tensor 'src'" in proc.stderr
    with open(str(tmp_path / "broken.safetensors"), "wb") as f:
        f.write(b"\x01\x00")
    proc = run_layer("--weights", str(tmp_path / "broken.safetensors"), "--input", inputs, "--output",
                     str(tmp_path / "y.safetensors"))
    assert proc.returncode != 0 and "[safetensors]" in proc.stderr
    assert not os.path.exists(str(tmp_path / "y.safetensors"))
