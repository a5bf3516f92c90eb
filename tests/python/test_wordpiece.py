"""qkv.WordPieceTokenizer against the tokenizer sentence-transformers runs for all-MiniLM-L6-v2 (HF tokenizers):
identical ids on ~600 varied and generated inputs, the same truncation, padding and mask, and clear errors."""
import os

import numpy as np
import pytest

import minilm_corpus as corpus
import qkv

MAX_LEN = 256  # sentence_bert_config.json's max_seq_length, what sentence-transformers truncates to


@pytest.fixture(scope="module")
def tok():
    return qkv.WordPieceTokenizer(os.path.join(corpus.model_dir(), "vocab.txt"))


def unpadded(ids, mask):
    return [row[m.astype(bool)].tolist() for row, m in zip(ids, mask)]


def first_difference(ours, ref, texts):
    for i, (a, b) in enumerate(zip(ours, ref)):
        if a != b:
            return f"text {i} {texts[i]!r}:\n  qkv {a}\n  ref {b}"
    return None


def test_ids_identical_to_reference_on_varied_and_generated_texts(tok):
    texts = corpus.tokenizer_sentences()
    assert len(texts) >= 500
    ids, mask = tok.encode(texts, MAX_LEN)
    ours = unpadded(ids, mask)
    ref = corpus.reference_ids(texts)
    assert len(ours) == len(ref)
    diff = first_difference(ours, ref, texts)
    assert diff is None, diff


def test_the_comparison_catches_a_single_changed_id(tok):
    texts = ["a man is eating food.", "a woman is playing violin."]
    ids, mask = tok.encode(texts, MAX_LEN)
    ours = unpadded(ids, mask)
    ours[1][2] += 1
    assert first_difference(ours, corpus.reference_ids(texts), texts) is not None


def test_vocab_file_matches_the_reference_tokenizer_vocab(tok):
    ref = corpus.reference_model().tokenizer.get_vocab()
    assert tok.vocab_size == len(ref)
    for token in ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "##ing", "the", "中"):
        assert tok.token_to_id(token) == ref[token]
    assert tok.token_to_id("certainly-not-a-token") == -1


@pytest.mark.parametrize("max_length", [2, 3, 8, 17, 128])
def test_truncation_keeps_cls_and_sep_like_reference(tok, max_length):
    texts = corpus.long_texts()[:2] + ["short one", "a b c d e f g h i j k l m n o p"]
    ref = corpus.reference_model().tokenizer(texts, truncation=True, max_length=max_length)["input_ids"]
    ids, mask = tok.encode(texts, max_length)
    assert unpadded(ids, mask) == ref
    assert ids.shape[1] <= max_length


def test_batch_is_right_padded_with_pad_id_and_mask(tok):
    texts = ["one", "a somewhat longer sentence here", ""]
    ids, mask = tok.encode(texts, MAX_LEN)
    ref = corpus.reference_model().tokenizer(texts, padding=True, truncation=True, max_length=MAX_LEN,
                                             return_tensors="np")
    assert ids.dtype == np.int64 and mask.dtype == np.int64
    np.testing.assert_array_equal(ids, ref["input_ids"])
    np.testing.assert_array_equal(mask, ref["attention_mask"])


def test_empty_batch_gives_empty_arrays(tok):
    ids, mask = tok.encode([], MAX_LEN)
    assert ids.shape == (0, 0) and mask.shape == (0, 0)


def test_word_over_100_chars_is_one_unk(tok):
    assert tok.tokenize("a" * 101) == ["[UNK]"]
    assert tok.tokenize("a" * 100) != ["[UNK]"]


def test_literal_special_token_stays_whole_but_lowercase_one_does_not(tok):
    assert tok.tokenize("x[MASK]y") == ["x", "[MASK]", "y"]
    assert tok.tokenize("[mask]") == ["[", "mask", "]"]


def test_normalizer_matches_reference_normalizer(tok):
    norm = corpus.reference_model().tokenizer.backend_tokenizer.normalizer
    for s in corpus.HANDWRITTEN + corpus.mark_soups(__import__("random").Random(3), 50):
        assert tok.normalize(s) == norm.normalize_str(s), repr(s)


def test_max_length_below_two_raises_naming_the_op(tok):
    with pytest.raises(ValueError, match=r"\[wordpiece\] max_length"):
        tok.encode(["x"], 1)


def test_missing_vocab_file_raises_naming_the_file(tmp_path):
    path = str(tmp_path / "nope.txt")
    with pytest.raises(RuntimeError, match=r"\[wordpiece\].*nope\.txt"):
        qkv.WordPieceTokenizer(path)


def test_vocab_without_special_tokens_raises(tmp_path):
    path = tmp_path / "vocab.txt"
    path.write_text("[PAD]\n[UNK]\n[CLS]\nhello\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"\[wordpiece\] the vocabulary has no separator token '\[SEP\]'"):
        qkv.WordPieceTokenizer(str(path))
