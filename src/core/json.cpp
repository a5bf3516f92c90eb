// The one JSON reader/writer: the strict pull Reader (UTF-8 validation, strings with escapes and surrogate pairs,
// numbers), Value::parse over it (bounded recursion), and Value's deterministic printer.
#include "qkv/core/json.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <stdexcept>
#include <unordered_set>

#include "qkv/core/error.h"
#include "qkv/core/utf8.h"

namespace qkv::json {

size_t first_invalid_utf8(std::string_view text) {
  for (size_t i = 0; i < text.size();) {
    const size_t n = utf8_decode(text, i);
    if (n == 0) return i;
    i += n;
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
        utf8_append(static_cast<char32_t>(cp), out);
        break;
      }
      default: fail_at(pos_ - 2, "invalid JSON: invalid escape sequence");
    }
  }
}

// Scans one number token from `start` with JSON's grammar (the caller has checked that a digit or '-' is there);
// returns its end, the end of its integer part and whether it has a fraction or exponent.
size_t Reader::scan_number(size_t start, size_t& int_end, bool& fractional) const {
  const size_t n = text_.size();
  auto digit = [&](size_t i) { return i < n && text_[i] >= '0' && text_[i] <= '9'; };
  size_t i = start;
  if (i < n && text_[i] == '-') ++i;
  if (!digit(i)) fail_at(start, "invalid JSON: invalid number");
  if (text_[i] == '0' && digit(i + 1)) fail_at(i, "invalid JSON: number with a leading zero");
  while (digit(i)) ++i;
  int_end = i;
  fractional = false;
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
  return i;
}

uint64_t Reader::read_uint64(const std::string& what) {
  skip_ws();
  const size_t start = pos_;
  const size_t n = text_.size();
  const bool negative = start < n && text_[start] == '-';
  const size_t first = negative ? start + 1 : start;
  if (!(first < n && text_[first] >= '0' && text_[first] <= '9')) {
    if (peek_kind() == Kind::Number) fail("invalid JSON: invalid number");
    fail(detail::concat(what, " must be a non-negative integer, got ", kind_name(peek_kind())));
  }
  // Scan the whole token with JSON's number grammar first, so errors can quote it.
  size_t int_end = 0;
  bool fractional = false;
  const size_t end = scan_number(start, int_end, fractional);
  const std::string token(text_.substr(start, end - start));
  if (negative) fail_at(start, detail::concat(what, " must be non-negative, got ", token));
  if (fractional) fail_at(start, detail::concat(what, " must be an integer, got ", token));
  uint64_t v = 0;
  for (size_t k = start; k < int_end; ++k) {
    const auto d = static_cast<uint64_t>(text_[k] - '0');
    if (__builtin_mul_overflow(v, uint64_t{10}, &v) || __builtin_add_overflow(v, d, &v))
      fail_at(start, detail::concat(what, " ", token, " does not fit in 64 bits"));
  }
  pos_ = end;
  return v;
}

std::string Reader::read_number_text() {
  if (peek_kind() != Kind::Number) fail(detail::concat("invalid JSON: expected a number, got ", kind_name(peek_kind())));
  size_t int_end = 0;
  bool fractional = false;
  const size_t start = pos_;
  pos_ = scan_number(start, int_end, fractional);
  return std::string(text_.substr(start, pos_ - start));
}

std::string Reader::read_literal() {
  skip_ws();
  for (const char* word : {"true", "false", "null"}) {
    const std::string_view w(word);
    if (text_.substr(pos_, w.size()) == w) {
      pos_ += w.size();
      return std::string(w);
    }
  }
  fail("invalid JSON: invalid literal (expected true, false or null)");
}

void Reader::expect_end() {
  skip_ws();
  if (pos_ != text_.size()) fail("invalid JSON: unexpected text after the document");
}

// --- Value ---------------------------------------------------------------------------------------------------------

// Builds a Value tree over a Reader; recursion is bounded by kMaxDepth.
class Parser {
 public:
  Parser(std::string_view text, const std::string& context) : r_(text, context) {}

  Value document() {
    Value v = value(0);
    r_.expect_end();
    return v;
  }

 private:
  static constexpr int kMaxDepth = 64;

  Value value(int depth) {
    if (depth > kMaxDepth) r_.fail("invalid JSON: nesting deeper than 64");
    Value v;
    switch (r_.peek_kind()) {
      case Kind::Object: {
        v.type_ = Value::Type::kObject;
        std::unordered_set<std::string> keys;
        std::string key;
        r_.begin_object();
        while (r_.next_key(key)) {
          const size_t at = r_.pos();
          if (!keys.insert(key).second) r_.fail_at(at, "invalid JSON: duplicate key \"" + key + "\"");
          Value member = value(depth + 1);
          v.members_.emplace_back(key, std::move(member));
        }
        return v;
      }
      case Kind::Array: {
        v.type_ = Value::Type::kArray;
        r_.begin_array();
        while (r_.next_element()) {
          Value item = value(depth + 1);
          v.items_.push_back(std::move(item));
        }
        return v;
      }
      case Kind::String: return Value(r_.read_string());
      case Kind::True:
      case Kind::False:
      case Kind::Null: {
        const std::string w = r_.read_literal();  // the first character fixed which one it can be
        if (w == "null") return v;
        return Value(w == "true");
      }
      case Kind::Number: return number();
      case Kind::End: r_.fail("invalid JSON: unexpected end of the text");
      case Kind::Invalid: break;
    }
    r_.fail("invalid JSON: unexpected character");
  }

