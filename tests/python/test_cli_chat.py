"""`qkv generate --prompt`, `qkv chat` and `qkv info --model` on the real SmolLM2-135M-Instruct (Q4_1 GGUF, fp32):
the chat reply to a question is English and right, and its ids are transformers' greedy ids on the same model's HF
folder; plain completion matches transformers too; chat keeps a history, /reset forgets it, Ctrl-C stops a reply and
the program goes on, end of input exits 0, the end of the context is one clear line; info names the model's parts.

Transformers runs once, in a background process started with the module, while the qkv commands run.
The command is taken from $QKV_BIN, else <repo>/build/qkv."""
import json
import os
import pathlib
import pty
import select
import signal
import subprocess
import sys
import time

import pytest

import smollm2

REPO = pathlib.Path(__file__).resolve().parents[2]
QKV = os.environ.get("QKV_BIN", str(REPO / "build" / "qkv"))
GGUF = str(smollm2.gguf_path())
QUESTION = "What is the capital of France?"
COMPLETION = "The capital of France is"
EMOJI = "Reply with three emoji."  # 4-byte UTF-8 characters, split across byte-level tokens
N_CHAT, N_PLAIN, N_EMOJI = 20, 12, 16

# Greedy generate at float32, the prompt tokenized by transformers itself (apply_chat_template for the chat).
HF_SCRIPT = r"""
import json, sys, torch, transformers
torch.set_num_threads(1)
path, question, completion, emoji = sys.argv[1:5]
n_chat, n_plain, n_emoji = map(int, sys.argv[5:8])
tok = transformers.AutoTokenizer.from_pretrained(path)
model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
def new_ids(ids, n):
    ids = torch.tensor([ids])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False)
    return out[0, ids.shape[1]:].tolist()
def chat_ids(text):
    chat = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False)
    return tok(chat, add_special_tokens=False).input_ids
plain = new_ids(tok(completion).input_ids, n_plain)
emoji = new_ids(chat_ids(emoji), n_emoji)
print(json.dumps({"chat": new_ids(chat_ids(question), n_chat), "eos": model.generation_config.eos_token_id,
                  "plain": plain, "plain_text": tok.decode(plain, skip_special_tokens=True),
                  "emoji": emoji, "emoji_text": tok.decode(emoji, skip_special_tokens=True)}))
"""


