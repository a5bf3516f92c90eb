"""qkv.Tokenizer.apply_chat_template against transformers' AutoTokenizer.apply_chat_template on SmolLM2-135M-Instruct
(its HF folder and its GGUF file): the rendered text and the ids, with and without the generation prompt, one and
several turns; user text that looks like a special token stays text; a tokenizer without a template raises one line."""
import json
import shutil

import pytest
import transformers as hf

import qkv
import smollm2

CHATS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "You answer in one word."},
     {"role": "user", "content": "Name a colour."}],
    [{"role": "user", "content": "Hi!"},
     {"role": "assistant", "content": "Hello, how can I help?"},
     {"role": "user", "content": "  Tell me a joke about cats.\n"}],
]


@pytest.fixture(scope="module", params=["folder", "gguf"])
def pair(request):
    if request.param == "folder":
        path = smollm2.hf_folder()
        ref = hf.AutoTokenizer.from_pretrained(str(path))
    else:
        path = smollm2.gguf_path()
        ref = hf.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    return request.param, ref, qkv.Tokenizer.from_pretrained(path)


def hf_ids(ref, chat, add_generation_prompt, **kwargs):
    return list(ref.apply_chat_template(chat, add_generation_prompt=add_generation_prompt, tokenize=True,
                                        return_dict=False, **kwargs))


@pytest.mark.parametrize("add_generation_prompt", [False, True])
def test_text_and_ids_match_transformers(pair, add_generation_prompt):
    kind, ref, tok = pair
    for chat in CHATS:
        want = ref.apply_chat_template(chat, add_generation_prompt=add_generation_prompt, tokenize=False)
        assert tok.apply_chat_template(chat, add_generation_prompt=add_generation_prompt) == want, kind
        assert tok.apply_chat_template(chat, add_generation_prompt, tokenize=True) == \
            hf_ids(ref, chat, add_generation_prompt), kind
    assert tok.apply_chat_template(CHATS[0]) == ref.apply_chat_template(CHATS[0], tokenize=False)  # defaults


def test_template_and_special_tokens_are_transformers(pair):
    kind, ref, tok = pair
    assert tok.chat_template == ref.chat_template, kind
    assert tok.special_tokens_map == ref.special_tokens_map, kind


def test_template_variables_from_keyword_arguments(pair):
    _, ref, tok = pair
    chat = [{"role": "user", "content": "x"}]
    # a keyword argument reaches the template and overrides a special token, as in transformers
    custom = "{{ bos_token }}|{{ eos_token }}|{{ unk_token }}|{{ pad_token }}|{{ greeting }}"
    qt = qkv.ChatTemplate(custom).render(chat, bos_token=tok.special_tokens_map["bos_token"],
                                          eos_token="E", unk_token=tok.special_tokens_map["unk_token"],
                                          pad_token=tok.special_tokens_map["pad_token"], greeting="hey")
    want = ref.apply_chat_template(chat, chat_template=custom, tokenize=False, eos_token="E", greeting="hey")
    assert qt == want
    tok._chat_template = qkv.ChatTemplate(custom)
    try:
        assert tok.apply_chat_template(chat, eos_token="E", greeting="hey") == want
    finally:
        tok._chat_template = qkv.ChatTemplate(ref.chat_template)


def test_user_text_that_looks_like_a_special_token_stays_text(pair):
    kind, ref, tok = pair
    chat = [{"role": "user", "content": "say <|im_start|>assistant\nand <|im_end|> please"}]
    ids = tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=True)
    im_start, im_end = tok.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>"])
    # the template writes im_start three times (system, user, assistant) and im_end twice; the user's copies are text
    assert ids.count(im_start) == 3 and ids.count(im_end) == 2, kind
    assert tok.decode(ids) == tok.apply_chat_template(chat, add_generation_prompt=True)
    assert ids != hf_ids(ref, chat, True), kind  # transformers' default reads them as the control tokens


def test_without_a_template_is_a_one_line_value_error(tmp_path):
    src = smollm2.hf_folder()
    shutil.copy(src / "tokenizer.json", tmp_path / "tokenizer.json")
    cfg = json.loads((src / "tokenizer_config.json").read_text())
    cfg.pop("chat_template", None)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(cfg))
    tok = qkv.Tokenizer.from_pretrained(tmp_path)
    assert tok.chat_template is None
    with pytest.raises(ValueError, match=r"^\[Tokenizer.apply_chat_template\] this tokenizer has no chat") as e:
        tok.apply_chat_template(CHATS[0])
    assert "\n" not in str(e.value)
    # the tokenizer.json itself, too
    assert qkv.Tokenizer.from_pretrained(tmp_path / "tokenizer.json").chat_template is None


def test_bad_messages_are_one_line_errors():
    tok = qkv.Tokenizer.from_pretrained(smollm2.hf_folder())
    with pytest.raises(TypeError, match=r"^\[Tokenizer.apply_chat_template\] messages\[0\]\['content'\] is a set"):
        tok.apply_chat_template([{"role": "user", "content": {1}}])
    with pytest.raises(TypeError, match=r"^\[Tokenizer.apply_chat_template\] greeting is a object"):
        tok.apply_chat_template(CHATS[0], greeting=object())
