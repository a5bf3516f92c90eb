// `qkv viz --model` on a language model (a GGUF file or a Llama / Mistral / Qwen 2 / Gemma 2 folder): every layer x
// head map of the prompt and of a greedy reply, per-head statistics and a logit lens, as the viewer's page data.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "qkv/core/json.h"
#include "qkv/core/tensor.h"
#include "qkv/models/llama.h"
#include "qkv/plot/viewer_data.h"
#include "qkv/text/tokenizer.h"

namespace qkv::cli {

// Whether `path` holds a causal language model for LanguageModel::load: a regular file (a GGUF), or a folder whose
// config.json names a model_type of llama, mistral, qwen2 or gemma2, or a *ForCausalLM architecture.
bool is_language_model(const std::string& path);

// A token as the page shows it: the bytes it decodes to, a space as U+2423 (␣), a newline as U+21B5 (↵), a tab as
// U+21E5 (⇥), other control bytes and bytes outside UTF-8 as <0xNN>; special tokens as stored.
std::string readable_token(const std::string& bytes);

// The tokens of `ids` as the page shows them: special tokens as stored, the others through readable_token.
std::vector<std::string> page_tokens(const text::Tokenizer& tokenizer, const std::vector<int64_t>& ids);

// The page data of one forward's attention probabilities (L entries (1, H, T, T), CausalLMOutput::attentions) over
// `tokens` (T of them): group "prompt" (the first prompt_len rows and keys) and, when T > prompt_len, group "reply"
// (the other rows over all T keys). Written by plot::viz_data; `qkv viz --model` and `qkv serve`'s live page share it.
json::Value llm_page_data(const std::vector<Tensor>& attentions, const std::vector<std::string>& tokens,
                          int64_t prompt_len, const std::string& title);

// The logit lens: at each of `rows` (row indices of the hidden states, L + 1 entries (1, T, E),
// CausalLMOutput::hidden_states), each hidden state through the final norm (the last one has had it) and the head,
// its `top` most likely next tokens. The page's "lens" object: positions (offset + row), levels (L + 1), top,
// tokens / token_ids (the table of the tokens named), ids and probs ((P, L + 1, top), most likely first); the caller
// adds text_tokens.
json::Value logit_lens(const models::LlamaForCausalLM& model, const text::Tokenizer& tokenizer,
                       const std::vector<Tensor>& hidden_states, const std::vector<int64_t>& rows, int64_t offset,
                       int64_t top);

// The page data of `text` through the model at `path`: group "prompt" (L x H maps of (T, T)) and, with generate > 0,
// group "reply" (the greedy reply's N rows over all T + N keys, its stop id included); lens: for the last
// `lens_positions` positions (the reply's among them), each of the L + 1 hidden states through the final norm and the
// head, its `lens_top` most likely next tokens. std::invalid_argument / std::runtime_error "[viz] ..." on bad input.
json::Value llm_viz_data(const std::string& path, const std::string& text, int64_t generate, int64_t lens_positions,
                         int64_t lens_top);

}  // namespace qkv::cli
