"""qkv.Tokenizer against Hugging Face `tokenizers` (and transformers' AutoTokenizer): the ids of encode() and the text
of decode() must be equal, on a corpus of scripts, digits, whitespace, code, emoji, combining marks and special-looking
text. Models: SmolLM2 (its real GGUF and tokenizer.json), and small Llama 3, Qwen 2 and SentencePiece (Llama 2 style)
tokenizers trained here with the `tokenizers` trainers, each also written as a GGUF with the `gguf` package."""
import json
import pathlib

import gguf
import pytest
import tokenizers
from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers, processors, trainers

import qkv
from smollm2 import gguf_path, hf_folder

CORPUS = [
    "",
    " ",
    "Hello world",
    "Hello, world! How's it going? I'M fine, you'LL see; they'd've known.",
    "你好，世界！今天天气很好。我们去公园散步吧。",
    "こんにちは世界、カタカナとひらがなと漢字。",
    "안녕하세요 세계, 반갑습니다.",
    "مرحبا بالعالم، كيف حالك اليوم؟",
    "नमस्ते दुनिया, आप कैसे हैं? क्षत्रिय",
    "Привет, мир! Как дела? Ёлка и щи.",
    "Γειά σου Κόσμε. สวัสดีชาวโลก",
    "12345678901234567890",
    "3.14159 and 2,718,281 and -0.5e-10",
    "year 2024: 1 22 333 4444 55555 666666",
    "x  1   22 ٣٤٥ ١٢ ५६७ Ⅻ ½ ²³",
    "a  b   c    d",
    "   leading spaces",
    "trailing spaces   ",
    "tab\there\t\tand\t",
    "line1\nline2\r\nline3\n\n\nend\n",
    "\n\n",
    " \n ",
    "mixed \t \n  \u3000 ideographic\u3000\u3000space \u00a0nbsp\u00a0\u00a0 \u180e\u180emongolian \u2028\u2029",
    "def f(x):\n    return x**2  # square\n\n\tpass\n",
    "for (int i = 0; i < n; ++i) { a[i] += b[i] * 2; }",
    '<div class="x">&amp; &lt;tag&gt;</div> https://example.com/path?q=1&r=2',
    "I \u2764\ufe0f \U0001F355! \U0001F468\u200d\U0001F469\u200d\U0001F467\u200d\U0001F466 family "
    "\U0001F3F3\ufe0f\u200d\U0001F308 \U0001F44D\U0001F3FD",
    "e\u0301 caf\u00e9 (cafe\u0301) A\u030a \u00c5 Z\u0335\u0321\u0322\u031ba\u0337l\u0338g\u0336o\u0334",
    "\ufb01 ligature, \u212b angstrom, \u2126 ohm, \u1e9b\u0323",
    "<|im_start|>user\nhi there<|im_end|>\n<|im_start|>assistant\n",
    "text <|endoftext|> more<|endoftext|><|endoftext|>",
    "<s>[INST] hi [/INST]</s> and </s><s>",
    "< |im_start| > <|im_start <|im_start|><|im_start|>",
    "\x00\x01\x1f control \x7f\x80\x9f c1",
    "\ufffd replacement \U0010FFFF private \ufeffbom zero\u200bwidth\u200djoiner",
    "'s 'S '\u017f don't WON'T it's",
    "The quick brown fox jumps over the lazy dog. " * 6,
]

# Training text for the small tokenizers: the corpus and some plain prose, so that merges form across scripts.
TRAIN = CORPUS * 3 + [
    "The history of tokenization is the history of compression: frequent pairs become single symbols.",
    "Machine learning models read numbers like 1024, 2048 and 4096 in pieces.",
    "Большие языковые модели читают текст по частям. 大型语言模型按片段读取文本。",
    "    indented code\n        more indented\n",
] * 5


def hf_ids(tok, text, add_special_tokens=True):
    return tok.encode(text, add_special_tokens=add_special_tokens).ids


