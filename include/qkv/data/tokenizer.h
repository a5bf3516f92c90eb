// Tokenizers that split text into token strings: character-level (UTF-8 code points), whitespace word-level and
// byte-level. Each round-trips through detokenize() (word-level normalises runs of whitespace to one space).
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace qkv::data {

enum class TokenizerKind {
  kChar,  // one token per UTF-8 code point; a byte that is not part of valid UTF-8 is a token of its own
  kWord,  // tokens are the runs of non-whitespace (ASCII space, \t, \n, \v, \f, \r separate them)
  kByte,  // one token per byte
};

// "char" | "word" | "byte".
const char* tokenizer_name(TokenizerKind kind);
// Inverse of tokenizer_name; throws invalid_argument "[tokenizer] unknown tokenizer 'x' (choose char, word or byte)".
TokenizerKind tokenizer_from_string(const std::string& name);

// text -> token strings (never empty strings). Empty or all-whitespace text gives no tokens.
std::vector<std::string> tokenize(std::string_view text, TokenizerKind kind);
// tokens -> text: concatenation for char and byte, words joined by one space for word.
std::string detokenize(const std::vector<std::string>& tokens, TokenizerKind kind);

// The byte length of the UTF-8 sequence starting at text[pos] (1..4), or 0 when it is not valid UTF-8 there
// (overlong forms, surrogates and code points above U+10FFFF are invalid). pos < text.size().
size_t utf8_sequence_length(std::string_view text, size_t pos);

}  // namespace qkv::data
