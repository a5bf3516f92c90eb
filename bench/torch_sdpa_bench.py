#!/usr/bin/env python3
"""qkv.torch inside PyTorch: SDPA forward + backward against torch's own, and a whole small Transformer training step.

Rows, all in one run and one process, so the ratios come from the same machine state:
  1. SDPA fwd+bwd, causal, B4 H8 D64, T = 512, 1024, 2048 (float32, CPU): torch.nn.functional's vs
     qkv.torch.scaled_dot_product_attention (autograd through qkv's fused backward).
  2. GQA prefill, causal, forward only, Hq 32 over Hkv 8, D128: torch's enable_gqa=True vs qkv.torch's (native GQA:
     K/V never expanded).
  3. One training step (forward, cross-entropy, backward, Adam) of a small causal Transformer LM built from
     torch.nn.TransformerEncoderLayer vs the same model with qkv.torch.TransformerEncoderLayer (same weights).
The two sides take turns, `--repeats` times each, so a machine that slows down slows both alike; each time is the
median. Also checks that both sides give the same numbers. Only an idle machine gives numbers worth recording.

    OMP_NUM_THREADS=2 .venv/bin/python bench/torch_sdpa_bench.py [--threads 2] [--repeats 5] [--json out.json]
    .venv/bin/python bench/torch_sdpa_bench.py --quick      # small sizes: checks that the script runs
"""
import argparse
import json
import os
import platform
import statistics
import sys
import time


def parse():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--quick", action="store_true", help="tiny sizes and 1 repeat: a smoke run, not a measurement")
    p.add_argument("--json", help="also write the rows to this file")
    return p.parse_args()


args = parse()
for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[var] = str(args.threads)

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import qkv  # noqa: E402
import qkv.torch as qt  # noqa: E402

torch.set_num_threads(args.threads)


def median_time(fn, repeats):
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def interleaved(fns, repeats):
    """Median seconds of each fn, the fns taking turns (one warm-up call each first)."""
    for f in fns:
        f()
    times = [[] for _ in fns]
    for _ in range(repeats):
        for i, f in enumerate(fns):
            t0 = time.perf_counter()
            f()
            times[i].append(time.perf_counter() - t0)
    return [statistics.median(t) for t in times]


def max_rel(a, b):
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


def sdpa_rows(B, H, D, Ts, repeats):
    rows = []
    for T in Ts:
        g = torch.Generator().manual_seed(T)
        q, k, v = (torch.randn(B, H, T, D, generator=g).requires_grad_(True) for _ in range(3))
        dout = torch.randn(B, H, T, D, generator=g)

        def step(fn):
            def run():
                for t in (q, k, v):
                    t.grad = None
                fn(q, k, v, is_causal=True).backward(dout)
            return run

        t_torch, t_qkv = interleaved([step(F.scaled_dot_product_attention), step(qt.scaled_dot_product_attention)],
                                     repeats)
        step(F.scaled_dot_product_attention)()
        ref = [t.grad.clone() for t in (q, k, v)]
        step(qt.scaled_dot_product_attention)()
        err = max(max_rel(t.grad, r) for t, r in zip((q, k, v), ref))
        rows.append({"row": "sdpa_fwd_bwd_causal", "B": B, "H": H, "T": T, "D": D, "torch_ms": 1e3 * t_torch,
                     "qkv_ms": 1e3 * t_qkv, "speedup": t_torch / t_qkv, "max_rel_grad_diff": err})
        print(f"SDPA fwd+bwd causal B{B} H{H} T{T} D{D}: torch {1e3 * t_torch:8.2f} ms  qkv {1e3 * t_qkv:8.2f} ms"
              f"  x{t_torch / t_qkv:.2f}  (grads max rel diff {err:.1e})", flush=True)
    return rows