def assert_same(ours, hf, texts=CORPUS):
    """encode (both add_special_tokens), decode (both skip_special_tokens) and the stream decoder, text by text."""
    for text in texts:
        for add in (True, False):
            want = hf_ids(hf, text, add)
            assert ours.encode(text, add_special_tokens=add) == want, (text, add)
        ids = hf_ids(hf, text)
        for skip in (False, True):
            assert ours.decode(ids, skip_special_tokens=skip) == hf.decode(ids, skip_special_tokens=skip), (text, skip)
        stream = ours.decode_stream()
        pieces = [stream.step(i) for i in ids] + [stream.flush()]
        assert "".join(pieces) == hf.decode(ids, skip_special_tokens=False), text
        assert all("\ufffd" not in p for p in pieces) or "\ufffd" in text, (text, pieces)
    assert ours.convert_ids_to_tokens(list(range(ours.vocab_size))) == [
        hf.id_to_token(i) for i in range(ours.vocab_size)]


# --- SmolLM2: the real files ------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def smol_json():
    return hf_folder() / "tokenizer.json"


def smollm2_reference(tmp_path, smol_json):
    """SmolLM2's own tokenizer.json (HuggingFaceTB): the folder's file with its pre-tokenizer, Digits(individual) then
    ByteLevel, which the GGUF's tokenizer.ggml.pre 'smollm' names. transformers' GGUF conversion (the folder's file)
    keeps ByteLevel alone."""
    doc = json.loads(smol_json.read_text(encoding="utf-8"))
    doc["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Digits", "individual_digits": True},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}]}
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(doc, ensure_ascii=False), encoding="utf-8")
    return path


def test_smollm2_tokenizer_json_matches_tokenizers_and_autotokenizer(smol_json):
    import transformers
    hf = tokenizers.Tokenizer.from_file(str(smol_json))
    ours = qkv.Tokenizer.from_pretrained(smol_json)
    assert_same(ours, hf)
    auto = transformers.AutoTokenizer.from_pretrained(str(smol_json.parent))
    for text in CORPUS:
        assert ours.encode(text) == auto.encode(text), text
        ids = auto.encode(text)
        assert ours.decode(ids) == auto.decode(ids), text
        assert ours.decode(ids, skip_special_tokens=True) == auto.decode(ids, skip_special_tokens=True), text
    assert ours.vocab_size == len(auto) == 49152
    assert (ours.bos_token_id, ours.eos_token_id) == (auto.bos_token_id, auto.eos_token_id) == (1, 2)
    # The folder itself and a str path load the same tokenizer.
    assert qkv.Tokenizer.from_pretrained(str(smol_json.parent)).encode(CORPUS[3]) == ours.encode(CORPUS[3])


def test_smollm2_gguf_matches_smollm2_tokenizer_json(tmp_path, smol_json):
    hf = tokenizers.Tokenizer.from_file(str(smollm2_reference(tmp_path, smol_json)))
    ours = qkv.Tokenizer.from_pretrained(gguf_path())
    assert_same(ours, hf)
    assert (ours.bos_token_id, ours.eos_token_id, ours.vocab_size) == (1, 2, 49152)
    # Without the digit split the two differ only where a digit follows a run of spaces.
    lossy = tokenizers.Tokenizer.from_file(str(smol_json))
    differ = [t for t in CORPUS if ours.encode(t) != hf_ids(lossy, t)]
    assert differ and all(any(c.isdigit() for c in t) for t in differ), differ


def test_smollm2_decode_of_partial_bytes_and_stream_holds_them_back(smol_json):
    hf = tokenizers.Tokenizer.from_file(str(smol_json))
    ours = qkv.Tokenizer.from_pretrained(smol_json)
    ids = hf_ids(hf, "你好 \U0001F468\u200d\U0001F469")
    assert len(ids) > 3
    for i in range(len(ids)):  # every single token, including the ones that end inside a character
        assert ours.decode([ids[i]]) == hf.decode([ids[i]], skip_special_tokens=False)
        assert ours.decode(ids[:i + 1]) == hf.decode(ids[:i + 1], skip_special_tokens=False)
    stream = ours.decode_stream()
    pieces = [stream.step(i) for i in ids]
    assert "\ufffd" not in "".join(pieces) and "".join(pieces) + stream.flush() == "你好 \U0001F468\u200d\U0001F469"
    assert pieces[0] == "" or pieces[0] == "你"  # a character cut by a byte token is held back
    # A lone lead byte flushed at the end is U+FFFD, as decode gives it.
    stream = ours.decode_stream()
    assert stream.step(ids[0]) == "" and stream.flush() == hf.decode([ids[0]])


# --- small byte-level tokenizers: Llama 3 and Qwen 2 ------------------------------------------------------------

LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
          r"|\s+(?!\S)|\s+")
QWEN2 = LLAMA3.replace(r"\p{N}{1,3}", r"\p{N}")


def train_byte_level(pattern, specials, bos, ignore_merges, path):
    tok = tokenizers.Tokenizer(models.BPE(ignore_merges=ignore_merges))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=900, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(TRAIN, trainer)
    if bos is not None:
        tok.post_processor = processors.Sequence([
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(single=f"{bos} $A", special_tokens=[(bos, tok.token_to_id(bos))])])
    tok.save(str(path))
    return tok


def write_gguf(path, model, pre, tokens, types, merges=None, scores=None, bos=None, eos=None, add_bos=None):
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tokenizer_model(model)
    if pre is not None:
        w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    if merges is not None:
        w.add_token_merges(merges)
    if scores is not None:
        w.add_token_scores(scores)
    if bos is not None:
        w.add_bos_token_id(bos)
    if eos is not None:
        w.add_eos_token_id(eos)
    if add_bos is not None:
        w.add_add_bos_token(add_bos)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def byte_level_gguf(tok, path, pre, bos, eos, add_bos):
    doc = json.loads(tok.to_str())
    vocab = doc["model"]["vocab"]
    tokens = [None] * tok.get_vocab_size()
    for t, i in vocab.items():
        tokens[i] = t
    specials = {a["id"] for a in doc["added_tokens"]}
    types = [3 if i in specials else 1 for i in range(len(tokens))]
    merges = [m if isinstance(m, str) else " ".join(m) for m in doc["model"]["merges"]]
    write_gguf(path, "gpt2", pre, tokens, types, merges=merges, bos=bos, eos=eos, add_bos=add_bos)


@pytest.mark.parametrize("name", ["llama3", "qwen2"])
def test_small_byte_level_tokenizers_match_tokenizers(tmp_path, name):
    if name == "llama3":
        specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>", "<|im_start|>"]
        hf = train_byte_level(LLAMA3, specials, "<|begin_of_text|>", True, tmp_path / "tokenizer.json")
        bos, eos, pre = 0, 1, "llama-bpe"
    else:
        specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
        hf = train_byte_level(QWEN2, specials, None, False, tmp_path / "tokenizer.json")
        bos, eos, pre = None, 0, "qwen2"
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": specials[0] if bos is not None else None, "eos_token": specials[eos]}), encoding="utf-8")
    ours = qkv.Tokenizer.from_pretrained(tmp_path)
    assert_same(ours, hf)
    assert (ours.bos_token_id, ours.eos_token_id) == (bos, eos)
    byte_level_gguf(hf, tmp_path / "t.gguf", pre, bos, eos, bos is not None)
    from_gguf = qkv.Tokenizer.from_pretrained(tmp_path / "t.gguf")
    assert_same(from_gguf, hf)
    assert ours.all_special_ids == from_gguf.all_special_ids == list(range(len(specials)))


def test_qwen2_splits_digits_one_by_one_and_llama3_by_three(tmp_path):
    q = train_byte_level(QWEN2, ["<|endoftext|>"], None, False, tmp_path / "q.json")
    ours = qkv.Tokenizer.from_pretrained(tmp_path / "q.json")
    assert ours.encode("12345") == hf_ids(q, "12345")
    assert all(len(ours.decode([i])) == 1 for i in ours.encode("12345"))


# --- SentencePiece BPE with byte fallback (Llama 2 style) -------------------------------------------------------

def spm_pieces():
    """A vocabulary as Llama 2 lays it out: <unk> <s> </s>, the 256 byte tokens, then the learned pieces, with
    merges (learned on whitespace-split words, as sentencepiece does)."""
    tok = tokenizers.Tokenizer(models.BPE())
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="never", split=True)
    tok.train_from_iterator(TRAIN, trainers.BpeTrainer(vocab_size=700, limit_alphabet=120, show_progress=False))
    doc = json.loads(tok.to_str())
    learned = sorted(doc["model"]["vocab"].items(), key=lambda kv: kv[1])
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    for t, _ in learned:
        vocab.setdefault(t, len(vocab))
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in doc["model"]["merges"]]
    return vocab, merges


