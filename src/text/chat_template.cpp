// Chat templates: ChatTemplate (parse, render), apply_chat_template and find_chat_template, with the settings of
// transformers' apply_chat_template: trim_blocks, lstrip_blocks, loop controls, its tojson, raise_exception. The Jinja2
// interpreter behind them: jinja.h (its types; a map of the files) and jinja_values, _lexer, _parser, _eval, _builtins.
#include "qkv/text/chat_template.h"

#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

#include "qkv/core/error.h"
#include "jinja.h"

namespace qkv::text {

ChatTemplate ChatTemplate::parse(std::string source, std::string name) {
  auto impl = std::make_shared<Impl>();
  impl->src.name = std::move(name);
  if (json::first_invalid_utf8(source) != std::string::npos)
    throw std::invalid_argument("[chat_template] " + impl->src.name + ": the template is not valid UTF-8 (at byte " +
                                std::to_string(json::first_invalid_utf8(source)) + ")");
  std::string text;
  text.reserve(source.size());
  for (size_t k = 0; k < source.size(); ++k) {
    if (source[k] == '\r') {
      text += '\n';
      if (k + 1 < source.size() && source[k + 1] == '\n') ++k;
    } else {
      text += source[k];
    }
  }
  if (!text.empty() && text.back() == '\n') text.pop_back();
  impl->src.text = std::move(text);
  impl->src.index();
  impl->body = jinja::parse(impl->src, jinja::tokenize(impl->src));
  ChatTemplate t;
  t.impl_ = std::move(impl);
  return t;
}

std::string ChatTemplate::render(const json::Value& context, const ChatTemplateLimits& limits) const {
  QKV_CHECK_ARG(impl_, "[chat_template] render on a template that was never parsed");
  jinja::Interp in(*impl_, limits);
  return in.run(context);
}

const std::string& ChatTemplate::name() const {
  static const std::string empty;
  return impl_ ? impl_->src.name : empty;
}
const std::string& ChatTemplate::source() const {
  static const std::string empty;
  return impl_ ? impl_->src.text : empty;
}

std::string apply_chat_template(const ChatTemplate& tmpl, const json::Value& messages, bool add_generation_prompt,
                                const std::string& bos_token, const std::string& eos_token, const json::Value& extra) {
  QKV_CHECK_ARG(messages.is_array(), "[apply_chat_template] messages must be a JSON array, got ",
                json::type_name(messages.type()));
  QKV_CHECK_ARG(extra.is_object() || extra.is_null(), "[apply_chat_template] extra must be a JSON object, got ",
                json::type_name(extra.type()));
  json::Value msgs = json::Value::array();
  for (size_t k = 0; k < messages.items().size(); ++k) {
    const json::Value& m = messages.items()[k];
    QKV_CHECK_ARG(m.is_object(), "[apply_chat_template] message ", k, " must be an object, got ",
                  json::type_name(m.type()));
    json::Value clean = json::Value::object();
    for (const auto& kv : m.members()) if (!kv.second.is_null()) clean.set(kv.first, kv.second);
    msgs.push(std::move(clean));
  }
  json::Value ctx = json::Value::object();
  ctx.set("messages", std::move(msgs));
  ctx.set("tools", json::Value());
  ctx.set("documents", json::Value());
  ctx.set("add_generation_prompt", add_generation_prompt);
  ctx.set("bos_token", bos_token);
  ctx.set("eos_token", eos_token);
  for (const auto& kv : extra.members()) ctx.set(kv.first, kv.second);
  return tmpl.render(ctx);
}

std::string find_chat_template(const std::string& model_dir) {
  namespace fs = std::filesystem;
  auto read = [](const fs::path& p) {
    std::ifstream f(p, std::ios::binary);
    QKV_CHECK_RUNTIME(f, "[find_chat_template] cannot read ", p.string());
    std::ostringstream ss;
    ss << f.rdbuf();
    QKV_CHECK_RUNTIME(!f.bad(), "[find_chat_template] cannot read ", p.string());
    return ss.str();
  };
  const fs::path dir(model_dir);
  QKV_CHECK_RUNTIME(fs::is_directory(dir), "[find_chat_template] ", model_dir, " is not a folder");
  if (fs::is_regular_file(dir / "chat_template.jinja")) return read(dir / "chat_template.jinja");
  const fs::path cfg = dir / "tokenizer_config.json";
  if (fs::is_regular_file(cfg)) {
    const json::Value v = json::Value::parse(read(cfg), "[find_chat_template] " + cfg.string());
    if (const json::Value* t = v.find("chat_template")) {
      if (t->is_string()) return t->as_string();
      QKV_CHECK_ARG(t->is_array(), "[find_chat_template] ", cfg.string(),
                    ": \"chat_template\" must be a string or a list of {name, template}, got ", json::type_name(t->type()));
      for (const auto& e : t->items()) {
        const json::Value* n = e.find("name");
        const json::Value* tt = e.find("template");
        QKV_CHECK_ARG(n && tt && n->is_string() && tt->is_string(), "[find_chat_template] ", cfg.string(),
                      ": each \"chat_template\" entry must be {\"name\": str, \"template\": str}");
        if (n->as_string() == "default") return tt->as_string();
      }
      QKV_CHECK_RUNTIME(false, "[find_chat_template] ", cfg.string(), ": \"chat_template\" has no entry named \"default\"");
    }
  }
  QKV_CHECK_RUNTIME(false, "[find_chat_template] ", model_dir,
                    " has no chat template (neither chat_template.jinja nor a \"chat_template\" in tokenizer_config.json)");
  return {};
}

}  // namespace qkv::text
