"""`qkv embed` and `qkv search` with the real all-MiniLM-L6-v2: the numbers equal qkv.SentenceEncoder's, stdin and
--json work, search ranks the related line first, and a broken model folder is one line on stderr."""
import json
import os
import subprocess

import numpy as np
import pytest

import minilm_corpus as corpus
import qkv


def cli_path():
    # The module is built into <build>/python/qkv; the command sits at <build>/qkv.
    build = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(qkv.__file__))))
    path = os.path.join(build, "qkv")
    assert os.path.isfile(path), f"the qkv command was not built next to the module: {path}"
    return path


def run(*args, stdin=None):
    env = dict(os.environ, OMP_NUM_THREADS="2")
    return subprocess.run([cli_path(), *args], input=stdin, capture_output=True, text=True, env=env, timeout=300)


@pytest.fixture(scope="module")
def enc():
    return qkv.SentenceEncoder(corpus.model_dir())


TEXTS = ["A man is eating food.", "Ça va? 你好 🙂", ""]


def test_embed_prints_one_line_per_text_equal_to_the_module(enc):
    r = run("embed", "--model", corpus.model_dir(), *TEXTS[:2])
    assert r.returncode == 0, r.stderr
    got = np.array([[float(x) for x in line.split()] for line in r.stdout.splitlines()], dtype=np.float32)
    np.testing.assert_allclose(got, enc.encode(TEXTS[:2]), rtol=0, atol=1e-7)


def test_embed_reads_stdin_lines_and_writes_json(enc):
    r = run("embed", "--model", corpus.model_dir(), "--json", stdin="\n".join(TEXTS) + "\n")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert [d["text"] for d in doc] == TEXTS
    np.testing.assert_allclose(np.array([d["embedding"] for d in doc], dtype=np.float32), enc.encode(TEXTS),
                               rtol=0, atol=1e-7)


def test_json_escapes_quotes_and_control_characters():
    text = 'say "hi"\\ \t tab'
    r = run("embed", "--model", corpus.model_dir(), "--json", text)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)[0]["text"] == text


def test_search_ranks_the_related_line_first(tmp_path):
    f = tmp_path / "corpus.txt"
    f.write_text("\n".join(corpus.HANDWRITTEN[:16]) + "\n\n", encoding="utf-8")
    r = run("search", "--model", corpus.model_dir(), "--corpus", str(f), "-k", "2", "forgot my login")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == 2
    assert lines[0].endswith("How do I reset my password?")
    assert float(lines[0].split()[0]) > float(lines[1].split()[0])


def test_broken_model_folder_is_one_line_naming_it(tmp_path):
    r = run("embed", "--model", str(tmp_path / "missing"), "x")
    assert r.returncode == 2
    assert r.stdout == ""
    assert r.stderr.count("\n") == 1 and "missing does not exist" in r.stderr


def test_missing_corpus_file_is_one_line_naming_it(tmp_path):
    r = run("search", "--model", corpus.model_dir(), "--corpus", str(tmp_path / "none.txt"), "q")
    assert r.returncode == 2
    assert r.stderr.strip() == f"qkv: error: [search] cannot read corpus file {tmp_path / 'none.txt'}"
