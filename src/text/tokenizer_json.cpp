// tokenizer.json (HF tokenizers' serialization) -> TokenizerSpec. Every component this reader does not implement is
// refused with one line naming the file and the key; nothing is approximated.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <optional>

#include "qkv/core/error.h"
#include "qkv/core/json.h"
#include "qkv/text/tokenizer.h"

namespace qkv::text {
namespace {

using json::Value;

std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary | std::ios::ate);
  QKV_CHECK_RUNTIME(f.good(), "[tokenizer] ", path, ": cannot open");
  const std::streamoff size = f.tellg();
  QKV_CHECK_RUNTIME(size >= 0, "[tokenizer] ", path, ": read failed");
  std::string text(static_cast<size_t>(size), '\0');
  f.seekg(0);
  f.read(text.data(), size);
  QKV_CHECK_RUNTIME(!f.bad() && f.gcount() == size, "[tokenizer] ", path, ": read failed");
  return text;
}

struct Ctx {
  const std::string& file;
  [[noreturn]] void unsupported(const std::string& key, const std::string& what) const {
    throw std::runtime_error("[tokenizer] " + file + ": " + key + " " + what + " is not implemented");
  }
  [[noreturn]] void bad(const std::string& key, const std::string& what) const {
    throw std::invalid_argument("[tokenizer] " + file + ": " + key + " " + what);
  }
  const Value& member(const Value& v, const std::string& key, const std::string& path) const {
    const Value* m = v.find(key);
    if (!m) bad(path + "." + key, "is missing");
    return *m;
  }
  std::string str(const Value& v, const std::string& key, const std::string& path) const {
    const Value& m = member(v, key, path);
    if (!m.is_string()) bad(path + "." + key, std::string("must be a string, not ") + json::type_name(m.type()));
    return m.as_string();
  }
  bool flag(const Value& v, const std::string& key, const std::string& path, bool dflt) const {
    const Value* m = v.find(key);
    if (!m || m->is_null()) return dflt;
    if (!m->is_bool()) bad(path + "." + key, "must be a boolean");
    return m->as_bool();
  }
  std::string type(const Value& v, const std::string& path) const {
    if (!v.is_object()) bad(path, std::string("must be an object, not ") + json::type_name(v.type()));
    return str(v, "type", path);
  }
};

// {"String": s} or {"Regex": r}.
void read_pattern(const Ctx& c, const Value& v, const std::string& path, std::string& pattern, bool& is_regex) {
  if (const Value* s = v.find("String"); s && s->is_string()) {
    pattern = s->as_string(), is_regex = false;
  } else if (const Value* r = v.find("Regex"); r && r->is_string()) {
    pattern = r->as_string(), is_regex = true;
  } else {
    c.bad(path, "must be {\"String\": ...} or {\"Regex\": ...}");
  }
}

void read_normalizer(const Ctx& c, const Value& v, const std::string& path, std::vector<NormalizerStep>& out) {
  if (v.is_null()) return;
  const std::string t = c.type(v, path);
  if (t == "Sequence") {
    const Value& list = c.member(v, "normalizers", path);
    for (size_t i = 0; i < list.items().size(); ++i)
      read_normalizer(c, list.items()[i], path + ".normalizers[" + std::to_string(i) + "]", out);
  } else if (t == "Prepend") {
    out.push_back({NormalizerStep::Kind::kPrepend, "", c.str(v, "prepend", path)});
  } else if (t == "Replace") {
    NormalizerStep s{NormalizerStep::Kind::kReplace, "", c.str(v, "content", path)};
    bool regex = false;
    read_pattern(c, c.member(v, "pattern", path), path + ".pattern", s.pattern, regex);
    if (regex) c.unsupported(path + ".pattern", "Regex");
    out.push_back(s);
  } else {
    c.unsupported(path + ".type", "'" + t + "'");
  }
}

