"""PyTorch SDPA and the article's NumPy attention, timed like bench/attention_bench.cpp times qkv (best of N).

Called by attention_bench once per row; prints one JSON object. Runs with the project's .venv (torch 2.13 CPU):
  .venv/bin/python bench/torch_sdpa.py --b 1 --h 8 --tq 2048 --tk 2048 --d 64 --mode fwd --threads 2
"""
import argparse
import json
import os
import sys
import time


def parse():
    p = argparse.ArgumentParser()
    for name in ("b", "h", "tq", "tk", "d"):
        p.add_argument(f"--{name}", type=int, required=True)
    p.add_argument("--causal", action="store_true")
    p.add_argument("--mode", choices=["fwd", "fwdbwd", "memory"], default="fwd")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--numpy", action="store_true", help="also time the article's NumPy code")
    p.add_argument("--cpu-time", action="store_true", help="time with this process's CPU time, not the wall clock")
    return p.parse_args()


args = parse()
for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[var] = str(args.threads)

import numpy as np  # noqa: E402  (after the thread variables)
import resource  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

torch.set_num_threads(args.threads)


clock = time.process_time if args.cpu_time else time.perf_counter


def best(f, reps):
    f()  # warm-up
    t_best = float("inf")
    for _ in range(reps):
        t0 = clock()
        f()
        t_best = min(t_best, clock() - t0)
    return t_best


# The article's code with the transpose fixed (K.transpose(0, 2, 1) swapped the wrong axes of a 4-D tensor).
def softmax(x, axis=-1):
    x = x - x.max(axis=axis, keepdims=True)
    e = np.exp(x)
    return e / e.sum(axis=axis, keepdims=True)


def scaled_dot_attention(Q, K, V, mask=None):
    dk = Q.shape[-1]
    scores = Q @ K.swapaxes(-1, -2) / np.sqrt(dk).astype(Q.dtype)
    if mask is not None:
        scores = np.where(mask, scores, -1e9)
    weights = softmax(scores)
    return weights @ V, weights


def main():
    g = torch.Generator().manual_seed(0)
    shape_q = (args.b, args.h, args.tq, args.d)
    shape_k = (args.b, args.h, args.tk, args.d)
    q = torch.randn(shape_q, generator=g)
    k = torch.randn(shape_k, generator=g)
    v = torch.randn(shape_k, generator=g)
    res = {"torch": torch.__version__, "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
           "threads": torch.get_num_threads()}
    if args.mode == "memory":
        base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        t0 = clock()
        with torch.no_grad():
            F.scaled_dot_product_attention(q, k, v, is_causal=args.causal)
        res["torch_ms"] = (clock() - t0) * 1e3
        res["torch_extra_rss_mib"] = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) / 1024.0
    elif args.mode == "fwd":
        with torch.no_grad():
            res["torch_ms"] = best(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=args.causal),
                                   args.reps) * 1e3
    else:
        qg, kg, vg = (t.clone().requires_grad_(True) for t in (q, k, v))
        d_out = torch.randn(shape_q[:-1] + (args.d,), generator=g)

        def step():
            for t in (qg, kg, vg):
                t.grad = None
            F.scaled_dot_product_attention(qg, kg, vg, is_causal=args.causal).backward(d_out)

        res["torch_ms"] = best(step, args.reps) * 1e3
    if args.numpy and args.mode == "fwd":
        Q, K, V = (t.numpy() for t in (q, k, v))
        mask = np.tril(np.ones((args.tq, args.tk), dtype=bool)) if args.causal else None
        res["numpy_ms"] = best(lambda: scaled_dot_attention(Q, K, V, mask), max(1, args.reps // 2)) * 1e3
    json.dump(res, sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
