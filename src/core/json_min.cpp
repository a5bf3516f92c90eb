// Minimal strict JSON pull reader: UTF-8 validation, strings with escapes and surrogate pairs, unsigned integers.
// No recursion and no DOM: the caller walks the structure it expects, so nothing grows beyond the input size.
#include "json_min.h"

#include <stdexcept>

#include "qkv/core/error.h"

namespace qkv::json {

size_t first_invalid_utf8(std::string_view text) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  size_t i = 0;
  while (i < n) {
    const unsigned char c = s[i];
    if (c < 0x80) { ++i; continue; }
    size_t len = 0;
    uint32_t cp = 0, min = 0;
    if ((c & 0xE0) == 0xC0) { len = 2; cp = c & 0x1F; min = 0x80; }
    else if ((c & 0xF0) == 0xE0) { len = 3; cp = c & 0x0F; min = 0x800; }
    else if ((c & 0xF8) == 0xF0) { len = 4; cp = c & 0x07; min = 0x10000; }
    else return i;  // continuation byte or 0xF8..0xFF as a lead byte
    if (n - i < len) return i;
    for (size_t k = 1; k < len; ++k) {
      if ((s[i + k] & 0xC0) != 0x80) return i;
      cp = (cp << 6) | (s[i + k] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return i;
    i += len;
  }
  return std::string_view::npos;
}

void append_quoted(std::string& out, std::string_view s) {
  static const char* hex = "0123456789abcdef";
  out += '"';
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20) {
          out += "\\u00";
          out += hex[c >> 4];
          out += hex[c & 15];
        } else {
          out += ch;
        }
    }
  }
  out += '"';
}

const char* kind_name(Kind kind) {
  switch (kind) {
    case Kind::Object: return "an object";
    case Kind::Array: return "an array";
    case Kind::String: return "a string";
    case Kind::Number: return "a number";
    case Kind::True:
    case Kind::False: return "a boolean";
    case Kind::Null: return "null";
    case Kind::End: return "the end of the text";
    case Kind::Invalid: break;
  }
  return "an invalid token";
}

Reader::Reader(std::string_view text, std::string context) : text_(text), context_(std::move(context)) {
  const size_t bad = first_invalid_utf8(text_);
  if (bad != std::string_view::npos) fail_at(bad, "not valid UTF-8");
}

void Reader::fail_at(size_t offset, const std::string& what) const {
  throw std::invalid_argument(detail::concat(context_, ": ", what, " (at byte ", offset, ")"));
}

void Reader::fail(const std::string& what) const { fail_at(pos_, what); }

void Reader::skip_ws() {
  while (pos_ < text_.size()) {
    const char c = text_[pos_];
    if (c != ' ' && c != '\t' && c != '\n' && c != '\r') break;
    ++pos_;
  }
}

Kind Reader::peek_kind() {
  skip_ws();
  if (pos_ >= text_.size()) return Kind::End;
  switch (text_[pos_]) {
    case '{': return Kind::Object;
    case '[': return Kind::Array;
    case '"': return Kind::String;
    case 't': return Kind::True;
    case 'f': return Kind::False;
    case 'n': return Kind::Null;
    case '-': return Kind::Number;
    default: break;
  }
  const char c = text_[pos_];
  return (c >= '0' && c <= '9') ? Kind::Number : Kind::Invalid;
}

bool Reader::consume(char c) {
  skip_ws();
  if (pos_ < text_.size() && text_[pos_] == c) {
    ++pos_;
    return true;
  }
  return false;
}

void Reader::expect(char c, const char* what) {
  if (!consume(c)) {
    if (pos_ >= text_.size()) fail(detail::concat("invalid JSON: unexpected end, expected ", what));
    fail(detail::concat("invalid JSON: expected ", what));
  }
}

void Reader::begin_object() {
  expect('{', "'{'");
  first_ = true;
}

void Reader::begin_array() {
  expect('[', "'['");
  first_ = true;
}

bool Reader::next_key(std::string& key) {
  // first member: '}' closes an empty object; later members: '}' closes, ',' continues.
  if (first_) {
    first_ = false;
    if (consume('}')) return false;
  } else {
    if (consume('}')) return false;
    expect(',', "',' or '}' after an object member");
  }
  if (peek_kind() != Kind::String) {
    skip_ws();
    if (pos_ < text_.size() && text_[pos_] == '}') fail("invalid JSON: trailing comma before '}'");
    fail("invalid JSON: expected a string key");
  }
  key = read_string();
  expect(':', "':' after an object key");
  return true;
}

bool Reader::next_element() {
  if (first_) {
    first_ = false;
    return !consume(']');
  }
  if (consume(']')) return false;
  expect(',', "',' or ']' after an array element");
  skip_ws();
  if (pos_ < text_.size() && text_[pos_] == ']') fail("invalid JSON: trailing comma before ']'");
  return true;
}

