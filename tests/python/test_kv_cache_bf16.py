"""The bfloat16 KV cache from Python and the command line: CausalLM.generate(..., kv_cache="bfloat16") on
SmolLM2-135M-Instruct's GGUF (its weights as stored) follows the float32 cache's greedy reply for its first tokens,
contiguous and paged;
`qkv generate --kv-cache bf16` runs; bad values are one-line errors.

The command is taken from $QKV_BIN, else <repo>/build/qkv."""
import os
import pathlib
import subprocess

import pytest

import qkv
import smollm2

REPO = pathlib.Path(__file__).resolve().parents[2]
QKV = os.environ.get("QKV_BIN", str(REPO / "build" / "qkv"))
CHAT = [{"role": "user", "content": "What is the capital of France?"}]
NEW = 24
# A greedy token can differ only where the float32 run's two most likely tokens lie closer than the rounding of the
# cached keys and values moves their logits (a relative change of at most 2^-9 per element, about 1e-2 of the
# logits at most, the C++ test's bound); once one token differs, the replies part. Such near ties are rare at the
# start of a reply, so the first 4 tokens must agree (a cache read wrongly changes the first token); the test
# prints how many do.
AGREE = 4


@pytest.fixture(scope="module")
def smol():
    path = smollm2.gguf_path()
    model = qkv.CausalLM.from_pretrained(path)
    tok = qkv.Tokenizer.from_pretrained(path)
    return model, tok, tok.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=True)


def leading_equal(a, b):
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


@pytest.mark.parametrize("page_size", [0, 16])
def test_greedy_reply_with_a_bf16_cache_follows_the_float32_one(smol, page_size):
    model, tok, prompt = smol
    fp = model.generate(prompt, NEW, eos_token_id=-1, page_size=page_size).tolist()
    bf = model.generate(prompt, NEW, eos_token_id=-1, page_size=page_size, kv_cache="bfloat16").tolist()
    same = leading_equal(fp, bf)
    print(f"page_size {page_size}: the first {same} of {NEW} greedy tokens equal")
    assert len(bf) == NEW
    assert same >= AGREE, (tok.decode(fp), tok.decode(bf))
    # float32 stays the default, bit for bit.
    assert model.generate(prompt, NEW, eos_token_id=-1, page_size=page_size, kv_cache="float32").tolist() == fp


def test_bad_kv_cache_is_a_value_error(smol):
    model, _, prompt = smol
    with pytest.raises(ValueError, match=r"kv_cache 'float16' is not one of 'float32', 'bfloat16'"):
        model.generate(prompt, 2, kv_cache="float16")


def test_cli_generate_takes_kv_cache():
    ids = "1,9690,198,504,3458,282,4649,314"
    env = dict(os.environ, OMP_NUM_THREADS="2")
    run = lambda *extra: subprocess.run(  # noqa: E731
        [QKV, "generate", "--model", str(smollm2.gguf_path()), "--prompt-ids", ids, "--max-new-tokens", "3", *extra],
        capture_output=True, text=True, env=env, timeout=300)
    fp, bf = run(), run("--kv-cache", "bf16")
    assert fp.returncode == 0 and bf.returncode == 0, (fp.stderr, bf.stderr)
    assert len(bf.stdout.strip().split(",")) == 3
    bad = run("--kv-cache", "f16")
    assert bad.returncode != 0
    lines = bad.stderr.strip().splitlines()
    assert len(lines) == 1 and "--kv-cache" in lines[0] and "f16" in lines[0], bad.stderr
