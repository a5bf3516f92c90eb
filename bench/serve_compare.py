#!/usr/bin/env python3
"""`qkv serve` against llama.cpp's servers on the same GGUF file, driven by the same client code.

One server runs at a time (qkv serve, then each peer, then again for each repeat): started on a free port with the
same thread count, warmed by one request, measured, stopped. The client is raw HTTP (one thread per stream): each of
N concurrent streams sends streamed chat completions at temperature 0, one after the other, from a fixed prompt set
with `max_tokens`; N = 1 and 8 by default. Per server and N:
  total tokens/s   the completion tokens of every reply (the usage chunk's count; where a server sends none,
                   max_tokens for a reply cut by it, the content chunks for one that stopped) over the wall time from
                   the first request to the last reply (prefills included);
  TTFT             median time from sending a request to its first content chunk;
  per stream       median over the replies of (tokens - 1) / (last chunk - first chunk): the speed a reader sees;
  cores            the server's CPU seconds (/proc/PID/stat) over the wall seconds: the threads it really used.
Then the ratio of N = 8 to N = 1 and the prefix cache: a chat's second turn (a long system prompt, the first
question, its reply, a second question) timed to its first content chunk, against the same second turn after a
system prompt that differs at its start (nothing to reuse), one stream.
Every reply must have `max_tokens` tokens with finish_reason "length", or fewer with "stop" (the end-of-turn token);
any other reply is an error and the script exits 1.

Peers: `llama-server` (llama.cpp's own server, `bench/build_llama_server.sh` builds it from the vendored llama.cpp of
llama-cpp-python's source package; `-t/-tb THREADS -np PARALLEL -c PARALLEL*CTX`, continuous batching) and
`llama-cpp-python` (`python -m llama_cpp.server`, `--n_threads/--n_threads_batch THREADS`; it answers one request
at a time behind a lock, and by default a new request interrupts the running stream: `--interrupt_requests False`
keeps them all). llama-server's thread count and slots are read back from its log.

    OMP_NUM_THREADS=2 .venv/bin/python bench/serve_compare.py --qkv build-bench/qkv \\
        --llama-server build-bench/llama-server/build/bin/llama-server [--threads 2] [--repeats 3] [--json out.json]
    .venv/bin/python bench/serve_compare.py --quick ...   # 1 repeat, 8 tokens: checks that the script runs
"""
import argparse
import http.client
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PEERS = ("llama-server", "llama-cpp-python")

PROMPTS = [
    "Explain how a bicycle works.",
    "Write a short story about a lighthouse keeper.",
    "Describe the water cycle.",
    "What are the main causes of the seasons on Earth?",
    "Give advice to someone learning to cook.",
    "Explain what a computer program is to a child.",
    "Describe a walk through a forest in autumn.",
    "Why do people keep pets?",
]
SYSTEM_RULES = [f"Rule {i + 1}: answer politely, in plain English, and keep point {i + 1} of the house style in mind "
                f"when you write about topic number {i + 1}." for i in range(40)]


