"""Peak memory of a loaded GGUF (issue 37's target: at most 1.3x the file plus the KV cache). In a fresh process,
SmolLM2-135M-Instruct's Q4_1 GGUF is loaded with its weights as stored (qkv.CausalLM.from_pretrained: the model, its
tokenizer and stop ids) and continues a chat prompt greedily; the growth of the process's peak resident memory
(VmHWM) over its peak before the load (python, numpy and the qkv module imported) must stay within 1.3x the file's
size plus the float32 K and V of every layer over the positions used (contiguous caches: generate sizes them to
prompt + new tokens). Pages of the mapped file count: they are resident memory of the process like any other.
tests/cpp/gguf_memory_test.cpp measures the model alone (no tokenizer, no Python)."""
import json
import os
import subprocess
import sys

import qkv
import smollm2

NEW = 32

CHILD = r"""
import json, sys
import numpy as np
import qkv

def kib(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(key + " not in /proc/self/status")

path, new, ids = sys.argv[1], int(sys.argv[2]), np.asarray(json.loads(sys.argv[3]), dtype=np.int64)
base = kib("VmHWM")
lm = qkv.CausalLM.from_pretrained(path)  # weights as stored, its own tokenizer and stop ids
loaded_peak, loaded_rss = kib("VmHWM"), kib("VmRSS")
out = lm.generate(ids, max_new_tokens=new, do_sample=False, eos_token_id=-1)
c = lm.config
print(json.dumps({"base": base, "loaded_peak": loaded_peak, "loaded_rss": loaded_rss, "peak": kib("VmHWM"),
                  "prompt": int(ids.size), "new": int(np.asarray(out).size),  # a 1-D prompt: the new ids only
                  "layers": c.num_hidden_layers, "kv_heads": c.num_key_value_heads, "head_dim": c.head_dim}))
"""


def test_peak_memory_of_a_loaded_gguf_is_within_1_3x_the_file_plus_the_kv_cache():
    path = smollm2.gguf_path()
    # The prompt's ids come from this process, so that the child's baseline holds no tokenizer of its own.
    ids = qkv.Tokenizer.from_pretrained(path).apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}], add_generation_prompt=True, tokenize=True)
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "2"))
    run = subprocess.run([sys.executable, "-c", CHILD, str(path), str(NEW), json.dumps([int(i) for i in ids])],
                         capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stderr
    r = json.loads(run.stdout.strip().splitlines()[-1])
    assert r["new"] == NEW, r  # eos_token_id=-1: nothing stops the reply early
    file_bytes = path.stat().st_size
    positions = r["prompt"] + r["new"]
    kv_bytes = 2 * r["layers"] * r["kv_heads"] * r["head_dim"] * positions * 4
    peak = r["peak"] - r["base"]
    bound = 1.3 * file_bytes + kv_bytes
    mb = 1e6
    assert peak <= bound, (
        f"peak growth {peak / mb:.1f} MB = {peak / file_bytes:.3f}x the file ({file_bytes / mb:.1f} MB) against "
        f"1.3x the file + {kv_bytes / mb:.2f} MB of KV cache ({positions} positions) = {bound / mb:.1f} MB; "
        f"after the load: peak {(r['loaded_peak'] - r['base']) / mb:.1f} MB, "
        f"resident {(r['loaded_rss'] - r['base']) / mb:.1f} MB")
