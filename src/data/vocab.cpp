// Vocabulary: building from a corpus, encoding/decoding ids, and the escaped one-token-per-line text format.
#include "qkv/data/vocab.h"

#include <algorithm>
#include <fstream>
#include <map>
#include <sstream>

#include "qkv/core/error.h"
#include "qkv/core/io.h"

namespace qkv::data {
namespace {

const char* const kSpecialNames[Vocabulary::kNumSpecials] = {"<pad>", "<bos>", "<eos>", "<unk>"};

bool is_special_name(std::string_view t) {
  for (const char* s : kSpecialNames)
    if (t == s) return true;
  return false;
}

std::string escape(const std::string& t) {
  std::string out;
  for (size_t i = 0; i < t.size();) {
    const unsigned char c = static_cast<unsigned char>(t[i]);
    if (c >= 0x80) {
      const size_t n = utf8_sequence_length(t, i);
      if (n > 0) {
        out.append(t, i, n);
        i += n;
        continue;
      }
    }
    if (c == '\\') out += "\\\\";
    else if (c == '\n') out += "\\n";
    else if (c == '\t') out += "\\t";
    else if (c == '\r') out += "\\r";
    else if (c <= 0x20 || c >= 0x7F) {
      static const char* hex = "0123456789abcdef";
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 15];
    } else {
      out += static_cast<char>(c);
    }
    ++i;
  }
  return out;
}

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

Vocabulary::Vocabulary(TokenizerKind kind) : kind_(kind) {
  for (const char* s : kSpecialNames) tokens_.emplace_back(s);
}

Vocabulary Vocabulary::build(const std::vector<std::string>& texts, TokenizerKind kind, int64_t min_freq,
                             int64_t max_size) {
  QKV_CHECK_ARG(min_freq >= 1, "[vocab] min_freq must be >= 1, got ", min_freq);
  QKV_CHECK_ARG(max_size >= 0, "[vocab] max_size must be >= 0 (0 = no limit), got ", max_size);
  Vocabulary v(kind);
  if (kind == TokenizerKind::kByte) {
    for (int b = 0; b < 256; ++b) v.add(std::string(1, static_cast<char>(b)));
    return v;
  }
  std::map<std::string, int64_t> counts;  // byte order for ties
  for (const std::string& t : texts)
    for (std::string& tok : tokenize(t, kind)) ++counts[std::move(tok)];
  std::vector<std::pair<std::string, int64_t>> items;
  for (auto& [tok, n] : counts)
    if (n >= min_freq && !is_special_name(tok)) items.emplace_back(tok, n);
  std::stable_sort(items.begin(), items.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
  if (max_size > 0 && static_cast<int64_t>(items.size()) > max_size) items.resize(static_cast<size_t>(max_size));
  for (auto& [tok, n] : items) v.add(tok);
  return v;
}

int64_t Vocabulary::add(const std::string& token) {
  QKV_CHECK_ARG(!token.empty(), "[vocab] cannot add an empty token");
  QKV_CHECK_ARG(!is_special_name(token), "[vocab] '", token, "' is the name of a special token");
  auto it = index_.find(token);
  if (it != index_.end()) return it->second;
  const int64_t id = size();
  tokens_.push_back(token);
  index_.emplace(token, id);
  return id;
}

int64_t Vocabulary::id(std::string_view token) const {
  auto it = index_.find(std::string(token));
  return it == index_.end() ? kUnk : it->second;
}

bool Vocabulary::contains(std::string_view token) const { return index_.count(std::string(token)) > 0; }

const std::string& Vocabulary::token(int64_t id) const {
  QKV_CHECK_ARG(id >= 0 && id < size(), "[vocab] id ", id, " is out of range [0, ", size(), ")");
  return tokens_[static_cast<size_t>(id)];
}

std::vector<int64_t> Vocabulary::encode(std::string_view text, bool add_bos, bool add_eos) const {
  std::vector<int64_t> ids;
  if (add_bos) ids.push_back(kBos);
  for (const std::string& tok : tokenize(text, kind_)) ids.push_back(id(tok));
  if (add_eos) ids.push_back(kEos);
  return ids;
}

std::vector<std::string> Vocabulary::unknown_tokens(std::string_view text) const {
  std::vector<std::string> out;
  for (const std::string& tok : tokenize(text, kind_))
    if (!contains(tok) && std::find(out.begin(), out.end(), tok) == out.end()) out.push_back(tok);
  return out;
}

std::string Vocabulary::decode(const std::vector<int64_t>& ids) const {
  std::vector<std::string> toks;
  for (int64_t i : ids) {
    const std::string& t = token(i);
    if (i == kEos) break;
    if (i == kPad || i == kBos) continue;
    toks.push_back(t);
  }
  return detokenize(toks, kind_);
}

std::vector<std::string> Vocabulary::tokens_of(const std::vector<int64_t>& ids) const {
  std::vector<std::string> out;
  out.reserve(ids.size());
  for (int64_t i : ids) out.push_back(token(i));
  return out;
}

std::string Vocabulary::serialize() const {
  std::string out = std::string("qkv-vocab 1 ") + tokenizer_name(kind_) + "\n";
  for (const std::string& t : tokens_) {
    out += escape(t);
    out += '\n';
  }
  return out;
}

Vocabulary Vocabulary::parse(std::string_view text, const std::string& name) {
  std::vector<std::string> lines;
  size_t start = 0;
  while (start < text.size()) {
    size_t nl = text.find('\n', start);
    if (nl == std::string_view::npos) nl = text.size();
    lines.emplace_back(text.substr(start, nl - start));
    start = nl + 1;
  }
  QKV_CHECK_ARG(!lines.empty(), "[vocab] ", name, ": empty vocabulary file");
  const std::string prefix = "qkv-vocab 1 ";
  QKV_CHECK_ARG(lines[0].rfind(prefix, 0) == 0, "[vocab] ", name,
                ":1: expected the header 'qkv-vocab 1 <char|word|byte>'");
  Vocabulary v(tokenizer_from_string(lines[0].substr(prefix.size())));
  QKV_CHECK_ARG(static_cast<int64_t>(lines.size()) >= 1 + kNumSpecials, "[vocab] ", name,
                ": the four special tokens are missing");
  for (size_t i = 0; i < static_cast<size_t>(kNumSpecials); ++i)
    QKV_CHECK_ARG(lines[1 + i] == kSpecialNames[i], "[vocab] ", name, ":", i + 2, ": expected '", kSpecialNames[i],
                  "', got '", lines[1 + i], "'");
  for (size_t ln = 1 + kNumSpecials; ln < lines.size(); ++ln) {
    const std::string& e = lines[ln];
    std::string tok;
    for (size_t i = 0; i < e.size(); ++i) {
      if (e[i] != '\\') {
        tok += e[i];
        continue;
      }
      QKV_CHECK_ARG(i + 1 < e.size(), "[vocab] ", name, ":", ln + 1, ": dangling backslash");
      const char c = e[++i];
      if (c == '\\') tok += '\\';
      else if (c == 'n') tok += '\n';
      else if (c == 't') tok += '\t';
      else if (c == 'r') tok += '\r';
      else if (c == 'x' && i + 2 < e.size() && hex_value(e[i + 1]) >= 0 && hex_value(e[i + 2]) >= 0) {
        tok += static_cast<char>(hex_value(e[i + 1]) * 16 + hex_value(e[i + 2]));
        i += 2;
      } else {
        throw std::invalid_argument(detail::concat("[vocab] ", name, ":", ln + 1, ": bad escape '\\", c, "'"));
      }
    }
    QKV_CHECK_ARG(!tok.empty(), "[vocab] ", name, ":", ln + 1, ": empty token");
    QKV_CHECK_ARG(!is_special_name(tok), "[vocab] ", name, ":", ln + 1, ": special token '", tok,
                  "' appears again");
    QKV_CHECK_ARG(!v.contains(tok), "[vocab] ", name, ":", ln + 1, ": duplicate token '", e, "'");
    v.add(tok);
  }
  return v;
}

void Vocabulary::save(const std::string& path) const { write_file_atomic(path, serialize()); }

Vocabulary Vocabulary::load(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  QKV_CHECK_RUNTIME(in.good(), "[vocab] cannot open '", path, "'");
  std::ostringstream ss;
  ss << in.rdbuf();
  return parse(ss.str(), path);
}

}  // namespace qkv::data