def parse():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--qkv", default=os.path.join(ROOT, "build", "qkv"), help="the qkv command")
    p.add_argument("--llama-server", default=os.path.join(ROOT, "build-bench", "llama-server", "build", "bin", "llama-server"),
                   help="llama.cpp's llama-server binary")
    p.add_argument("--peers", default="llama-server,llama-cpp-python",
                   help=f"comma-separated, of {', '.join(PEERS)} (a missing llama-server binary is an error)")
    p.add_argument("--gguf", help="the model file (default: SmolLM2-135M-Instruct Q4_1, tests/python/smollm2.py)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--streams", default="1,8", help="concurrent streams to measure, comma-separated")
    p.add_argument("--requests", type=int, default=2, help="requests each stream sends, one after the other")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--ctx", type=int, default=2048, help="context of one request (each server holds parallel x ctx)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--no-prefix", action="store_true", help="skip the second-turn (prefix cache) measurement")
    p.add_argument("--quick", action="store_true", help="1 repeat, 8 tokens, 1 request per stream: a smoke run")
    p.add_argument("--json", help="also write the results to this file")
    a = p.parse_args()
    if a.quick:
        a.repeats, a.max_tokens, a.requests = 1, 8, 1
    a.streams = [int(s) for s in a.streams.split(",")]
    a.peers = [s for s in a.peers.split(",") if s]
    for s in a.peers:
        if s not in PEERS:
            p.error(f"--peers: unknown peer {s!r} (known: {', '.join(PEERS)})")
    if a.threads < 1 or a.max_tokens < 2 or a.requests < 1 or a.repeats < 1 or min(a.streams) < 1:
        p.error("--threads, --requests, --repeats and --streams must be >= 1, --max-tokens >= 2")
    return a