void read_pre_tokenizer(const Ctx& c, const Value& v, const std::string& path, std::vector<PreTokenizerStep>& out) {
  if (v.is_null()) return;
  const std::string t = c.type(v, path);
  PreTokenizerStep s;
  if (t == "Sequence") {
    const Value& list = c.member(v, "pretokenizers", path);
    for (size_t i = 0; i < list.items().size(); ++i)
      read_pre_tokenizer(c, list.items()[i], path + ".pretokenizers[" + std::to_string(i) + "]", out);
    return;
  } else if (t == "Split") {
    s.kind = PreTokenizerStep::Kind::kSplit;
    read_pattern(c, c.member(v, "pattern", path), path + ".pattern", s.pattern, s.pattern_is_regex);
    s.behavior = c.str(v, "behavior", path);
    if (s.behavior != "Isolated" && s.behavior != "Removed" && s.behavior != "Contiguous" &&
        s.behavior != "MergedWithPrevious" && s.behavior != "MergedWithNext")
      c.unsupported(path + ".behavior", "'" + s.behavior + "'");
    s.invert = c.flag(v, "invert", path, false);
  } else if (t == "ByteLevel") {
    s.kind = PreTokenizerStep::Kind::kByteLevel;
    s.add_prefix_space = c.flag(v, "add_prefix_space", path, true);
    s.use_regex = c.flag(v, "use_regex", path, true);
  } else if (t == "Digits") {
    s.kind = PreTokenizerStep::Kind::kDigits;
    s.individual_digits = c.flag(v, "individual_digits", path, false);
  } else if (t == "Metaspace") {
    s.kind = PreTokenizerStep::Kind::kMetaspace;
    s.replacement = c.str(v, "replacement", path);
    if (const Value* p = v.find("prepend_scheme"); p && p->is_string()) {
      s.prepend_scheme = p->as_string();
      if (s.prepend_scheme != "always" && s.prepend_scheme != "first" && s.prepend_scheme != "never")
        c.unsupported(path + ".prepend_scheme", "'" + s.prepend_scheme + "'");
    } else {
      s.prepend_scheme = c.flag(v, "add_prefix_space", path, true) ? "always" : "never";
    }
    s.split = c.flag(v, "split", path, true);
  } else {
    c.unsupported(path + ".type", "'" + t + "'");
  }
  out.push_back(s);
}

void read_decoder(const Ctx& c, const Value& v, const std::string& path, std::vector<DecoderStep>& out) {
  if (v.is_null()) return;
  const std::string t = c.type(v, path);
  DecoderStep s;
  if (t == "Sequence") {
    const Value& list = c.member(v, "decoders", path);
    for (size_t i = 0; i < list.items().size(); ++i)
      read_decoder(c, list.items()[i], path + ".decoders[" + std::to_string(i) + "]", out);
    return;
  } else if (t == "ByteLevel") {
    s.kind = DecoderStep::Kind::kByteLevel;
  } else if (t == "Replace") {
    s.kind = DecoderStep::Kind::kReplace;
    bool regex = false;
    read_pattern(c, c.member(v, "pattern", path), path + ".pattern", s.pattern, regex);
    if (regex) c.unsupported(path + ".pattern", "Regex");
    s.content = c.str(v, "content", path);
  } else if (t == "ByteFallback") {
    s.kind = DecoderStep::Kind::kByteFallback;
  } else if (t == "Fuse") {
    s.kind = DecoderStep::Kind::kFuse;
  } else if (t == "Strip") {
    s.kind = DecoderStep::Kind::kStrip;
    s.content = c.str(v, "content", path);
    const Value& a = c.member(v, "start", path);
    const Value& b = c.member(v, "stop", path);
    if (!a.is_integer() || !b.is_integer() || a.as_integer() < 0 || b.as_integer() < 0)
      c.bad(path, "start and stop must be non-negative integers");
    if (s.content.size() != 1) c.unsupported(path + ".content", "'" + s.content + "' (not one ASCII character)");
    s.start = a.as_integer(), s.stop = b.as_integer();
  } else if (t == "Metaspace") {
    s.kind = DecoderStep::Kind::kMetaspace;
    s.replacement = c.str(v, "replacement", path);
    if (const Value* p = v.find("prepend_scheme"); p && p->is_string()) {
      s.prepend_scheme = p->as_string();
    } else {
      s.prepend_scheme = c.flag(v, "add_prefix_space", path, true) ? "always" : "never";
    }
  } else {
    c.unsupported(path + ".type", "'" + t + "'");
  }
  out.push_back(s);
}