def gqa_prefill_rows(B, Hq, Hkv, D, Ts, repeats):
    rows = []
    for T in Ts:
        g = torch.Generator().manual_seed(T + 1)
        q = torch.randn(B, Hq, T, D, generator=g)
        k, v = (torch.randn(B, Hkv, T, D, generator=g) for _ in range(2))

        def run(fn):
            return lambda: fn(q, k, v, is_causal=True, enable_gqa=True)

        with torch.no_grad():
            t_torch, t_qkv = interleaved([run(F.scaled_dot_product_attention), run(qt.scaled_dot_product_attention)],
                                         repeats)
            err = max_rel(run(qt.scaled_dot_product_attention)(), run(F.scaled_dot_product_attention)())
        rows.append({"row": "gqa_prefill_causal", "B": B, "Hq": Hq, "Hkv": Hkv, "T": T, "D": D,
                     "torch_ms": 1e3 * t_torch, "qkv_ms": 1e3 * t_qkv, "speedup": t_torch / t_qkv,
                     "max_rel_diff": err})
        print(f"GQA prefill causal B{B} Hq{Hq} Hkv{Hkv} T{T} D{D}: torch {1e3 * t_torch:8.2f} ms  qkv "
              f"{1e3 * t_qkv:8.2f} ms  x{t_torch / t_qkv:.2f}  (max rel diff {err:.1e})", flush=True)
    return rows


class TinyLM(nn.Module):
    def __init__(self, layer_cls, vocab, d, heads, ff, layers, T):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.randn(T, d) * 0.02)
        self.layers = nn.ModuleList([layer_cls(d, heads, ff, dropout=0.0, batch_first=True, norm_first=True)
                                     for _ in range(layers)])
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(T))

    def forward(self, ids):
        x = self.emb(ids) + self.pos[: ids.shape[1]]
        for layer in self.layers:
            x = layer(x, src_mask=self.mask, is_causal=True)
        return self.head(self.norm(x))


def training_rows(cfg, repeats):
    vocab, d, heads, ff, layers, B, T = cfg
    torch.manual_seed(0)
    ref = TinyLM(nn.TransformerEncoderLayer, vocab, d, heads, ff, layers, T)
    mine = TinyLM(qt.TransformerEncoderLayer, vocab, d, heads, ff, layers, T)
    mine.load_state_dict(ref.state_dict())
    ids = torch.randint(0, vocab, (B, T + 1), generator=torch.Generator().manual_seed(1))
    losses = {}

    def step(model, opt, name):
        def run():
            logits = model(ids[:, :-1])
            loss = F.cross_entropy(logits.reshape(-1, vocab), ids[:, 1:].reshape(-1))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            losses.setdefault(name, []).append(loss.item())
        return run

    opts = [torch.optim.Adam(m.parameters(), lr=1e-4) for m in (ref, mine)]
    t_torch, t_qkv = interleaved([step(ref, opts[0], "torch"), step(mine, opts[1], "qkv")], repeats)
    n = min(len(losses["torch"]), len(losses["qkv"]))
    loss_rel = max(abs(a - b) / abs(a) for a, b in zip(losses["torch"][:n], losses["qkv"][:n]))
    row = {"row": "transformer_train_step", "vocab": vocab, "d_model": d, "nhead": heads, "dim_feedforward": ff,
           "layers": layers, "B": B, "T": T, "torch_ms": 1e3 * t_torch, "qkv_ms": 1e3 * t_qkv,
           "speedup": t_torch / t_qkv, "max_rel_loss_diff": loss_rel}
    print(f"Training step, {layers}-layer causal LM d{d} H{heads} ff{ff} B{B} T{T}: torch {1e3 * t_torch:8.2f} ms"
          f"  with qkv {1e3 * t_qkv:8.2f} ms  x{t_torch / t_qkv:.2f}  (loss curves max rel diff {loss_rel:.1e})",
          flush=True)
    return [row]


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def main():
    repeats = 1 if args.quick else args.repeats
    print(f"torch {torch.__version__}, qkv {qkv.__version__}, {args.threads} threads, {cpu_name()}; "
          f"median of {repeats}, sides interleaved", flush=True)
    if args.quick:
        rows = sdpa_rows(2, 2, 16, [64, 128], repeats)
        rows += gqa_prefill_rows(1, 4, 2, 16, [64], repeats)
        rows += training_rows((50, 32, 4, 64, 2, 2, 32), repeats)
    else:
        rows = sdpa_rows(4, 8, 64, [512, 1024, 2048], repeats)
        rows += gqa_prefill_rows(1, 32, 8, 128, [512, 2048], repeats)
        rows += training_rows((1000, 256, 8, 1024, 4, 8, 256), repeats)
    if args.json:
        tmp = args.json + ".tmp"  # written whole, then renamed: never a half-written file
        with open(tmp, "w") as f:
            json.dump({"cpu": cpu_name(), "threads": args.threads, "repeats": repeats, "quick": args.quick,
                       "torch": torch.__version__, "rows": rows}, f, indent=1)
        os.replace(tmp, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
