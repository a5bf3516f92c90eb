#!/usr/bin/env python3
"""Attention forward at fp32 and bf16: qkv.scaled_dot_product_attention(precision=...) against PyTorch 2.13's SDPA on
float32 and bfloat16 tensors, B1 H8 D64 at T = 1024 and 4096 (causal and not); the backward likewise
(qkv.scaled_dot_product_attention_backward, which recomputes the forward, against torch's forward + backward) at
T = 1024 and 2048 causal; plus torch.matmul 2048^3 in float32
and bfloat16 as the GEMM peer of build-bench/bench/lowp_bench. One process, two threads; the sides take turns,
`--repeats` times each, and each figure is the median, so that a machine that slows down slows all alike.

    OMP_NUM_THREADS=2 .venv/bin/python bench/lowp_torch_bench.py [--repeats 5] [--json out.json]
"""
import argparse
import json
import statistics
import time

import numpy as np
import torch

import qkv


def timed(fn, calls):
    t = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t) / calls


def gflops(sides, flop, calls, repeats):
    """GF/s of each side: the sides take turns, repeats + 1 times (the first warms up), medians."""
    times = {s: [] for s in sides}
    for rep in range(repeats + 1):
        for s, fn in sides.items():
            dt = timed(fn, calls)
            if rep:
                times[s].append(dt)
    return {s: flop / statistics.median(v) * 1e-9 for s, v in times.items()}


def report(name, gf, results):
    print(f"  {name:36s} " + "   ".join(f"{s} {g:6.1f} GF/s" for s, g in gf.items())
          + f"   qkv bf16 / qkv fp32 {gf['qkv bf16'] / gf['qkv fp32']:.2f}x, / torch bf16 "
          f"{gf['qkv bf16'] / gf['torch bf16']:.2f}x")
    results.append({"row": name, "gflops": gf})


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    qkv.set_num_threads(args.threads)
    info = qkv.cpu_info()
    print(f"qkv isa {info['isa']}, attention set {info['attention']}; torch {torch.__version__}, "
          f"{args.threads} threads, {args.repeats} repeats (median)")
    results = []
    rng = np.random.default_rng(0)
    for t_len, causal in ((1024, False), (4096, False), (4096, True)):
        q, k, v = (rng.standard_normal((1, 8, t_len, 64)).astype(np.float32) for _ in range(3))
        tq, tk, tv = (torch.from_numpy(x) for x in (q, k, v))
        bq, bk, bv = (x.bfloat16() for x in (tq, tk, tv))
        flop = 4.0 * 8 * t_len * t_len * 64 * (0.5 if causal else 1.0)
        sides = {
            "qkv fp32": lambda: qkv.scaled_dot_product_attention(q, k, v, is_causal=causal),
            "qkv bf16": lambda: qkv.scaled_dot_product_attention(q, k, v, is_causal=causal, precision="bf16"),
            "torch fp32": lambda: torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, is_causal=causal),
            "torch bf16": lambda: torch.nn.functional.scaled_dot_product_attention(bq, bk, bv, is_causal=causal),
        }
        with torch.no_grad():
            gf = gflops(sides, flop, max(1, int(2e10 / flop)), args.repeats)
        report(f"attention fwd B1 H8 T{t_len} D64{' causal' if causal else ''}", gf, results)
    for t_len, causal in ((1024, False), (2048, True)):
        q, k, v, g = (rng.standard_normal((1, 8, t_len, 64)).astype(np.float32) for _ in range(4))
        tg = torch.from_numpy(g)

        def torch_fwd_bwd(dtype):
            tq, tk, tv = (torch.from_numpy(x).to(dtype).requires_grad_() for x in (q, k, v))
            torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, is_causal=causal).backward(tg.to(dtype))

        sides = {
            "qkv fp32": lambda: qkv.scaled_dot_product_attention_backward(q, k, v, g, is_causal=causal),
            "qkv bf16": lambda: qkv.scaled_dot_product_attention_backward(q, k, v, g, is_causal=causal,
                                                                          precision="bf16"),
            "torch fp32": lambda: torch_fwd_bwd(torch.float32),
            "torch bf16": lambda: torch_fwd_bwd(torch.bfloat16),
        }
        flop = 2.5 * 4.0 * 8 * t_len * t_len * 64 * (0.5 if causal else 1.0)  # forward 2 products, backward 5
        gf = gflops(sides, flop, max(1, int(2e10 / flop)), args.repeats)
        report(f"attention bwd B1 H8 T{t_len} D64{' causal' if causal else ''}", gf, results)
    a, b = torch.randn(2048, 2048), torch.randn(2048, 2048)
    a16, b16 = a.bfloat16(), b.bfloat16()
    sides = {"torch fp32": lambda: torch.matmul(a, b), "torch bf16": lambda: torch.matmul(a16, b16)}
    gf = gflops(sides, 2.0 * 2048 ** 3, 3, args.repeats)
    print("  matmul 2048^3                        " + "   ".join(f"{s} {g:6.1f} GF/s" for s, g in gf.items()))
    results.append({"row": "matmul 2048^3", "gflops": gf})
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"cpu_info": info, "torch": torch.__version__, "rows": results}, f, indent=2)


if __name__ == "__main__":
    main()