void read_post_processor(const Ctx& c, const Value& v, const std::string& path, TokenizerSpec& spec) {
  if (v.is_null()) return;
  const std::string t = c.type(v, path);
  if (t == "Sequence") {
    const Value& list = c.member(v, "processors", path);
    for (size_t i = 0; i < list.items().size(); ++i)
      read_post_processor(c, list.items()[i], path + ".processors[" + std::to_string(i) + "]", spec);
  } else if (t == "ByteLevel") {
    // offsets only: no effect on ids
  } else if (t == "TemplateProcessing") {
    const Value& single = c.member(v, "single", path);
    const Value& specials = c.member(v, "special_tokens", path);
    bool seen_a = false;
    for (size_t i = 0; i < single.items().size(); ++i) {
      const Value& item = single.items()[i];
      const std::string ipath = path + ".single[" + std::to_string(i) + "]";
      if (const Value* seq = item.find("Sequence")) {
        if (c.str(*seq, "id", ipath + ".Sequence") != "A" || seen_a) c.bad(ipath, "must be the one sequence A");
        seen_a = true;
      } else if (const Value* st = item.find("SpecialToken")) {
        const std::string name = c.str(*st, "id", ipath + ".SpecialToken");
        const Value* entry = specials.find(name);
        if (!entry) c.bad(path + ".special_tokens", "has no entry '" + name + "'");
        const Value& ids = c.member(*entry, "ids", path + ".special_tokens." + name);
        for (const Value& id : ids.items()) {
          if (!id.is_integer() || id.as_integer() < 0) c.bad(path + ".special_tokens." + name + ".ids", "must hold ids");
          (seen_a ? spec.suffix : spec.prefix).push_back(id.as_integer());
        }
      } else {
        c.bad(ipath, "must be {\"Sequence\": ...} or {\"SpecialToken\": ...}");
      }
    }
    if (!seen_a) c.bad(path + ".single", "has no sequence A");
  } else {
    c.unsupported(path + ".type", "'" + t + "'");
  }
}

void read_vocab_and_merges(const Ctx& c, const Value& m, TokenizerSpec& spec);

// vocab_read: model.vocab and model.merges are in spec already (read_streaming), and absent from m.
void read_model(const Ctx& c, const Value& m, TokenizerSpec& spec, bool vocab_read) {
  const std::string t = c.type(m, "model");
  if (t != "BPE") c.unsupported("model.type", "'" + t + "'");
  if (const Value* d = m.find("dropout"); d && !d->is_null() && !(d->is_number() && d->as_number() == 0.0))
    c.unsupported("model.dropout", "(non-zero)");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (const Value* p = m.find(key); p && !p->is_null() && !(p->is_string() && p->as_string().empty()))
      c.unsupported(std::string("model.") + key, "'" + p->as_string() + "'");
  spec.byte_fallback = c.flag(m, "byte_fallback", "model", false);
  spec.ignore_merges = c.flag(m, "ignore_merges", "model", false);
  spec.fuse_unk = c.flag(m, "fuse_unk", "model", false);
  if (!vocab_read) read_vocab_and_merges(c, m, spec);
  if (const Value* u = m.find("unk_token"); u && u->is_string()) {
    const std::string& unk = u->as_string();
    for (size_t i = 0; i < spec.vocab.size(); ++i)
      if (spec.vocab[i] == unk) spec.unk_id = static_cast<int64_t>(i);
    if (spec.unk_id < 0) c.bad("model.unk_token", "'" + unk + "' is not in the vocabulary");
  }
}