@pytest.fixture(scope="module")
def hf_reference():
    """Starts transformers at once; the first test that reads it waits for its answer."""
    proc = subprocess.Popen([sys.executable, "-c", HF_SCRIPT, str(smollm2.hf_folder()), QUESTION, COMPLETION, EMOJI,
                             str(N_CHAT), str(N_PLAIN), str(N_EMOJI)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    result = {}

    def get():
        if not result:
            out, err = proc.communicate(timeout=300)
            assert proc.returncode == 0, err
            result.update(json.loads(out.strip().splitlines()[-1]))
        return result
    yield get
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def qkv(*args, stdin=None, timeout=300):
    """The command; generate and chat at --precision fp32 unless told otherwise, so that their ids are comparable
    with transformers' float32 run on the same file (the default, stored, runs the GGUF's Q4_1 weights)."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    if args and args[0] in ("generate", "chat") and "--precision" not in args:
        args = (args[0], "--precision", "fp32", *args[1:])
    return subprocess.run([QKV, *args], input=stdin, capture_output=True, text=True, env=env, timeout=timeout)


def ok(r):
    assert r.returncode == 0, f"exit {r.returncode}\nstdout:\n{r.stdout}\nstderr:\n{r.stderr}"
    return r


def one_line_error(r, needle):
    assert r.returncode != 0, r.stdout
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got:\n{r.stderr}"
    assert lines[0].startswith("qkv: error: "), lines[0]
    assert needle in lines[0], f"'{needle}' not in: {lines[0]}"


def ids_of(text):
    return [int(x) for x in text.strip().split(",")] if text.strip() else []


# --- generate --------------------------------------------------------------------------------------------------------

def test_chat_reply_is_paris_with_transformers_greedy_ids(hf_reference):
    text = ok(qkv("generate", "--model", GGUF, "--prompt", QUESTION, "--chat", "--max-new-tokens", str(N_CHAT)))
    assert text.stdout.endswith("\n") and "Paris" in text.stdout, text.stdout
    ids = ok(qkv("generate", "--model", GGUF, "--prompt", QUESTION, "--chat", "--max-new-tokens", str(N_CHAT),
                 "--print-ids"))
    ref = hf_reference()
    # transformers keeps the eos it stopped at; qkv stops before it.
    want = ref["chat"][:-1] if ref["chat"] and ref["chat"][-1] == ref["eos"] else ref["chat"]
    assert ids_of(ids.stdout) == want
    assert len(want) >= 5


def test_default_precision_runs_the_stored_q4_1_weights():
    # --precision stored (the default): the GGUF's Q4_1 / Q8_0 blocks read in place, int8 activations per 32, the
    # same ids as the Python module's CausalLM at precision=None. (Its first token need not be fp32's: on this prompt
    # fp32's "The" leads "L" by 0.09 logits, which the 4-bit weights reverse.)
    import qkv as qkv_module
    r = ok(qkv("generate", "--precision", "stored", "--model", GGUF, "--prompt", QUESTION, "--chat",
               "--max-new-tokens", "8", "--print-ids"))
    tok = qkv_module.Tokenizer.from_pretrained(GGUF)
    prompt = tok.apply_chat_template([{"role": "user", "content": QUESTION}], add_generation_prompt=True,
                                     tokenize=True)
    want = [int(x) for x in qkv_module.CausalLM.from_pretrained(GGUF).generate(prompt, 8)]
    got = ids_of(r.stdout)
    assert got and got == [x for x in want if x not in (0, 2)][:len(got)], (got, want)
    one_line_error(qkv("generate", "--precision", "fp16", "--model", GGUF, "--prompt", "x"), "fp16")


def test_plain_completion_matches_transformers(hf_reference):
    r = ok(qkv("generate", "--model", GGUF, "--prompt", COMPLETION, "--max-new-tokens", str(N_PLAIN)))
    ref = hf_reference()
    assert len(ref["plain"]) == N_PLAIN  # no stop id in these tokens: both run to the length
    assert r.stdout == ref["plain_text"] + "\n"


def test_streamed_text_is_whole_utf8_as_transformers_decodes_it(hf_reference):
    # The reply is cut by the length inside an emoji: the held-back bytes end as U+FFFD, as in transformers' decode.
    r = subprocess.run([QKV, "generate", "--precision", "fp32", "--model", GGUF, "--prompt", EMOJI, "--chat",
                        "--max-new-tokens",
                        str(N_EMOJI)], capture_output=True, env=dict(os.environ, OMP_NUM_THREADS="1"), timeout=300)
    assert r.returncode == 0, r.stderr
    text = r.stdout.decode("utf-8")  # strict: a stray byte fails here
    ref = hf_reference()
    assert len(ref["emoji"]) == N_EMOJI and ref["eos"] not in ref["emoji"]
    assert text == ref["emoji_text"] + "\n"
    assert any(ord(ch) > 0xFFFF for ch in text), text
    assert text.endswith("\ufffd\n"), text  # the case the test is for: the last emoji's bytes incomplete


def test_context_end_cuts_the_reply_with_a_warning():
    # COMPLETION is 5 tokens: a context of 8 leaves room for 3.
    r = ok(qkv("generate", "--model", GGUF, "--prompt", COMPLETION, "--print-ids", "--ctx", "8"))
    assert len(ids_of(r.stdout)) == 3
    assert "the reply was cut at the end of the context (8 positions)" in r.stderr


def test_generate_errors_are_one_line():
    one_line_error(qkv("generate", "--model", GGUF), "--prompt TEXT, or --prompt-ids")
    one_line_error(qkv("generate", "--model", GGUF, "--prompt", "x", "--prompt-ids", "1"), "excludes")
    one_line_error(qkv("generate", "--model", GGUF, "--prompt-ids", "1", "--chat"), "--chat requires --prompt")
    one_line_error(qkv("generate", "--model", GGUF, "--prompt", "x", "--system", "s"), "--system requires --chat")
    one_line_error(qkv("generate", "--model", GGUF, "--prompt", "x", "--top-k", "5"), "needs --temperature > 0")
    one_line_error(qkv("generate", "--model", GGUF, "--prompt", "x", "--beam", "2"), "--beam takes --prompt-ids")
    one_line_error(qkv("generate", "--model", GGUF, "--prompt", ""), "encodes to no token")
    one_line_error(qkv("generate", "--model", GGUF, "--prompt", "x", "--eos", "49152"), "--eos 49152")
    one_line_error(qkv("generate", "--model", GGUF, "--prompt", COMPLETION, "--ctx", "5"),
                   "fills the context of 5 positions")
    one_line_error(qkv("generate", "--model", "/nonexistent.gguf", "--prompt", "x"), "/nonexistent.gguf")


# --- chat -------------------------------------------------------------------------------------------------------------

def read_until(fd, marker, timeout=120):
    """Bytes from the pty until `marker` appears at the end (the chat's prompt); fails on timeout or exit."""
    data = b""
    end = time.monotonic() + timeout
    while not data.endswith(marker):
        left = end - time.monotonic()
        assert left > 0, f"no {marker!r} after:\n{data.decode(errors='replace')}"
        ready, _, _ = select.select([fd], [], [], left)
        if ready:
            try:
                chunk = os.read(fd, 4096)
            except OSError:
                chunk = b""
            assert chunk, f"the chat ended; output:\n{data.decode(errors='replace')}"
            data += chunk
    return data.decode(errors="replace")


def test_chat_on_a_terminal_keeps_history_resets_and_survives_ctrl_c():
    master, slave = pty.openpty()
    proc = subprocess.Popen([QKV, "chat", "--precision", "fp32", "--model", GGUF, "--max-new-tokens", "200"],
                            stdin=slave, stdout=slave,
                            stderr=slave, env=dict(os.environ, OMP_NUM_THREADS="1"))
    os.close(slave)
    try:
        banner = read_until(master, b"> ")
        assert "/reset" in banner and "Ctrl-C" in banner

        def turn(line):
            os.write(master, line.encode() + b"\n")
            return read_until(master, b"> ")

        assert "Paris" in turn(QUESTION)
        # The second answer needs the first turn: alone, "And of Germany?" gets no capital (checked after /reset).
        assert "Berlin" in turn("And of Germany?")
        assert "the conversation is cleared" in turn("/reset")
        assert "Berlin" not in turn("And of Germany?")

        # Ctrl-C while the reply streams: the reply stops, the prompt comes back, the program keeps running.
        os.write(master, b"Write a long story about a dragon and a knight.\n")
        seen = b""
        while len(seen.split(b"\n", 1)[-1].strip()) < 3:  # past the echoed line: a few bytes of the reply
            ready, _, _ = select.select([master], [], [], 120)
            assert ready, seen
            seen += os.read(master, 4096)
        proc.send_signal(signal.SIGINT)
        after = read_until(master, b"> ")
        assert "reply stopped" in after
        assert proc.poll() is None
        assert "Paris" in turn(QUESTION)

        # Ctrl-C at the prompt ends the program (130, as a shell reports an interrupt).
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 130
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)


def test_chat_on_piped_lines_and_the_end_of_the_context():
    # The default system prompt and the question take 37 tokens: a context of 40 cuts the first reply, and the
    # second turn no longer fits. End of input exits 0.
    r = ok(qkv("chat", "--model", GGUF, "--ctx", "40", stdin=f"{QUESTION}\nAnd of Germany?\n"))
    assert len(r.stdout.splitlines()) == 1 and r.stdout.strip(), r.stdout
    notes = r.stderr.strip().splitlines()
    assert notes[0] == "qkv: the reply was cut at the end of the context of 40 tokens: /reset starts a new conversation"
    assert notes[1].startswith("qkv: the conversation no longer fits the context of 40 tokens (")
    assert notes[1].endswith("tokens with this message): /reset starts a new one")
    assert len(notes) == 2
    # /exit ends the input early; blank lines are no turn.
    r = ok(qkv("chat", "--model", GGUF, "--max-new-tokens", "1", stdin="\n  \n/exit\nnot read\n"))
    assert r.stdout == "" and r.stderr == ""


def test_chat_errors_are_one_line(tmp_path):
    one_line_error(qkv("chat"), "--model is required")
    one_line_error(qkv("chat", "--model", GGUF, "--top-p", "0.5"), "needs --temperature > 0")
    one_line_error(qkv("chat", "--model", str(tmp_path / "none")), "does not exist")


# --- info -------------------------------------------------------------------------------------------------------------

def info_fields(stdout):
    return dict(line.split(": ", 1) for line in stdout.strip().splitlines())


def test_info_names_the_model_of_a_gguf_file_and_a_folder():
    gguf = info_fields(ok(qkv("info", "--model", GGUF)).stdout)
    folder = info_fields(ok(qkv("info", "--model", str(smollm2.hf_folder()))).stdout)
    for f in (gguf, folder):
        assert f["architecture"] == "llama"
        assert f["layers"] == "30"
        assert f["hidden"] == "576 (mlp 1536)"
        assert f["heads"] == "9, kv heads: 3, head_dim: 64"
        assert f["vocab"] == "49152"
        assert f["context"] == "8192"
        assert f["rope"] == "theta 100000, scaling default"
        assert f["tokenizer"].startswith("49152 tokens, byte-level BPE")
        assert f["bos"] == "1 <|im_start|>" and f["eos"] == "2 <|im_end|>"
        assert f["chat template"].startswith("yes")
    assert "GGUF v3, 272 tensors" in gguf["model"]
    assert gguf["weights"] == "F32 x 61, Q4_1 x 210, Q8_0 x 1"
    assert gguf["stop ids"] == "0 <|endoftext|>, 2 <|im_end|>"
    assert folder["weights"] == "F32 x 272"
    assert folder["stop ids"] == "2 <|im_end|>"
    plain = ok(qkv("info")).stdout
    assert "attention kernels" in plain and "architecture" not in plain


def test_info_errors_are_one_line(tmp_path):
    one_line_error(qkv("info", "--model", str(tmp_path / "none")), "does not exist")
    one_line_error(qkv("info", "--model", str(tmp_path)), "config.json")