def spm_tokenizer(vocab, merges, legacy):
    tok = tokenizers.Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", byte_fallback=True,
                                          fuse_unk=True))
    if legacy:  # Llama 2's tokenizer.json
        tok.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
    else:  # the Metaspace form of newer files
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first", split=False)
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in ("<unk>", "<s>", "</s>")])
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    return tok


@pytest.mark.parametrize("legacy", [True, False])
def test_sentencepiece_bpe_tokenizer_json_matches_tokenizers(tmp_path, legacy):
    vocab, merges = spm_pieces()
    hf = spm_tokenizer(vocab, merges, legacy)
    hf.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "special_tokens_map.json").write_text('{"bos_token": "<s>", "eos_token": "</s>"}', encoding="utf-8")
    ours = qkv.Tokenizer.from_pretrained(tmp_path / "tokenizer.json")
    assert_same(ours, hf)
    assert (ours.bos_token_id, ours.eos_token_id) == (1, 2)
    # Byte fallback: a character outside the pieces becomes its <0xAB> tokens, and decodes back.
    ids = ours.encode("\U0001F355 \u0b95", add_special_tokens=False)
    assert any(ours.convert_ids_to_tokens(i).startswith("<0x") for i in ids)
    assert ours.decode(ids) == "\U0001F355 \u0b95" == hf.decode(ids)
    # A run of byte tokens that is not UTF-8 decodes to one U+FFFD per byte, as HF's ByteFallback.
    bad = [vocab["<0xE4>"], vocab["<0xE4>"], vocab["<0x41>"]]
    assert ours.decode(bad) == hf.decode(bad, skip_special_tokens=False)
    assert ours.decode_bytes(bad) == b"\xe4\xe4A"


def test_sentencepiece_gguf_matches_autotokenizer(tmp_path):
    import transformers
    vocab, _ = spm_pieces()
    tokens = list(vocab)
    types = [2, 3, 3] + [6] * 256 + [1] * (len(tokens) - 259)
    scores = [0.0] * 259 + [-float(i) for i in range(len(tokens) - 259)]
    write_gguf(tmp_path / "spm.gguf", "llama", None, tokens, types, scores=scores, bos=1, eos=2)
    ours = qkv.Tokenizer.from_pretrained(tmp_path / "spm.gguf")
    auto = transformers.AutoTokenizer.from_pretrained(str(tmp_path), gguf_file="spm.gguf")
    for text in CORPUS:
        for add in (True, False):
            assert ours.encode(text, add_special_tokens=add) == auto.encode(text, add_special_tokens=add), (text, add)
        ids = auto.encode(text)
        for skip in (False, True):
            assert ours.decode(ids, skip_special_tokens=skip) == auto.decode(ids, skip_special_tokens=skip), text
    assert (ours.bos_token_id, ours.eos_token_id, ours.vocab_size) == (1, 2, len(tokens))


# --- the Python surface -----------------------------------------------------------------------------------------

def test_errors_are_one_line_value_and_type_errors(tmp_path, smol_json):
    with pytest.raises(ValueError, match="no such file"):
        qkv.Tokenizer.from_pretrained(tmp_path / "missing.json")
    with pytest.raises(ValueError, match="holds no tokenizer.json"):
        qkv.Tokenizer.from_pretrained(tmp_path)
    doc = json.loads(smol_json.read_text(encoding="utf-8"))
    doc["normalizer"] = {"type": "NFKC"}
    (tmp_path / "tokenizer.json").write_text(json.dumps(doc), encoding="utf-8")
    with pytest.raises(ValueError, match=r"tokenizer.json: normalizer.type 'NFKC' is not implemented"):
        qkv.Tokenizer.from_pretrained(tmp_path)
    write_gguf(tmp_path / "u.gguf", "t5", None, ["a"], [1], scores=[0.0])
    with pytest.raises(ValueError, match=r"u.gguf: tokenizer.ggml.model 't5' is not implemented"):
        qkv.Tokenizer.from_pretrained(tmp_path / "u.gguf")
    ours = qkv.Tokenizer.from_pretrained(smol_json)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        ours.decode([49152])
    with pytest.raises(TypeError):
        ours.decode("abc")
    with pytest.raises(TypeError):
        qkv.Tokenizer.from_pretrained(3)
    assert ours.convert_ids_to_tokens(1) == "<|im_start|>" and ours.convert_tokens_to_ids("<|im_end|>") == 2
    assert isinstance(ours.decode_bytes([216]), bytes)
