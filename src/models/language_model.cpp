// A language model from a GGUF file or a Hugging Face folder: decoder, tokenizer, chat template and stop tokens.
#include "qkv/models/language_model.h"

#include <algorithm>
#include <set>

#include "model_files.h"
#include "qkv/core/error.h"
#include "qkv/core/gguf.h"

namespace qkv::models {
namespace {

std::string join(const std::string& dir, const std::string& name) {
  return dir.empty() || dir.back() == '/' ? dir + name : dir + "/" + name;
}

// An "eos_token_id" member: an id, a list of ids, or null.
void add_ids(const json::Value* v, std::set<int64_t>& out) {
  if (!v || v->is_null()) return;
  if (v->type() == json::Value::Type::kNumber) {
    out.insert(static_cast<int64_t>(v->as_number()));
  } else if (v->type() == json::Value::Type::kArray) {
    for (const json::Value& x : v->items())
      if (x.type() == json::Value::Type::kNumber) out.insert(static_cast<int64_t>(x.as_number()));
  }
}

// The texts of the control tokens that end a turn in the chat formats of common models (llama.cpp's list).
bool ends_a_turn(const std::string& token) {
  static const std::set<std::string> kEnd = {"<|eot_id|>",   "<|im_end|>", "<|end|>",    "<end_of_turn>",
                                             "<|endoftext|>", "<|eom_id|>", "<EOT>",      "<|end_of_text|>"};
  return kEnd.count(token) != 0;
}

std::vector<int64_t> gguf_stop_ids(const std::string& path, const text::Tokenizer* tok) {
  const gguf::File f = gguf::File::open(path);
  std::set<int64_t> ids;
  for (const char* key : {"tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"})
    if (const gguf::Value* v = f.find(key)) ids.insert(v->as_int());
  if (tok)
    for (int64_t id : tok->special_token_ids())
      if (ends_a_turn(tok->token(id))) ids.insert(id);
  return {ids.begin(), ids.end()};
}

std::vector<int64_t> folder_stop_ids(const std::string& dir, const text::Tokenizer* tok) {
  std::set<int64_t> ids;
  for (const char* name : {"config.json", "generation_config.json"}) {
    const std::string p = join(dir, name);
    if (!files::exists(p)) continue;
    const json::Value doc = files::read_json(p, "language_model");
    if (doc.type() == json::Value::Type::kObject) add_ids(doc.find("eos_token_id"), ids);
  }
  if (tok && tok->eos_token_id() >= 0) ids.insert(tok->eos_token_id());
  return {ids.begin(), ids.end()};
}

// A file other than a tokenizer.json is a GGUF file (as from_pretrained takes it).
bool is_gguf(const std::string& path) {
  return files::is_regular_file(path) && !(path.size() >= 5 && path.compare(path.size() - 5, 5, ".json") == 0);
}

// A folder, or the folder of a tokenizer.json.
std::string folder_of(const std::string& path) {
  if (!files::is_regular_file(path)) return path;
  const size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

// special_tokens_map.json / tokenizer_config.json: "unk_token": "<unk>" or {"content": "<unk>", ...}.
std::string config_token(const json::Value& cfg, const char* key) {
  const json::Value* v = cfg.find(key);
  if (!v) return "";
  if (v->type() == json::Value::Type::kString) return v->as_string();
  if (v->type() == json::Value::Type::kObject)
    if (const json::Value* c = v->find("content"); c && c->type() == json::Value::Type::kString)
      return c->as_string();
  return "";
}

}  // namespace

std::optional<text::ChatTemplate> load_chat_template(const std::string& path) {
  if (is_gguf(path)) {
    const gguf::File f = gguf::File::open(path);
    if (const gguf::Value* t = f.find("tokenizer.chat_template"))
      return text::ChatTemplate::parse(t->as_string(), path + ": tokenizer.chat_template");
    return std::nullopt;
  }
  const std::string dir = folder_of(path);
  std::string source;
  try {
    source = text::find_chat_template(dir);
  } catch (const std::runtime_error&) {
    return std::nullopt;  // a base model without a template: text completion only
  }
  return text::ChatTemplate::parse(source, dir + ": chat template");
}

json::Value chat_special_tokens(const std::string& path, const text::Tokenizer& tokenizer) {
  static const char* const kOther[] = {"unk_token", "sep_token", "pad_token", "cls_token", "mask_token"};
  json::Value out = json::Value::object();
  for (auto [key, id] : {std::pair{"bos_token", tokenizer.bos_token_id()}, {"eos_token", tokenizer.eos_token_id()}})
    if (id >= 0) out.set(key, tokenizer.token(id));
  if (is_gguf(path)) {
    const gguf::File f = gguf::File::open(path);
    static const char* const kIds[] = {"tokenizer.ggml.unknown_token_id", "tokenizer.ggml.seperator_token_id",
                                       "tokenizer.ggml.padding_token_id", "tokenizer.ggml.cls_token_id",
                                       "tokenizer.ggml.mask_token_id"};
    for (size_t i = 0; i < 5; ++i)
      if (const gguf::Value* v = f.find(kIds[i]); v && v->as_int() >= 0 && v->as_int() < tokenizer.vocab_size())
        out.set(kOther[i], tokenizer.token(v->as_int()));
    return out;
  }
  const std::string dir = folder_of(path);
  for (const char* name : {"special_tokens_map.json", "tokenizer_config.json"}) {  // the second wins, as HF reads
    const std::string p = join(dir, name);
    if (!files::is_regular_file(p)) continue;
    const json::Value cfg = files::read_json(p, "chat_template");
    if (cfg.type() != json::Value::Type::kObject) continue;
    for (const char* key : kOther)
      if (const std::string t = config_token(cfg, key); !t.empty()) out.set(key, t);
  }
  return out;
}

std::string render_chat(const text::ChatTemplate& tmpl, const json::Value& special_tokens,
                        const json::Value& messages, bool add_generation_prompt) {
  auto get = [&](const char* key) {
    const json::Value* v = special_tokens.type() == json::Value::Type::kObject ? special_tokens.find(key) : nullptr;
    return v && v->type() == json::Value::Type::kString ? v->as_string() : std::string();
  };
  return text::apply_chat_template(tmpl, messages, add_generation_prompt, get("bos_token"), get("eos_token"),
                                   special_tokens);
}

std::vector<int64_t> encode_chat(const text::Tokenizer& tokenizer, const std::string& rendered,
                                 const json::Value& messages) {
  // Where each message's content landed in the rendered text (found in order, as written or trimmed): no special
  // token is recognised there.
  std::vector<std::pair<size_t, size_t>> plain;
  size_t from = 0;
  if (messages.type() == json::Value::Type::kArray) {
    for (const json::Value& m : messages.items()) {
      const json::Value* c = m.type() == json::Value::Type::kObject ? m.find("content") : nullptr;
      if (!c || c->type() != json::Value::Type::kString || c->as_string().empty()) continue;
      std::string text = c->as_string();
      size_t at = rendered.find(text, from);
      if (at == std::string::npos) {
        const size_t b = text.find_first_not_of(" \t\n\r"), e = text.find_last_not_of(" \t\n\r");
        if (b == std::string::npos) continue;
        text = text.substr(b, e - b + 1);
        at = rendered.find(text, from);
      }
      if (at == std::string::npos) continue;
      plain.emplace_back(at, at + text.size());
      from = at + text.size();
    }
  }
  return tokenizer.encode(rendered, false, plain);
}

std::vector<int64_t> end_of_generation_ids(const std::string& path, const text::Tokenizer* tokenizer) {
  return files::is_regular_file(path) ? gguf_stop_ids(path, tokenizer) : folder_stop_ids(path, tokenizer);
}

LanguageModel LanguageModel::load(const std::string& path, std::optional<Precision> precision) {
  QKV_CHECK_RUNTIME(files::exists(path), "[language_model] ", path, " does not exist (a .gguf file or a model folder)");
  LanguageModel lm;
  lm.path = path;
  const bool gguf_file = files::is_regular_file(path);
  lm.model = LlamaForCausalLM::from_pretrained(path, precision);
  lm.tokenizer = text::load_tokenizer(path);
  const int64_t v = lm.model->config().vocab_size;
  QKV_CHECK_RUNTIME(lm.tokenizer->vocab_size() <= v, "[language_model] ", path, ": the tokenizer has ",
                    lm.tokenizer->vocab_size(), " tokens, more than the model's vocab_size ", v);
  lm.chat_template = load_chat_template(path);
  lm.chat_tokens = chat_special_tokens(path, *lm.tokenizer);
  lm.stop_ids = gguf_file ? gguf_stop_ids(path, lm.tokenizer.get()) : folder_stop_ids(path, lm.tokenizer.get());
  for (int64_t id : lm.stop_ids)
    QKV_CHECK_RUNTIME(id >= 0 && id < v, "[language_model] ", path, ": end-of-generation id ", id,
                      " is outside the vocabulary [0, ", v, ")");
  return lm;
}

std::string LanguageModel::apply_chat_template(const json::Value& messages, bool add_generation_prompt) const {
  QKV_CHECK_ARG(chat_template.has_value(), "[chat] ", path, " has no chat template (tokenizer.chat_template, ",
                "chat_template.jinja or tokenizer_config.json): use plain text completion");
  return render_chat(*chat_template, chat_tokens, messages, add_generation_prompt);
}

std::vector<int64_t> LanguageModel::encode_chat(const json::Value& messages, bool add_generation_prompt) const {
  return models::encode_chat(*tokenizer, apply_chat_template(messages, add_generation_prompt), messages);
}

bool LanguageModel::is_stop(int64_t id) const { return std::binary_search(stop_ids.begin(), stop_ids.end(), id); }

}  // namespace qkv::models