void read_vocab_and_merges(const Ctx& c, const Value& m, TokenizerSpec& spec) {
  const Value& vocab = c.member(m, "vocab", "model");
  if (!vocab.is_object()) c.bad("model.vocab", "must be an object");
  for (const auto& [tok, id] : vocab.members()) {
    if (!id.is_integer() || id.as_integer() < 0 || id.as_integer() > (int64_t{1} << 31))
      c.bad("model.vocab", "id of '" + tok + "' must be a non-negative integer");
    const auto i = static_cast<size_t>(id.as_integer());
    if (spec.vocab.size() <= i) spec.vocab.resize(i + 1);
    if (!spec.vocab[i].empty()) c.bad("model.vocab", "gives id " + std::to_string(i) + " to two tokens");
    if (tok.empty()) c.bad("model.vocab", "holds an empty token");
    spec.vocab[i] = tok;
  }
  const Value& merges = c.member(m, "merges", "model");
  for (size_t i = 0; i < merges.items().size(); ++i) {
    const Value& mg = merges.items()[i];
    const std::string p = "model.merges[" + std::to_string(i) + "]";
    if (mg.is_string()) {
      const std::string& s = mg.as_string();
      const size_t sp = s.find(' ');
      if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos) c.bad(p, "'" + s + "' is not 'a b'");
      spec.merges.emplace_back(s.substr(0, sp), s.substr(sp + 1));
    } else if (mg.is_array() && mg.items().size() == 2 && mg.items()[0].is_string() && mg.items()[1].is_string()) {
      spec.merges.emplace_back(mg.items()[0].as_string(), mg.items()[1].as_string());
    } else {
      c.bad(p, "must be a string 'a b' or a pair of strings");
    }
  }
}

// The streaming read of a tokenizer.json: model.vocab and model.merges (nearly all of the file) go from the text
// straight into the spec through a json::Reader, and only the rest (a few KB) becomes a json::Value tree, so that
// no tree of the whole vocabulary is ever held (SmolLM2's 2 MB file parsed as a tree peaks at about 25 MB). It
// reads only documents that read_vocab_and_merges accepts: anything else (a malformed or unusual vocab or merges,
// a duplicate key, invalid JSON) gives nullopt, and the caller parses the whole document as a tree instead, which
// reports the error exactly as before.
struct NotStreamable {};

void skip_value(json::Reader& r) {  // one value of any kind, nesting bounded as Value::parse bounds it
  std::vector<bool> stack;          // true: an object
  std::string key;
  for (;;) {
    switch (r.peek_kind()) {
      case json::Kind::Object: r.begin_object(), stack.push_back(true); break;
      case json::Kind::Array: r.begin_array(), stack.push_back(false); break;
      case json::Kind::String: r.read_string(); break;
      case json::Kind::Number: r.read_number_text(); break;
      case json::Kind::True: case json::Kind::False: case json::Kind::Null: r.read_literal(); break;
      default: throw NotStreamable{};
    }
    if (stack.size() > 64) throw NotStreamable{};
    for (;;) {
      if (stack.empty()) return;
      if (stack.back() ? r.next_key(key) : r.next_element()) break;
      stack.pop_back();
    }
  }
}

// The text of one value, skipped.
std::string_view value_text(json::Reader& r) {
  r.skip_ws();
  const size_t start = r.pos();
  const std::string_view rest = r.rest();
  skip_value(r);
  return rest.substr(0, r.pos() - start);
}

