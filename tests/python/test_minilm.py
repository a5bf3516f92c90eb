"""qkv.SentenceEncoder on the real all-MiniLM-L6-v2 against sentence-transformers on PyTorch 2.13: identical token
ids and embeddings within 1e-5 per component (cosine >= 0.99999) on ~240 varied sentences; clear folder errors."""
import os
import shutil

import numpy as np
import pytest

import minilm_corpus as corpus
import qkv
from minilm_corpus import texts  # noqa: F401 (the shared fixture)

MAX_ABS = 1e-5        # per component, on L2-normalised embeddings
MIN_COSINE = 0.99999


def compare(ours, ref):
    """(max abs difference, min cosine, index of the worst row)."""
    diff = np.abs(ours.astype(np.float64) - ref.astype(np.float64))
    cos = (ours * ref).sum(1) / (np.linalg.norm(ours, axis=1) * np.linalg.norm(ref, axis=1))
    return float(diff.max()), float(cos.min()), int(diff.max(1).argmax())


def within_tolerance(ours, ref):
    max_abs, min_cos, _ = compare(ours, ref)
    return max_abs <= MAX_ABS and min_cos >= MIN_COSINE


@pytest.fixture(scope="module")
def enc():
    return qkv.SentenceEncoder(corpus.model_dir())


@pytest.fixture(scope="module")
def reference(texts):
    return corpus.reference_model().encode(texts, batch_size=32, convert_to_numpy=True)


@pytest.fixture(scope="module")
def ours(enc, texts):
    return enc.encode(texts)


def test_folder_settings_are_the_reference_ones(enc):
    ref = corpus.reference_model()
    assert enc.max_seq_length == ref.max_seq_length == 256
    assert enc.embedding_dim == 384
    assert enc.normalizes


def test_token_ids_identical_for_every_sentence(enc, texts):
    ids, mask = enc.tokenize(texts)
    ours = [row[m.astype(bool)].tolist() for row, m in zip(ids, mask)]
    ref = corpus.reference_ids(texts)
    bad = [i for i in range(len(texts)) if ours[i] != ref[i]]
    assert not bad, f"{len(bad)} texts differ, first {texts[bad[0]]!r}: {ours[bad[0]]} vs {ref[bad[0]]}"


def test_embeddings_match_sentence_transformers(ours, reference, texts):
    assert ours.shape == reference.shape == (len(texts), 384)
    assert ours.dtype == np.float32
    max_abs, min_cos, worst = compare(ours, reference)
    print(f"\nall-MiniLM-L6-v2 on {len(texts)} sentences: max |diff| {max_abs:.2e}, min cosine {min_cos:.9f}")
    assert max_abs <= MAX_ABS, f"max |diff| {max_abs:.3e} on {texts[worst]!r}"
    assert min_cos >= MIN_COSINE, f"min cosine {min_cos:.9f}"


def test_tolerance_check_rejects_slightly_wrong_embeddings(ours, reference):
    assert within_tolerance(ours, reference)
    assert not within_tolerance(np.roll(ours, 1, axis=0), reference)  # rows swapped
    nudged = ours.copy()
    nudged[0, 0] += 3 * MAX_ABS
    assert not within_tolerance(nudged, reference)


@pytest.mark.parametrize("batch_size", [1, 7, 1000])
def test_batching_does_not_change_results(enc, texts, ours, batch_size):
    subset = texts[:24]
    np.testing.assert_allclose(enc.encode(subset, batch_size=batch_size), ours[:24], rtol=0, atol=1e-6)


def test_embeddings_are_unit_length_and_semantic(enc):
    e = enc.encode(["A man is eating food.", "A man is eating a piece of bread.", "A man is riding a horse."])
    np.testing.assert_allclose(np.linalg.norm(e, axis=1), 1.0, atol=1e-6)
    assert e[0] @ e[1] > e[0] @ e[2] + 0.2


def test_empty_list_gives_zero_rows(enc):
    assert enc.encode([]).shape == (0, 384)


def test_batch_size_zero_raises(enc):
    with pytest.raises(ValueError, match=r"\[SentenceEncoder\] batch_size"):
        enc.encode(["x"], batch_size=0)


# --- broken model folders: one line naming what is wrong ------------------------------------------------------

def folder_copy(tmp_path, skip=()):
    """A copy of the model folder with symlinks for every file except `skip`."""
    src = corpus.model_dir()
    dst = tmp_path / "model"
    for root, _, names in os.walk(src):
        rel = os.path.relpath(root, src)
        os.makedirs(dst / rel, exist_ok=True)
        for name in names:
            path = os.path.normpath(os.path.join(rel, name))
            if path not in skip:
                os.symlink(os.path.join(root, name), dst / path)
    return dst


def test_missing_folder_names_it(tmp_path):
    with pytest.raises(ValueError, match=r"^\[SentenceEncoder\] model folder .*nowhere does not exist$"):
        qkv.SentenceEncoder(str(tmp_path / "nowhere"))


@pytest.mark.parametrize("name", ["config.json", "vocab.txt", "model.safetensors"])
def test_missing_file_names_it(tmp_path, name):
    d = folder_copy(tmp_path, skip=(name,))
    with pytest.raises(ValueError, match=rf"^\[SentenceEncoder\] model folder .* has no {name}$"):
        qkv.SentenceEncoder(str(d))


def test_missing_pooling_config_names_it(tmp_path):
    d = folder_copy(tmp_path, skip=("1_Pooling/config.json",))
    with pytest.raises(ValueError, match=r"has no .*1_Pooling/config\.json"):
        qkv.SentenceEncoder(str(d))


def test_broken_config_json_names_the_file(tmp_path):
    d = folder_copy(tmp_path, skip=("config.json",))
    (d / "config.json").write_text('{"hidden_size": 384,', encoding="utf-8")
    with pytest.raises(ValueError, match=r"config\.json is not valid JSON"):
        qkv.SentenceEncoder(str(d))


def test_truncated_weights_name_the_file(tmp_path):
    d = folder_copy(tmp_path, skip=("model.safetensors",))
    with open(os.path.join(corpus.model_dir(), "model.safetensors"), "rb") as f:
        (d / "model.safetensors").write_bytes(f.read(4096))
    with pytest.raises(ValueError, match=r"model\.safetensors"):
        qkv.SentenceEncoder(str(d))


def test_missing_weight_names_the_tensor(tmp_path):
    from safetensors.numpy import load_file, save_file

    d = folder_copy(tmp_path, skip=("model.safetensors",))
    weights = load_file(os.path.join(corpus.model_dir(), "model.safetensors"))
    del weights["encoder.layer.3.attention.self.key.bias"]
    save_file(weights, str(d / "model.safetensors"))
    with pytest.raises(ValueError, match=r"no tensor 'encoder\.layer\.3\.attention\.self\.key\.bias'"):
        qkv.SentenceEncoder(str(d))


def test_unsupported_pooling_is_refused(tmp_path):
    d = folder_copy(tmp_path, skip=("1_Pooling/config.json",))
    (d / "1_Pooling" / "config.json").write_text(
        '{"word_embedding_dimension": 384, "pooling_mode_cls_token": true, "pooling_mode_mean_tokens": false}',
        encoding="utf-8")
    with pytest.raises(ValueError, match=r"only mean pooling is supported"):
        qkv.SentenceEncoder(str(d))


def test_folder_copy_without_changes_loads(tmp_path):
    d = folder_copy(tmp_path)
    e = qkv.SentenceEncoder(str(d)).encode(["hello"])
    assert e.shape == (1, 384)
    shutil.rmtree(d)
