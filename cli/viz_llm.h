// `qkv viz --model` on a language model (a GGUF file or a Llama / Mistral / Qwen 2 / Gemma 2 folder): every layer x
// head map of the prompt and of a greedy reply, per-head statistics and a logit lens, as the viewer's page data.
#pragma once

#include <cstdint>
#include <string>

#include "qkv/core/json.h"

namespace qkv::cli {

// Whether `path` holds a causal language model for LanguageModel::load: a regular file (a GGUF), or a folder whose
// config.json names a model_type of llama, mistral, qwen2 or gemma2, or a *ForCausalLM architecture.
bool is_language_model(const std::string& path);

// A token as the page shows it: the bytes it decodes to, a space as U+2423 (␣), a newline as U+21B5 (↵), a tab as
// U+21E5 (⇥), other control bytes and bytes outside UTF-8 as <0xNN>; special tokens as stored.
std::string readable_token(const std::string& bytes);

// The page data of `text` through the model at `path`: group "prompt" (L x H maps of (T, T)) and, with generate > 0,
// group "reply" (the greedy reply's N rows over all T + N keys, its stop id included); lens: for the last
// `lens_positions` positions (the reply's among them), each of the L + 1 hidden states through the final norm and the
// head, its `lens_top` most likely next tokens. std::invalid_argument / std::runtime_error "[viz] ..." on bad input.
json::Value llm_viz_data(const std::string& path, const std::string& text, int64_t generate, int64_t lens_positions,
                         int64_t lens_top);

}  // namespace qkv::cli