void stream_vocab(json::Reader& r, std::vector<std::string>& vocab) {
  if (r.peek_kind() != json::Kind::Object) throw NotStreamable{};
  r.begin_object();
  std::string tok;
  while (r.next_key(tok)) {
    if (r.peek_kind() != json::Kind::Number) throw NotStreamable{};
    const uint64_t id = r.read_uint64("id");
    if (id > (uint64_t{1} << 31) || tok.empty()) throw NotStreamable{};
    const auto i = static_cast<size_t>(id);
    if (vocab.size() <= i) vocab.resize(i + 1);
    if (!vocab[i].empty()) throw NotStreamable{};
    vocab[i] = std::move(tok);
    tok.clear();
  }
  // A token twice (a duplicate object key) is an error of the tree parser's.
  std::vector<int32_t> order;
  order.reserve(vocab.size());
  for (size_t i = 0; i < vocab.size(); ++i)
    if (!vocab[i].empty()) order.push_back(static_cast<int32_t>(i));
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return vocab[a] < vocab[b]; });
  for (size_t k = 1; k < order.size(); ++k)
    if (vocab[order[k - 1]] == vocab[order[k]]) throw NotStreamable{};
}

void stream_merges(json::Reader& r, std::vector<std::pair<std::string, std::string>>& merges) {
  if (r.peek_kind() != json::Kind::Array) throw NotStreamable{};
  r.begin_array();
  while (r.next_element()) {
    const json::Kind k = r.peek_kind();
    if (k == json::Kind::String) {
      const std::string s = r.read_string();
      const size_t sp = s.find(' ');
      if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos) throw NotStreamable{};
      merges.emplace_back(s.substr(0, sp), s.substr(sp + 1));
    } else if (k == json::Kind::Array) {
      r.begin_array();
      std::string pair[2];
      for (auto& part : pair) {
        if (!r.next_element() || r.peek_kind() != json::Kind::String) throw NotStreamable{};
        part = r.read_string();
      }
      if (r.next_element()) throw NotStreamable{};
      merges.emplace_back(std::move(pair[0]), std::move(pair[1]));
    } else {
      throw NotStreamable{};
    }
  }
}

// spec.vocab and spec.merges from the text, and the document without them (model keeps its other members).
std::optional<Value> read_streaming(const std::string& text, const std::string& path, TokenizerSpec& spec) {
  try {
    json::Reader r(text, "[tokenizer] " + path);
    if (r.peek_kind() != json::Kind::Object) return std::nullopt;
    std::string rest = "{", key;
    bool model_seen = false;
    r.begin_object();
    while (r.next_key(key)) {
      if (rest.size() > 1) rest += ',';
      json::append_quoted(rest, key);
      rest += ':';
      if (key != "model") {
        rest += value_text(r);
        continue;
      }
      if (model_seen || r.peek_kind() != json::Kind::Object) return std::nullopt;
      model_seen = true;
      bool vocab_seen = false, merges_seen = false;
      std::string model = "{", mkey;
      r.begin_object();
      while (r.next_key(mkey)) {
        if (mkey == "vocab" || mkey == "merges") {
          bool& seen = mkey == "vocab" ? vocab_seen : merges_seen;
          if (seen) return std::nullopt;
          seen = true;
          if (mkey == "vocab") stream_vocab(r, spec.vocab);
          else stream_merges(r, spec.merges);
          continue;
        }
        if (model.size() > 1) model += ',';
        json::append_quoted(model, mkey);
        model += ':';
        model += value_text(r);
      }
      if (!vocab_seen || !merges_seen) return std::nullopt;
      rest += model;
      rest += '}';
    }
    r.expect_end();
    if (!model_seen) return std::nullopt;
    rest += '}';
    return Value::parse(rest, "[tokenizer] " + path);
  } catch (const NotStreamable&) {
  } catch (const std::exception&) {  // invalid JSON: the tree parser names it (and its byte) below
  }
  return std::nullopt;
}

// tokenizer_config.json / special_tokens_map.json: "bos_token": "<s>" or {"content": "<s>", ...}.
std::string config_token(const Value& cfg, const char* key) {
  const Value* v = cfg.find(key);
  if (!v) return "";
  if (v->is_string()) return v->as_string();
  if (v->is_object())
    if (const Value* content = v->find("content"); content && content->is_string()) return content->as_string();
  return "";
}

}  // namespace