  Value number() {
    const size_t at = r_.pos();
    const std::string token = r_.read_number_text();
    const char* b = token.data();
    const char* e = b + token.size();
    if (token.find_first_of(".eE") == std::string::npos) {
      int64_t i = 0;
      const auto [p, ec] = std::from_chars(b, e, i);
      if (ec == std::errc() && p == e) return Value(i);
    }
    double d = 0;
    const auto [p, ec] = std::from_chars(b, e, d);
    if (ec != std::errc() || p != e || !std::isfinite(d)) r_.fail_at(at, "number " + token + " is out of range");
    return Value(d);
  }

  Reader r_;
};

Value Value::parse(std::string_view text, const std::string& context) { return Parser(text, context).document(); }

Value::Value(const std::vector<double>& v) : type_(Type::kArray) {
  for (double x : v) items_.emplace_back(x);
}
Value::Value(const std::vector<int64_t>& v) : type_(Type::kArray) {
  for (int64_t x : v) items_.emplace_back(x);
}
Value::Value(const std::vector<std::string>& v) : type_(Type::kArray) {
  for (const auto& x : v) items_.emplace_back(x);
}

Value Value::array() {
  Value j;
  j.type_ = Type::kArray;
  return j;
}
Value Value::object() {
  Value j;
  j.type_ = Type::kObject;
  return j;
}

Value& Value::push(Value v) {
  if (type_ == Type::kNull) type_ = Type::kArray;
  if (type_ != Type::kArray) throw std::invalid_argument("[json] push on a value that is not an array");
  items_.push_back(std::move(v));
  return *this;
}

Value& Value::set(const std::string& key, Value v) {
  if (type_ == Type::kNull) type_ = Type::kObject;
  if (type_ != Type::kObject) throw std::invalid_argument("[json] set('" + key + "') on a value that is not an object");
  for (auto& m : members_)
    if (m.first == key) {
      m.second = std::move(v);
      return *this;
    }
  members_.emplace_back(key, std::move(v));
  return *this;
}

const Value* Value::find(const std::string& key) const {
  if (type_ != Type::kObject) return nullptr;
  for (const auto& m : members_)
    if (m.first == key) return &m.second;
  return nullptr;
}

const Value& Value::at(const std::string& key) const {
  if (type_ != Type::kObject) throw std::invalid_argument("[json] at('" + key + "') on a value that is not an object");
  const Value* v = find(key);
  if (!v) throw std::invalid_argument("[json] no member '" + key + "'");
  return *v;
}

size_t Value::size() const {
  return type_ == Type::kArray ? items_.size() : type_ == Type::kObject ? members_.size() : 0;
}

namespace {

void newline(std::string& out, int indent, int depth) {
  if (indent <= 0) return;
  out.push_back('\n');
  out.append(static_cast<size_t>(indent) * depth, ' ');
}

}  // namespace

void Value::write(std::string& out, int indent, int depth) const {
  switch (type_) {
    case Type::kNull: out += "null"; return;
    case Type::kBool: out += bool_ ? "true" : "false"; return;
    case Type::kNumber: {
      if (integer_) {
        out += std::to_string(int_);
      } else if (!std::isfinite(num_)) {
        out += "null";
      } else if (num_ == std::floor(num_) && std::abs(num_) < 1e15) {
        out += std::to_string(static_cast<int64_t>(num_));
      } else {
        char buf[32];
        std::snprintf(buf, sizeof buf, "%.10g", num_);
        out += buf;
      }
      return;
    }
    case Type::kString: append_quoted(out, str_); return;
    case Type::kArray: {
      bool flat = true;  // arrays of scalars stay on one line
      for (const Value& j : items_) flat = flat && j.type_ != Type::kArray && j.type_ != Type::kObject;
      out.push_back('[');
      for (size_t i = 0; i < items_.size(); ++i) {
        if (i) out += flat || indent <= 0 ? ", " : ",";
        if (!flat) newline(out, indent, depth + 1);
        items_[i].write(out, indent, depth + 1);
      }
      if (!flat && !items_.empty()) newline(out, indent, depth);
      out.push_back(']');
      return;
    }
    case Type::kObject: {
      out.push_back('{');
      for (size_t i = 0; i < members_.size(); ++i) {
        if (i) out.push_back(',');
        newline(out, indent, depth + 1);
        if (indent <= 0 && i) out.push_back(' ');
        append_quoted(out, members_[i].first);
        out += ": ";
        members_[i].second.write(out, indent, depth + 1);
      }
      if (!members_.empty()) newline(out, indent, depth);
      out.push_back('}');
      return;
    }
  }
}

std::string Value::dump(int indent) const {
  std::string out;
  write(out, indent, 0);
  if (indent > 0) out.push_back('\n');
  return out;
}

const char* type_name(Value::Type type) {
  switch (type) {
    case Value::Type::kNull: return "null";
    case Value::Type::kBool: return "a boolean";
    case Value::Type::kNumber: return "a number";
    case Value::Type::kString: return "a string";
    case Value::Type::kArray: return "an array";
    case Value::Type::kObject: return "an object";
  }
  return "?";
}

}  // namespace qkv::json
