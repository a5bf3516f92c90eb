// Minimal strict JSON pull reader (RFC 8259) for small trusted-format headers such as safetensors.
// The caller drives it by expected structure, so nesting and memory stay bounded by what the caller asks for.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace qkv::json {

// Offset of the first byte that is not well-formed UTF-8 (RFC 3629: no overlongs, no surrogates, <= U+10FFFF),
// or npos when the whole text is valid.
size_t first_invalid_utf8(std::string_view text);

// Appends the JSON string literal for `s` (quotes included) with serde_json's escaping: \" \\ \b \f \n \r \t,
// other control characters as \u00XX, everything else (including non-ASCII UTF-8 and '/') verbatim.
void append_quoted(std::string& out, std::string_view s);

// What the next value is, judged from its first character (after whitespace).
enum class Kind { Object, Array, String, Number, True, False, Null, End, Invalid };
const char* kind_name(Kind kind);  // "an object", "an array", ...

// A cursor over JSON text. Every method skips leading whitespace (space, \t, \n, \r) itself.
// Errors throw std::invalid_argument "<context>: <what> (at byte <offset>)".
class Reader {
 public:
  // `context` prefixes every error, e.g. "[safetensors] header". Throws if `text` is not valid UTF-8.
  Reader(std::string_view text, std::string context);

  Kind peek_kind();
  bool consume(char c);  // consumes `c` if it is next
  void expect(char c, const char* what);  // consumes `c` or fails with "expected <what>"

  // Object iteration: call begin_object(), then next_key(key) until it returns false.
  // next_key reads the ',' between members itself and rejects a trailing comma.
  void begin_object();
  bool next_key(std::string& key);
  // Array iteration: begin_array(), then while (next_element()) { read one value }.
  void begin_array();
  bool next_element();

  std::string read_string();
  // A number token that must be a non-negative integer fitting in uint64; `what` names it in errors.
  // Fractions, exponents, "-0" and out-of-range values are rejected (as serde_json does for usize).
  uint64_t read_uint64(const std::string& what);

  void skip_ws();
  size_t pos() const { return pos_; }
  std::string_view rest() const { return text_.substr(pos_); }
  [[noreturn]] void fail(const std::string& what) const;
  [[noreturn]] void fail_at(size_t offset, const std::string& what) const;

 private:
  void append_utf8(std::string& out, uint32_t cp);
  uint32_t read_hex4();

  std::string_view text_;
  std::string context_;
  size_t pos_ = 0;
  bool first_ = true;  // set by begin_object/begin_array; cleared by the first next_key/next_element
};

}  // namespace qkv::json