TokenizerSpec read_tokenizer_json(const std::string& path, bool stream) {
  TokenizerSpec spec;
  Value doc;
  bool vocab_read = false;
  {
    const std::string text = read_text(path);
    std::optional<Value> rest;
    if (stream) rest = read_streaming(text, path, spec);
    if (rest) {
      doc = std::move(*rest);
      vocab_read = true;
    } else {
      spec = TokenizerSpec{};
      doc = Value::parse(text, "[tokenizer] " + path);
    }
  }
  const Ctx c{path};
  if (!doc.is_object()) c.bad("the document", "must be an object");
  spec.source = path;
  for (const char* key : {"truncation", "padding"})
    if (const Value* v = doc.find(key); v && !v->is_null()) c.unsupported(key, "(not null)");
  read_model(c, c.member(doc, "model", "tokenizer.json"), spec, vocab_read);
  if (const Value* added = doc.find("added_tokens"); added && !added->is_null()) {
    for (size_t i = 0; i < added->items().size(); ++i) {
      const Value& a = added->items()[i];
      const std::string p = "added_tokens[" + std::to_string(i) + "]";
      const Value& id = c.member(a, "id", p);
      if (!id.is_integer() || id.as_integer() < 0) c.bad(p + ".id", "must be a non-negative integer");
      AddedToken t;
      t.id = id.as_integer();
      t.content = c.str(a, "content", p);
      t.special = c.flag(a, "special", p, false);
      t.lstrip = c.flag(a, "lstrip", p, false);
      t.rstrip = c.flag(a, "rstrip", p, false);
      t.normalized = c.flag(a, "normalized", p, !t.special);
      t.single_word = c.flag(a, "single_word", p, false);
      if (t.single_word) c.unsupported(p + ".single_word", "true");
      spec.added.push_back(t);
    }
  }
  if (const Value* v = doc.find("normalizer")) read_normalizer(c, *v, "normalizer", spec.normalizer);
  if (const Value* v = doc.find("pre_tokenizer")) read_pre_tokenizer(c, *v, "pre_tokenizer", spec.pre_tokenizer);
  if (const Value* v = doc.find("post_processor")) read_post_processor(c, *v, "post_processor", spec);
  if (const Value* v = doc.find("decoder")) read_decoder(c, *v, "decoder", spec.decoder);
  if (!spec.normalizer.empty())
    for (const auto& a : spec.added)
      if (a.normalized) c.unsupported("added_tokens '" + a.content + "' normalized", "true beside a normalizer");

  // bos / eos from the files transformers reads beside tokenizer.json.
  namespace fs = std::filesystem;
  const fs::path dir = fs::path(path).parent_path();
  auto find_id = [&](const std::string& tok) -> int64_t {
    if (tok.empty()) return -1;
    for (const auto& a : spec.added)
      if (a.content == tok) return a.id;
    for (size_t i = 0; i < spec.vocab.size(); ++i)
      if (spec.vocab[i] == tok) return static_cast<int64_t>(i);
    return -1;
  };
  for (const char* name : {"special_tokens_map.json", "tokenizer_config.json"}) {
    const fs::path p = dir / name;
    std::error_code ec;
    if (!fs::is_regular_file(p, ec)) continue;
    const Value cfg = Value::parse(read_text(p.string()), "[tokenizer] " + p.string());
    if (const int64_t id = find_id(config_token(cfg, "bos_token")); id >= 0) spec.bos_id = id;
    if (const int64_t id = find_id(config_token(cfg, "eos_token")); id >= 0) spec.eos_id = id;
    if (const int64_t id = find_id(config_token(cfg, "pad_token")); id >= 0) spec.pad_id = id;
  }
  return spec;
}

std::unique_ptr<Tokenizer> load_tokenizer_json(const std::string& path) {
  return make_tokenizer(read_tokenizer_json(path));
}

}  // namespace qkv::text