def cpu_name():
    """The model name of /proc/cpuinfo, with its family and model numbers (a virtual machine's name can be vague)."""
    fields = {}
    with open("/proc/cpuinfo") as f:
        for line in f:
            if ":" in line:
                k, v = (x.strip() for x in line.split(":", 1))
                fields.setdefault(k, v)
    name = fields.get("model name", "unknown CPU")
    return f"{name} (family {fields['cpu family']}, model {fields['model']})" if "cpu family" in fields else name


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_seconds(pid):
    """utime + stime of a process, all its threads (clock ticks in /proc/PID/stat)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# --- servers ---------------------------------------------------------------------------------------------------------

class Server:
    """One server process on a free port; `log` collects its stdout and stderr."""

    def __init__(self, name, argv, env, port):
        self.name, self.port = name, port
        self.log_file = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen(argv, stdout=self.log_file, stderr=subprocess.STDOUT, env=env)
        deadline = time.time() + 180
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"[serve_compare] {name} exited with {self.proc.returncode}:\n{self.log()[-3000:]}")
            try:
                status, _ = request(port, "GET", "/v1/models", timeout=5)  # 503 while loading (all three)
                if status == 200:
                    break
            except OSError:
                pass
            if time.time() > deadline:
                self.stop()
                raise RuntimeError(f"[serve_compare] {name} did not answer /v1/models in 180 s:\n{self.log()[-3000:]}")
            time.sleep(0.1)

    def log(self):
        self.log_file.seek(0)
        return self.log_file.read()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def start(name, a, gguf, parallel):
    port = free_port()
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads))
    if name == "qkv":
        argv = [a.qkv, "serve", "--model", gguf, "--port", str(port), "--ctx", str(a.ctx), "--parallel", str(parallel)]
    elif name == "llama-server":
        argv = [a.llama_server, "-m", gguf, "--port", str(port), "--host", "127.0.0.1", "-t", str(a.threads), "-tb",
                str(a.threads), "-np", str(parallel), "-c", str(parallel * a.ctx), "--cont-batching"]
    else:
        argv = [sys.executable, "-m", "llama_cpp.server", "--model", gguf, "--port", str(port), "--host", "127.0.0.1",
                "--n_threads", str(a.threads), "--n_threads_batch", str(a.threads), "--n_ctx", str(a.ctx),
                "--interrupt_requests", "False"]
    s = Server(name, argv, env, port)
    if name == "llama-server":
        # Its log: "llama threadpool init, n_threads = T" per thread pool, "n_slots = P, n_ctx_slot = C".
        log = s.log()
        threads = [int(t) for t in re.findall(r"threadpool init, n_threads = (\d+)", log)]
        slots = re.search(r"n_slots = (\d+), n_ctx_slot = (\d+)", log)
        if not threads or set(threads) != {a.threads} or not slots or \
                (int(slots.group(1)), int(slots.group(2))) != (parallel, a.ctx):
            s.stop()
            raise RuntimeError(f"[serve_compare] llama-server does not report {a.threads} threads and {parallel} slots "
                               f"of {a.ctx} tokens: threads {threads}, {slots.group(0) if slots else 'no slot line'}")
    return s


def versions(a, peers):
    out = {}
    out["qkv"] = subprocess.run([a.qkv, "--version"], capture_output=True, text=True).stdout.strip() or "qkv"
    if "llama-server" in peers:
        r = subprocess.run([a.llama_server, "--version"], capture_output=True, text=True)
        m = re.search(r"version: (.+)", r.stdout + r.stderr)
        out["llama-server"] = "llama-server " + (m.group(1) if m else "unknown")
    if "llama-cpp-python" in peers:
        import llama_cpp
        out["llama-cpp-python"] = "llama-cpp-python " + llama_cpp.__version__
    return out


# --- the client ------------------------------------------------------------------------------------------------------

def request(port, method, path, body=None, timeout=60):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request(method, path, body=None if body is None else json.dumps(body).encode(),
                     headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


def chat(port, messages, max_tokens):
    """One streamed chat completion at temperature 0. Returns the reply's record: tokens, finish, times."""
    body = {"model": "any", "messages": messages, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    t0 = time.perf_counter()
    conn.request("POST", "/v1/chat/completions", body=json.dumps(body).encode(),
                 headers={"Content-Type": "application/json"})
    r = conn.getresponse()
    if r.status != 200:
        raise RuntimeError(f"[serve_compare] HTTP {r.status}: {r.read()[:300]!r}")
    first = last = None
    chunks, usage, finish, text, buf = 0, None, None, "", b""
    done = False
    while not done:
        data = r.read1(65536)
        if not data:
            break
        buf += data
        while b"\n\n" in buf:
            event, buf = buf.split(b"\n\n", 1)
            event = event.strip()
            if not event.startswith(b"data: "):
                continue
            payload = event[6:]
            if payload == b"[DONE]":
                done = True
                break
            c = json.loads(payload)
            if "error" in c:
                raise RuntimeError(f"[serve_compare] error event: {c['error']}")
            if c.get("usage"):
                usage = c["usage"]
            for choice in c.get("choices") or []:
                content = (choice.get("delta") or {}).get("content")
                if content:
                    now = time.perf_counter()
                    first = first if first is not None else now
                    last = now
                    chunks += 1
                    text += content
                if choice.get("finish_reason"):
                    finish = choice["finish_reason"]
    conn.close()
    t1 = time.perf_counter()
    # Without a usage chunk: a reply cut by the budget has max_tokens tokens; one that stopped, its content chunks
    # (one token each, or more where a chunk holds back a partial character).
    tokens = usage["completion_tokens"] if usage else max_tokens if finish == "length" else chunks
    return {"tokens": tokens, "chunks": chunks, "counted": "usage" if usage else "chunks", "finish": finish,
            "text": text,
            "start": t0, "first": first, "last": last, "end": t1}


def check_reply(rep, max_tokens, server):
    ok = (rep["finish"] == "length" and rep["tokens"] == max_tokens and 1 <= rep["chunks"] <= max_tokens) or \
         (rep["finish"] == "stop" and 0 <= rep["tokens"] <= max_tokens)
    if not ok or (rep["first"] is None and rep["tokens"] > 0):
        raise RuntimeError(f"[serve_compare] {server}: a reply with {rep['tokens']} tokens ({rep['counted']}) and "
                           f"finish_reason {rep['finish']!r}, asked for {max_tokens}")


def run_streams(port, n, a, server):
    """n threads, each sending a.requests chats one after the other. Returns the replies and the wall time."""
    replies, errors = [[] for _ in range(n)], []

    def worker(i):
        try:
            for j in range(a.requests):
                q = PROMPTS[(i + j * n) % len(PROMPTS)]
                replies[i].append(chat(port, [{"role": "user", "content": q}], a.max_tokens))
        except Exception as e:  # reported after the join
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    if errors:
        raise errors[0]
    flat = [r for rs in replies for r in rs]
    for r in flat:
        check_reply(r, a.max_tokens, server)
    return flat, wall


def measure_streams(s, n, a):
    cpu0 = cpu_seconds(s.proc.pid)
    replies, wall = run_streams(s.port, n, a, s.name)
    cores = (cpu_seconds(s.proc.pid) - cpu0) / wall
    tokens = sum(r["tokens"] for r in replies)
    per_stream = [(r["tokens"] - 1) / (r["last"] - r["first"]) for r in replies
                  if r["tokens"] > 1 and r["last"] > r["first"]]
    return {"tokens": tokens, "seconds": wall, "tokens_per_s": tokens / wall,
            "ttft_ms": 1e3 * statistics.median(r["first"] - r["start"] for r in replies if r["first"] is not None),
            "per_stream_tokens_per_s": statistics.median(per_stream) if per_stream else float("nan"),
            "cores": cores, "counted": sorted({r["counted"] for r in replies}),
            "stops": sum(r["finish"] == "stop" for r in replies), "replies": len(replies)}


def measure_prefix(s, a, salt):
    """A second turn's TTFT after its first turn (the prefix in the cache), and the same second turn recomputed."""
    system = f"Session {salt}. " + " ".join(SYSTEM_RULES)
    first = [{"role": "system", "content": system}, {"role": "user", "content": PROMPTS[0]}]
    r1 = chat(s.port, first, a.max_tokens)
    check_reply(r1, a.max_tokens, s.name)
    second = first + [{"role": "assistant", "content": r1["text"]}, {"role": "user", "content": "Say that again."}]
    cached = chat(s.port, second, 4)
    other = [dict(second[0], content=f"Other session {salt}. " + " ".join(SYSTEM_RULES))] + second[1:]
    recomputed = chat(s.port, other, 4)
    if cached["first"] is None or recomputed["first"] is None:
        raise RuntimeError(f"[serve_compare] {s.name}: a second turn without content (nothing to time)")
    return {"first_turn_ms": 1e3 * (r1["first"] - r1["start"]),
            "second_turn_ms": 1e3 * (cached["first"] - cached["start"]),
            "recomputed_ms": 1e3 * (recomputed["first"] - recomputed["start"])}


# --- main ------------------------------------------------------------------------------------------------------------

def main():
    a = parse()
    if a.gguf is None:
        sys.path.insert(0, os.path.join(ROOT, "tests", "python"))
        import smollm2
        a.gguf = str(smollm2.gguf_path())
    if not os.access(a.qkv, os.X_OK):
        sys.exit(f"[serve_compare] no qkv command at {a.qkv} (build the qkv_cli target, or give --qkv)")
    if "llama-server" in a.peers and not os.access(a.llama_server, os.X_OK):
        sys.exit(f"[serve_compare] no llama-server at {a.llama_server} (bench/build_llama_server.sh builds it, or "
                 "give --llama-server, or leave it out of --peers)")
    servers = ["qkv"] + a.peers
    parallel = max(a.streams)
    info = {"cpu": cpu_name(), "threads": a.threads, "gguf": os.path.basename(a.gguf), "max_tokens": a.max_tokens,
            "requests_per_stream": a.requests, "repeats": a.repeats, "versions": versions(a, a.peers)}
    print(f"# {info['cpu']}, {a.threads} threads, {info['gguf']}, max_tokens {a.max_tokens}, "
          f"{a.requests} requests per stream, {a.repeats} repeats", flush=True)
    runs = {s: {n: [] for n in a.streams} for s in servers}
    prefix = {s: [] for s in servers}
    for rep in range(a.repeats):
        for name in servers:
            s = start(name, a, a.gguf, parallel)
            try:
                chat(s.port, [{"role": "user", "content": "Hello!"}], 4)  # warm-up
                for n in a.streams:
                    m = measure_streams(s, n, a)
                    runs[name][n].append(m)
                    print(f"  repeat {rep + 1}: {name:17s} {n} streams: {m['tokens_per_s']:7.1f} tokens/s, TTFT "
                          f"{m['ttft_ms']:7.1f} ms, per stream {m['per_stream_tokens_per_s']:6.1f} tokens/s, "
                          f"{m['cores']:.2f} cores, {m['stops']} of {m['replies']} replies stopped early", flush=True)
                if not a.no_prefix:
                    p = measure_prefix(s, a, f"{rep}")
                    prefix[name].append(p)
                    print(f"  repeat {rep + 1}: {name:17s} second turn {p['second_turn_ms']:.1f} ms, recomputed "
                          f"{p['recomputed_ms']:.1f} ms", flush=True)
            finally:
                s.stop()

    med = lambda xs: statistics.median(xs) if xs else float("nan")  # noqa: E731
    summary = {}
    for name in servers:
        summary[name] = {n: {k: med([m[k] for m in runs[name][n]])
                             for k in ("tokens_per_s", "ttft_ms", "per_stream_tokens_per_s", "cores")}
                         for n in a.streams}
        for n in a.streams:
            summary[name][n]["counted"] = sorted({c for m in runs[name][n] for c in m["counted"]})
        if prefix[name]:
            summary[name]["prefix"] = {k: med([p[k] for p in prefix[name]]) for k in prefix[name][0]}

    print()
    print(f"CPU: {info['cpu']}; {a.threads} threads each; {info['gguf']}; chat completions at temperature 0, "
          f"max_tokens {a.max_tokens}, {a.requests} per stream; medians of {a.repeats}.")
    print("Servers: " + "; ".join(info["versions"].values()) + ".")
    print()
    print("| server | streams | total tokens/s | vs qkv | TTFT median (ms) | per-stream tokens/s | cores used |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for n in a.streams:
        base = summary["qkv"][n]["tokens_per_s"]
        for name in servers:
            m = summary[name][n]
            counted = "" if m["counted"] == ["usage"] else " (no usage: max_tokens, or chunks at a stop)"
            print(f"| {name}{counted} | {n} | {m['tokens_per_s']:.1f} | {m['tokens_per_s'] / base:.2f}x | "
                  f"{m['ttft_ms']:.1f} | {m['per_stream_tokens_per_s']:.1f} | {m['cores']:.2f} |")
    if len(a.streams) > 1:
        lo, hi = min(a.streams), max(a.streams)
        print()
        print(f"| server | {hi} streams / {lo} (total tokens/s) | qkv / server at {hi} streams |")
        print("|---|---:|---:|")
        for name in servers:
            ratio = summary[name][hi]["tokens_per_s"] / summary[name][lo]["tokens_per_s"]
            vs = summary["qkv"][hi]["tokens_per_s"] / summary[name][hi]["tokens_per_s"]
            print(f"| {name} | {ratio:.2f}x | {vs:.2f}x |")
    if not a.no_prefix:
        print()
        print("| server | first turn TTFT (ms) | second turn, prefix cached (ms) | recomputed (ms) | speed-up |")
        print("|---|---:|---:|---:|---:|")
        for name in servers:
            p = summary[name]["prefix"]
            print(f"| {name} | {p['first_turn_ms']:.1f} | {p['second_turn_ms']:.1f} | {p['recomputed_ms']:.1f} | "
                  f"{p['recomputed_ms'] / p['second_turn_ms']:.1f}x |")
    if a.json:
        os.makedirs(os.path.dirname(os.path.abspath(a.json)), exist_ok=True)
        with open(a.json, "w") as f:
            json.dump({"info": info, "summary": summary, "runs": runs, "prefix": prefix}, f, indent=1, default=str)


if __name__ == "__main__":
    main()