uint32_t Reader::read_hex4() {
  if (text_.size() - pos_ < 4) fail("invalid JSON: truncated \\u escape");
  uint32_t v = 0;
  for (int k = 0; k < 4; ++k) {
    const char c = text_[pos_++];
    v <<= 4;
    if (c >= '0' && c <= '9') v |= static_cast<uint32_t>(c - '0');
    else if (c >= 'a' && c <= 'f') v |= static_cast<uint32_t>(c - 'a' + 10);
    else if (c >= 'A' && c <= 'F') v |= static_cast<uint32_t>(c - 'A' + 10);
    else fail_at(pos_ - 1, "invalid JSON: bad hex digit in \\u escape");
  }
  return v;
}

void Reader::append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

std::string Reader::read_string() {
  skip_ws();
  if (pos_ >= text_.size() || text_[pos_] != '"') fail("invalid JSON: expected a string");
  const size_t start = pos_++;
  std::string out;
  while (true) {
    if (pos_ >= text_.size()) fail_at(start, "invalid JSON: unterminated string");
    const char c = text_[pos_];
    if (c == '"') {
      ++pos_;
      return out;
    }
    if (static_cast<unsigned char>(c) < 0x20) fail("invalid JSON: control character in a string");
    if (c != '\\') {
      out += c;  // raw UTF-8 was validated by the constructor
      ++pos_;
      continue;
    }
    if (++pos_ >= text_.size()) fail_at(start, "invalid JSON: unterminated string");
    const char e = text_[pos_++];
    switch (e) {
      case '"': out += '"'; break;
      case '\\': out += '\\'; break;
      case '/': out += '/'; break;
      case 'b': out += '\b'; break;
      case 'f': out += '\f'; break;
      case 'n': out += '\n'; break;
      case 'r': out += '\r'; break;
      case 't': out += '\t'; break;
      case 'u': {
        const size_t at = pos_ - 2;
        uint32_t cp = read_hex4();
        if (cp >= 0xDC00 && cp <= 0xDFFF) fail_at(at, "invalid JSON: lone low surrogate in \\u escape");
        if (cp >= 0xD800 && cp <= 0xDBFF) {
          if (text_.size() - pos_ < 2 || text_[pos_] != '\\' || text_[pos_ + 1] != 'u')
            fail_at(at, "invalid JSON: lone high surrogate in \\u escape");
          pos_ += 2;
          const uint32_t lo = read_hex4();
          if (lo < 0xDC00 || lo > 0xDFFF) fail_at(at, "invalid JSON: high surrogate not followed by a low one");
          cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
        }
        append_utf8(out, cp);
        break;
      }
      default: fail_at(pos_ - 2, "invalid JSON: invalid escape sequence");
    }
  }
}

uint64_t Reader::read_uint64(const std::string& what) {
  skip_ws();
  const size_t start = pos_;
  const size_t n = text_.size();
  auto digit = [&](size_t i) { return i < n && text_[i] >= '0' && text_[i] <= '9'; };
  // Scan the whole token with JSON's number grammar first, so errors can quote it.
  size_t i = pos_;
  const bool negative = i < n && text_[i] == '-';
  if (negative) ++i;
  if (!digit(i)) {
    if (peek_kind() == Kind::Number) fail("invalid JSON: invalid number");
    fail(detail::concat(what, " must be a non-negative integer, got ", kind_name(peek_kind())));
  }
  if (text_[i] == '0' && digit(i + 1)) fail_at(i, "invalid JSON: number with a leading zero");
  while (digit(i)) ++i;
  const size_t int_end = i;
  bool fractional = false;
  if (i < n && text_[i] == '.') {
    ++i;
    if (!digit(i)) fail_at(i, "invalid JSON: digits expected after '.'");
    while (digit(i)) ++i;
    fractional = true;
  }
  if (i < n && (text_[i] == 'e' || text_[i] == 'E')) {
    ++i;
    if (i < n && (text_[i] == '+' || text_[i] == '-')) ++i;
    if (!digit(i)) fail_at(i, "invalid JSON: digits expected in exponent");
    while (digit(i)) ++i;
    fractional = true;
  }
  const std::string token(text_.substr(start, i - start));
  if (negative) fail_at(start, detail::concat(what, " must be non-negative, got ", token));
  if (fractional) fail_at(start, detail::concat(what, " must be an integer, got ", token));
  uint64_t v = 0;
  for (size_t k = start; k < int_end; ++k) {
    const auto d = static_cast<uint64_t>(text_[k] - '0');
    if (__builtin_mul_overflow(v, uint64_t{10}, &v) || __builtin_add_overflow(v, d, &v))
      fail_at(start, detail::concat(what, " ", token, " does not fit in 64 bits"));
  }
  pos_ = i;
  return v;
}

}  // namespace qkv::json
