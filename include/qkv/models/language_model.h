// A language model as people have it on disk: a GGUF file or a Hugging Face folder, loaded into one bundle of the
// decoder (LlamaForCausalLM), its tokenizer, its chat template and the tokens that end a reply. Text in, ids out.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "qkv/core/json.h"
#include "qkv/core/precision.h"
#include "qkv/models/llama.h"
#include "qkv/text/chat_template.h"
#include "qkv/text/tokenizer.h"

namespace qkv::models {

// The ids that end a reply for the model at `path` (a .gguf file or a folder), ascending: see
// LanguageModel::stop_ids. `tokenizer` may be null (a folder without one: config.json's and generation_config.json's
// eos_token_id only; a GGUF: its metadata ids and, with a tokenizer, the end-of-turn control tokens).
std::vector<int64_t> end_of_generation_ids(const std::string& path, const text::Tokenizer* tokenizer);

// The chat template the model at `path` ships: a GGUF's tokenizer.chat_template, a folder's chat_template.jinja or
// tokenizer_config.json "chat_template" (text::find_chat_template); nullopt when it ships none. A template that does
// not parse throws std::invalid_argument naming the file and line:column.
std::optional<text::ChatTemplate> load_chat_template(const std::string& path);

// The named special tokens transformers passes to a chat template (its special_tokens_map), as a JSON object of
// strings: "bos_token" and "eos_token" from the tokenizer; "unk_token", "sep_token", "pad_token", "cls_token" and
// "mask_token" from special_tokens_map.json / tokenizer_config.json beside a folder's tokenizer.json, or from a
// GGUF's tokenizer.ggml.unknown_token_id, .seperator_token_id, .padding_token_id, .cls_token_id, .mask_token_id.
// Absent tokens are left out.
json::Value chat_special_tokens(const std::string& path, const text::Tokenizer& tokenizer);

// messages (a JSON list of {"role", "content"} objects) rendered by `tmpl` as transformers'
// apply_chat_template(messages, add_generation_prompt, tokenize=False) renders them, with `special_tokens`
// (chat_special_tokens) as the template's variables. std::invalid_argument when the template raises.
std::string render_chat(const text::ChatTemplate& tmpl, const json::Value& special_tokens,
                        const json::Value& messages, bool add_generation_prompt);

// A rendered chat as ids: `rendered` (render_chat of `messages`) tokenized without adding special tokens again (the
// template holds them); the special tokens the template wrote are the model's, and text the user typed inside
// messages is plain text even when it looks like a special token (each message's content is found in the rendered
// text, in order, as written or trimmed, and no special token is recognised there). A template that rewrites a
// content leaves that content unprotected.
std::vector<int64_t> encode_chat(const text::Tokenizer& tokenizer, const std::string& rendered,
                                 const json::Value& messages);

struct LanguageModel {
  std::string path;                                // the file or folder it came from
  std::unique_ptr<LlamaForCausalLM> model;
  std::unique_ptr<text::Tokenizer> tokenizer;
  std::optional<text::ChatTemplate> chat_template;  // absent when the model ships none
  json::Value chat_tokens = json::Value::object();  // the template's special-token variables (chat_special_tokens)
  // The ids that end a reply: the model's EOS and end-of-generation tokens, in ascending order. HF folders:
  // config.json's and generation_config.json's eos_token_id (an id or a list) and the tokenizer's eos. GGUF:
  // tokenizer.ggml.eos_token_id, .eot_token_id, .eom_token_id, and the vocabulary's control tokens that end a turn
  // by their text (<|im_end|>, <|eot_id|>, <|eom_id|>, <end_of_turn>, <|end|>, <|endoftext|>, as llama.cpp does).
  std::vector<int64_t> stop_ids;

  // A .gguf file or a folder (config.json, model.safetensors or its index, tokenizer.json, and the chat template
  // in chat_template.jinja or tokenizer_config.json). Errors are one std::runtime_error line naming the file.
  // precision: std::nullopt (default) runs the weights as the file stores them (a GGUF's quantized blocks, a
  // folder's float32); a Precision as LlamaForCausalLM::from_pretrained.
  static LanguageModel load(const std::string& path, std::optional<Precision> precision = std::nullopt);

  // messages: a JSON list of {"role", "content"} objects. The model's template rendered as transformers'
  // apply_chat_template(messages, add_generation_prompt, tokenize=False) renders it, with the tokenizer's bos and
  // eos and the other named special tokens (chat_tokens). std::invalid_argument when the model has no template or
  // the template raises.
  std::string apply_chat_template(const json::Value& messages, bool add_generation_prompt = true) const;
  // The rendered chat as ids, user text kept free of special tokens (models::encode_chat).
  std::vector<int64_t> encode_chat(const json::Value& messages, bool add_generation_prompt = true) const;
  bool is_stop(int64_t id) const;
};

}  // namespace qkv::models
