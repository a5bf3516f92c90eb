// Character-level (UTF-8), whitespace word-level and byte-level tokenizers.
// No locale is consulted: whitespace is the ASCII set, characters are decoded by hand.
#include "qkv/data/tokenizer.h"

#include "qkv/core/error.h"
#include "qkv/core/utf8.h"

namespace qkv::data {
namespace {

bool is_space(unsigned char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r'; }

}  // namespace

const char* tokenizer_name(TokenizerKind kind) {
  switch (kind) {
    case TokenizerKind::kChar: return "char";
    case TokenizerKind::kWord: return "word";
    case TokenizerKind::kByte: return "byte";
  }
  return "?";
}

TokenizerKind tokenizer_from_string(const std::string& name) {
  if (name == "char") return TokenizerKind::kChar;
  if (name == "word") return TokenizerKind::kWord;
  if (name == "byte") return TokenizerKind::kByte;
  throw std::invalid_argument("[tokenizer] unknown tokenizer '" + name + "' (choose char, word or byte)");
}

size_t utf8_sequence_length(std::string_view s, size_t pos) {
  QKV_CHECK_ARG(pos < s.size(), "[tokenizer] utf8_sequence_length: position ", pos, " is past the text (size ",
                s.size(), ")");
  return utf8_decode(s, pos);
}

std::vector<std::string> tokenize(std::string_view text, TokenizerKind kind) {
  std::vector<std::string> out;
  switch (kind) {
    case TokenizerKind::kByte:
      out.reserve(text.size());
      for (char c : text) out.emplace_back(1, c);
      break;
    case TokenizerKind::kChar:
      for (size_t i = 0; i < text.size();) {
        const size_t n = utf8_sequence_length(text, i);
        const size_t len = n == 0 ? 1 : n;
        out.emplace_back(text.substr(i, len));
        i += len;
      }
      break;
    case TokenizerKind::kWord:
      for (size_t i = 0; i < text.size();) {
        while (i < text.size() && is_space(static_cast<unsigned char>(text[i]))) ++i;
        size_t j = i;
        while (j < text.size() && !is_space(static_cast<unsigned char>(text[j]))) ++j;
        if (j > i) out.emplace_back(text.substr(i, j - i));
        i = j;
      }
      break;
  }
  return out;
}

std::string detokenize(const std::vector<std::string>& tokens, TokenizerKind kind) {
  std::string out;
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (kind == TokenizerKind::kWord && i > 0) out += ' ';
    out += tokens[i];
  }
  return out;
}

}  // namespace qkv::data
