"""Smoke test of `qkv experiment NAME --quick`: every experiment runs, writes a well-formed results.json and the
PNG figures it lists, and prints its table. It asserts no scientific result (quick runs are far too small).

The binary is $QKV_BIN, default <repo>/build/qkv. OMP_WAIT_POLICY=passive keeps two OpenMP threads from spinning
against each other on a busy machine (spinning made these runs 10-20x slower on the shared 2-core box).
"""
import json
import os
import struct
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
QKV = os.environ.get("QKV_BIN", str(REPO / "build" / "qkv"))
ENV = dict(os.environ, OMP_WAIT_POLICY="passive", OMP_NUM_THREADS="2")

if not os.path.exists(QKV):
    pytest.skip(f"qkv binary not found at {QKV} (set QKV_BIN)", allow_module_level=True)


def run(*args, timeout=120):
    return subprocess.run([QKV, "experiment", *args], capture_output=True, text=True, env=ENV, timeout=timeout)


def experiment_names():
    out = run("list")
    assert out.returncode == 0, out.stderr
    return [line.split()[0] for line in out.stdout.splitlines() if line.strip()]


NAMES = ["bottleneck", "parallelism", "alignment", "scaling", "heads", "permutation", "positional", "components",
         "translation"]


def png_size(path):
    data = Path(path).read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def test_list_names_every_experiment():
    assert experiment_names() == NAMES


@pytest.mark.parametrize("name", NAMES)
def test_quick_run_writes_results_and_figures(name, tmp_path):
    if name == "translation" and not os.path.exists("/usr/share/locale/fr/LC_MESSAGES/git.mo"):
        pytest.skip("git's translations are not installed")
    out = run(name, "--quick", "--threads", "2", "--quiet", "--out", str(tmp_path))
    assert out.returncode == 0, out.stderr
    assert f"== {name} (" in out.stdout
    assert "wall time:" in out.stdout
    res = json.loads((tmp_path / "results.json").read_text())
    assert res["experiment"] == name
    assert res["mode"] == "quick"
    assert res["wall_seconds"] >= 0
    assert res["claim"] and res["verdict"].endswith("(quick run: too small to judge)")
    assert isinstance(res["results"], dict) and res["results"]
    assert res["figures"], "every experiment draws at least one figure"
    for fig in res["figures"]:
        w, h = png_size(tmp_path / fig)
        assert 100 <= w <= 4000 and 100 <= h <= 4000, (fig, w, h)


def test_doc_report_links_copied_figures(tmp_path):
    doc = tmp_path / "docs" / "EXPERIMENTS.md"
    out = run("parallelism", "--quick", "--quiet", "--out", str(tmp_path / "run"), "--doc", str(doc))
    assert out.returncode == 0, out.stderr
    text = doc.read_text()
    assert "## parallelism" in text and "**Verdict:" in text and "| T |" in text
    for fig in json.loads((tmp_path / "run" / "results.json").read_text())["figures"]:
        assert f"experiments/parallelism/{fig}" in text
        png_size(doc.parent / "experiments" / "parallelism" / fig)


def test_report_rebuilds_the_doc_from_results_on_disk(tmp_path):
    runs = tmp_path / "runs"
    assert run("parallelism", "--quick", "--quiet", "--out", str(runs / "parallelism")).returncode == 0
    doc = tmp_path / "EXPERIMENTS.md"
    (tmp_path / "experiments" / "parallelism").mkdir(parents=True)
    (tmp_path / "experiments" / "parallelism" / "notes.md").write_text("A remark written by hand.")
    out = run("report", "--out", str(runs), "--doc", str(doc))
    assert out.returncode == 0, out.stderr
    text = doc.read_text()
    assert "## parallelism" in text and "| T |" in text and "## scaling" not in text
    assert "**Notes (written after reading the results).** A remark written by hand." in text
    assert "scaling: no results" in out.stderr
    (runs / "parallelism" / "results.json").write_text('{"experiment": "parallelism"}')
    bad = run("report", "--out", str(runs), "--doc", str(doc))
    assert bad.returncode == 2 and "is missing" in bad.stderr


def test_unknown_experiment_fails_with_one_line():
    out = run("no-such-claim", "--quick", "--out", "/tmp/qkv-unused")
    assert out.returncode == 2
    assert "[experiment] unknown experiment 'no-such-claim'" in out.stderr
    assert out.stderr.count("\n") == 1
