"""PyTorch side of the training-step benchmark: the same models as bench/train_step_bench.cpp (a 2-layer pre-LN causal
decoder-only Transformer, d 128, 4 heads, FFN 512, vocab 64, batch 32 x 128; a GRU Seq2Seq with Bahdanau attention),
one AdamW step each (zero_grad, forward, cross-entropy, backward, step). With --qkv-bench it also runs the C++ binary
in the same run, alternating rounds, and prints the speed ratio.

    .venv/bin/python bench/train_step_torch.py --threads 2 --qkv-bench build/bench/train_step_bench
"""
import argparse
import json
import os
import statistics
import subprocess
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class DecoderOnly(nn.Module):
    """models::DecoderOnlyTransformer: tok + learned pos embeddings, pre-LN GELU encoder layers with a causal mask,
    final LayerNorm, bias-free lm_head."""

    def __init__(self, vocab=64, max_len=128, d=128, heads=4, ffn=512, layers=2):
        super().__init__()
        self.tok_emb = nn.Embedding(vocab, d)
        self.pos_emb = nn.Embedding(max_len, d)
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(d, heads, ffn, dropout=0.0, activation="gelu", batch_first=True,
                                       norm_first=True) for _ in range(layers))
        self.norm = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)

    def forward(self, ids):
        t = ids.shape[1]
        x = self.tok_emb(ids) + self.pos_emb(torch.arange(t))
        mask = nn.Transformer.generate_square_subsequent_mask(t)
        for layer in self.layers:
            x = layer(x, src_mask=mask, is_causal=True)
        return self.lm_head(self.norm(x))


class Seq2SeqBahdanau(nn.Module):
    """models::Seq2Seq with a GRU and Bahdanau attention: s_t = GRU([emb(y_{t-1}); c_t], s_{t-1}),
    logits_t = out([s_t; c_t])."""

    def __init__(self, vocab=64, emb=128, hidden=256):
        super().__init__()
        self.src_embed = nn.Embedding(vocab, emb)
        self.tgt_embed = nn.Embedding(vocab, emb)
        self.encoder = nn.GRU(emb, hidden, batch_first=True)
        self.decoder = nn.GRUCell(emb + hidden, hidden)
        self.W = nn.Linear(hidden, hidden, bias=False)
        self.U = nn.Linear(hidden, hidden, bias=False)
        self.v = nn.Linear(hidden, 1, bias=False)
        self.out = nn.Linear(2 * hidden, vocab)

    def forward(self, src, tgt_in):
        states, h = self.encoder(self.src_embed(src))
        s = h[0]
        prepared = self.U(states)
        emb = self.tgt_embed(tgt_in)
        logits = []
        for t in range(tgt_in.shape[1]):
            alpha = torch.softmax(self.v(torch.tanh(self.W(s).unsqueeze(1) + prepared)).squeeze(2), dim=1)
            ctx = torch.bmm(alpha.unsqueeze(1), states).squeeze(1)
            s = self.decoder(torch.cat([emb[:, t], ctx], dim=1), s)
            logits.append(self.out(torch.cat([s, ctx], dim=1)))
        return torch.stack(logits, dim=1)


def time_steps(step, steps, warmup):
    """-> (median wall ms, median process CPU ms, last loss). CPU time counts every thread, so on a busy machine it
    still measures the work (wall time also counts the waiting)."""
    times, cpu = [], []
    for i in range(warmup + steps):
        t0, c0 = time.perf_counter(), time.process_time()
        loss = step()
        t1, c1 = time.perf_counter(), time.process_time()
        if i >= warmup:
            times.append((t1 - t0) * 1e3)
            cpu.append((c1 - c0) * 1e3)
    return statistics.median(times), statistics.median(cpu), loss


def bench_decoder(steps, warmup):
    torch.manual_seed(0)
    model = DecoderOnly()
    opt = torch.optim.AdamW(model.parameters())
    ids = torch.randint(0, 64, (32, 128))
    targets = torch.cat([ids[:, 1:], torch.full((32, 1), -100)], dim=1)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(ids).reshape(-1, 64), targets.reshape(-1))
        loss.backward()
        opt.step()
        return loss.item()

    return time_steps(step, steps, warmup)


def bench_seq2seq(steps, warmup):
    torch.manual_seed(0)
    model = Seq2SeqBahdanau()
    opt = torch.optim.AdamW(model.parameters())
    src = torch.randint(0, 64, (32, 20))
    tgt = torch.randint(0, 64, (32, 20))

    def step():
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(src, tgt).reshape(-1, 64), tgt.reshape(-1))
        loss.backward()
        opt.step()
        return loss.item()

    return time_steps(step, steps, warmup)


def run_qkv(path, model, steps, warmup, threads):
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads))
    out = subprocess.run([path, "--model", model, "--steps", str(steps), "--warmup", str(warmup)], env=env,
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3, help="alternating torch / qkv rounds; the best median counts")
    ap.add_argument("--qkv-bench", default=None, help="path of train_step_bench to run in the same process tree")
    ap.add_argument("--model", default="all", choices=["all", "decoder", "seq2seq"])
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    models = ["decoder", "seq2seq"] if a.model == "all" else [a.model]
    for name in models:
        fn = bench_decoder if name == "decoder" else bench_seq2seq
        torch_ms, torch_cpu, qkv_ms, qkv_cpu = [], [], [], []
        for _ in range(a.rounds):
            med, cpu, _ = fn(a.steps, a.warmup)
            torch_ms.append(med)
            torch_cpu.append(cpu)
            if a.qkv_bench:
                r = run_qkv(a.qkv_bench, name, a.steps, a.warmup, a.threads)
                qkv_ms.append(r["step_ms"])
                qkv_cpu.append(r["cpu_ms"])
        row = {"model": name, "threads": a.threads, "torch": torch.__version__,
               "torch_step_ms": round(min(torch_ms), 2), "torch_cpu_ms": round(min(torch_cpu), 2)}
        if qkv_ms:
            row["qkv_step_ms"] = round(min(qkv_ms), 2)
            row["qkv_cpu_ms"] = round(min(qkv_cpu), 2)
            row["speedup_wall"] = round(min(torch_ms) / min(qkv_ms), 2)
            row["speedup_cpu"] = round(min(torch_cpu) / min(qkv_cpu), 2)
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
