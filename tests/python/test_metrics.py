"""qkv's corpus BLEU / chrF (C++, include/qkv/eval/metrics.h) against sacrebleu 2.6.0.

Corpora: random sentences with the punctuation, digits, entities and Unicode whitespace the 13a rules treat
specially, and the real git catalogs (French with 13a, Simplified Chinese with the zh tokenizer) read with Python's
own gettext reader, with hypotheses damaged at random. Scores must agree to 1e-9 (both compute in double).
"""
import gettext
import os
import random

import pytest

sacrebleu = pytest.importorskip("sacrebleu")
from qkv import _qkv  # noqa: E402

TOL = 1e-9  # both sides compute the same double expressions; only summation order could differ

PIECES = ["the", "cat", "Sat", "on", "mat", "3.14", "2,5", "1990-2000", "well-known", "don't", "'quote'", "(x)",
          "a.b", "x,y", "end.", "wait,", "&amp;", "&lt;b&gt;", "<skipped>", "%s", "%d", "--force", "-n", "HEAD~1",
          "foo/bar", "a:b", "?", "!", "\u00e9t\u00e9", "\u00a0:", "\u2026", "\u201cq\u201d", "\u4e2d\u6587",
          "\u3002", "\uff1a", "\u2014", "\t", "\u3000", "-\n", "x\ny"]


def random_corpus(rng, n):
    hyps, refs = [], []
    for _ in range(n):
        ref = " ".join(rng.choice(PIECES) for _ in range(rng.randint(0, 12)))
        words = ref.split(" ")
        hyp = [w for w in words if rng.random() > 0.2]
        if hyp and rng.random() < 0.5:
            i, j = rng.randrange(len(hyp)), rng.randrange(len(hyp))
            hyp[i], hyp[j] = hyp[j], hyp[i]
        if rng.random() < 0.3:
            hyp.append(rng.choice(PIECES))
        hyps.append(" ".join(hyp))
        refs.append(ref)
    return hyps, refs


def damage(rng, text):
    words = text.split(" ")
    out = [w for w in words if rng.random() > 0.15]
    if out and rng.random() < 0.4:
        i = rng.randrange(len(out))
        out[i] = out[i][::-1]
    return " ".join(out)


def catalog_pairs(lang):
    path = f"/usr/share/locale/{lang}/LC_MESSAGES/git.mo"
    if not os.path.exists(path):
        pytest.skip(f"{path} is not installed")
    with open(path, "rb") as f:
        cat = gettext.GNUTranslations(f)._catalog
    pairs = []
    for key, val in cat.items():
        src = key[0] if isinstance(key, tuple) else key
        if src and val and "\n" not in src and "\n" not in val and "\x04" not in src:
            pairs.append((src, val))
    pairs.sort()
    return pairs[:1500]


def check(hyps, refs, tokenize):
    ref_bleu = sacrebleu.corpus_bleu(hyps, [refs], tokenize=tokenize)
    mine = _qkv.corpus_bleu(hyps, refs, tokenize)
    assert mine["sys_len"] == ref_bleu.sys_len
    assert mine["ref_len"] == ref_bleu.ref_len
    assert mine["counts"] == list(ref_bleu.counts)
    assert mine["totals"] == list(ref_bleu.totals)
    assert abs(mine["score"] - ref_bleu.score) <= TOL, (mine["score"], ref_bleu.score)
    ref_chrf = sacrebleu.corpus_chrf(hyps, [refs]).score
    assert abs(_qkv.corpus_chrf(hyps, refs) - ref_chrf) <= TOL, (_qkv.corpus_chrf(hyps, refs), ref_chrf)


def test_sacrebleu_version_is_pinned():
    assert sacrebleu.__version__ == "2.6.0"


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("tokenize", ["13a", "zh", "none"])
def test_random_corpora_match_sacrebleu(seed, tokenize):
    hyps, refs = random_corpus(random.Random(seed), 60)
    check(hyps, refs, tokenize)


@pytest.mark.parametrize("line", PIECES + [" ".join(PIECES), "a..b", "x,.,y", "1.-2", "&amp;amp;", " lead"])
def test_tokenizers_match_sacrebleu(line):
    from sacrebleu.tokenizers.tokenizer_13a import Tokenizer13a
    from sacrebleu.tokenizers.tokenizer_zh import TokenizerZh
    assert _qkv.tokenize_13a(line) == Tokenizer13a()(line)
    assert _qkv.tokenize_zh(line) == TokenizerZh()(line)


@pytest.mark.parametrize("lang,tokenize", [("fr", "13a"), ("zh_CN", "zh")])
def test_git_catalogs_match_sacrebleu(lang, tokenize):
    pairs = catalog_pairs(lang)
    rng = random.Random(1)
    refs = [t for _, t in pairs]
    hyps = [damage(rng, t) for t in refs]
    check(hyps, refs, tokenize)
    check(refs, refs, tokenize)  # perfect output scores 100 on both sides
    assert _qkv.corpus_bleu(refs, refs, tokenize)["score"] == pytest.approx(100.0)


def test_degenerate_corpora_match_sacrebleu():
    check(["", "a"], ["b", ""], "13a")
    check(["x"], ["x"], "13a")  # one token: no 2-grams at all
    with pytest.raises(ValueError, match=r"\[bleu\]"):
        _qkv.corpus_bleu(["a"], [], "13a")
    with pytest.raises(ValueError, match=r"unknown tokenizer"):
        _qkv.corpus_bleu(["a"], ["a"], "intl")
