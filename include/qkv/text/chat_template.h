// Chat templates: the Jinja2 subset that models ship in tokenizer_config.json / chat_template.jinja, rendered as
// transformers' apply_chat_template renders them (jinja2 with trim_blocks, lstrip_blocks, loop controls, its tojson).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "qkv/core/json.h"

namespace qkv::text {

// What one render may use; exceeding any of them throws std::runtime_error "[chat_template] <name>: ...".
struct ChatTemplateLimits {
  size_t max_output_bytes = size_t{64} << 20;  // the rendered text, and any one string or list built on the way
  uint64_t max_steps = 20'000'000;             // loop iterations + expression evaluations
  int max_depth = 64;                          // nested macro calls
};

// A parsed template. Supported: {{ }}, {% %}, {# #}, whitespace control (-, +), raw; if/elif/else, for (loop.*,
// else, inline if, tuple targets, break/continue), set (names, tuples, namespace attributes, blocks), macro,
// filter blocks, generation blocks; Python-like values and operators; jinja2's filters and tests as chat templates
// use them; globals raise_exception, range, namespace, dict, strftime_now. Strings are UTF-8; case mappings
// (upper, lower, title, capitalize) change ASCII letters only.
//
// Errors (std::invalid_argument) name the template and line:column in one line:
//   "[chat_template] <name>:3:14: unexpected 'endfor' (expected 'endif')"
// raise_exception(msg) inside a template throws std::invalid_argument "[chat_template] <name>: <msg>".
class ChatTemplate {
 public:
  static ChatTemplate parse(std::string source, std::string name = "chat_template");

  // `context`: a JSON object whose members are the template's variables (messages, add_generation_prompt,
  // bos_token, eos_token, tools, ...). Integers stay ints and other numbers floats, as in Python.
  std::string render(const json::Value& context, const ChatTemplateLimits& limits = {}) const;

  const std::string& name() const;
  const std::string& source() const;

  struct Impl;

 private:
  std::shared_ptr<const Impl> impl_;
};

// transformers' apply_chat_template(messages, tokenize=False): message keys whose value is null are dropped, and
// the template sees messages, tools=None, documents=None, add_generation_prompt, bos_token, eos_token and the
// members of `extra` (which override these).
std::string apply_chat_template(const ChatTemplate& tmpl, const json::Value& messages, bool add_generation_prompt,
                                const std::string& bos_token, const std::string& eos_token,
                                const json::Value& extra = json::Value::object());

// The chat template of a Hugging Face model folder: chat_template.jinja, else tokenizer_config.json's
// "chat_template" (a string, or a list of {name, template} from which "default" is taken). Throws
// std::runtime_error naming the folder when it has neither.
std::string find_chat_template(const std::string& model_dir);

}  // namespace qkv::text
