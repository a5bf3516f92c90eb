// The one JSON reader/writer of qkv (RFC 8259, strict).
// - Reader: a pull cursor with no recursion and no tree, driven by the structure the caller expects. The safetensors
//   header and the run directory's flat files (config.json, trainer.json) read through it.
// - Value: a document tree with ordered object members, parsed over Reader (model folders' config.json & co.,
//   experiment results, HTTP request bodies) and written with a deterministic pretty printer (results.json, viewer
//   page data, HTTP answers).
// Every read error throws std::invalid_argument "<context>: <what> (at byte N)", where the caller's context names the
// file, e.g. "[bert] model/config.json". Rejected everywhere: invalid UTF-8, trailing commas, comments, NaN/Infinity,
// leading zeros, unpaired surrogates, control characters in strings, duplicate object keys (Value::parse; a Reader
// caller checks its own keys), anything after the document.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

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
  // Any number token (JSON grammar: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?), returned as its text.
  std::string read_number_text();
  // true, false or null; returns the literal's text.
  std::string read_literal();
  // Fails unless only whitespace is left.
  void expect_end();

  void skip_ws();
  size_t pos() const { return pos_; }
  std::string_view rest() const { return text_.substr(pos_); }
  [[noreturn]] void fail(const std::string& what) const;
  [[noreturn]] void fail_at(size_t offset, const std::string& what) const;

 private:
  uint32_t read_hex4();
  size_t scan_number(size_t start, size_t& int_end, bool& fractional) const;

  std::string_view text_;
  std::string context_;
  size_t pos_ = 0;
  bool first_ = true;  // set by begin_object/begin_array; cleared by the first next_key/next_element
};

// A JSON document: null, bool, number, string, array, or object whose members keep their insertion order.
class Value {
 public:
  enum class Type { kNull, kBool, kNumber, kString, kArray, kObject };

  Value() = default;  // null
  Value(bool b) : type_(Type::kBool), bool_(b) {}                     // NOLINT
  Value(double v) : type_(Type::kNumber), num_(v) {}                  // NOLINT
  Value(float v) : Value(static_cast<double>(v)) {}                   // NOLINT
  Value(int v) : Value(static_cast<int64_t>(v)) {}                    // NOLINT
  Value(int64_t v) : type_(Type::kNumber), num_(static_cast<double>(v)), integer_(true), int_(v) {}  // NOLINT
  Value(uint64_t v) : Value(static_cast<int64_t>(v)) {}               // NOLINT
  Value(const char* s) : type_(Type::kString), str_(s) {}             // NOLINT
  Value(std::string s) : type_(Type::kString), str_(std::move(s)) {}  // NOLINT
  Value(const std::vector<double>& v);                                // NOLINT: an array of numbers
  Value(const std::vector<int64_t>& v);                               // NOLINT
  Value(const std::vector<std::string>& v);                           // NOLINT

  static Value array();
  static Value object();
  // Parses a whole document (nesting depth <= 64; numbers beyond double range are rejected). `context` prefixes
  // every error and should name the file.
  static Value parse(std::string_view text, const std::string& context);

  Type type() const { return type_; }
  bool is_null() const { return type_ == Type::kNull; }
  bool is_bool() const { return type_ == Type::kBool; }
  bool is_number() const { return type_ == Type::kNumber; }
  // A number written (or parsed) as an integer that fits in int64.
  bool is_integer() const { return type_ == Type::kNumber && integer_; }
  bool is_string() const { return type_ == Type::kString; }
  bool is_array() const { return type_ == Type::kArray; }
  bool is_object() const { return type_ == Type::kObject; }

  // The scalar itself; on another type these return false, 0 and "" (check the type first).
  bool as_bool() const { return bool_; }
  double as_number() const { return num_; }
  int64_t as_integer() const { return integer_ ? int_ : static_cast<int64_t>(num_); }
  const std::string& as_string() const { return str_; }
  // Array elements / object members (empty for other types).
  const std::vector<Value>& items() const { return items_; }
  const std::vector<std::pair<std::string, Value>>& members() const { return members_; }

  // Array: appends (a null value becomes an empty array first). Returns *this.
  Value& push(Value v);
  Value& push_back(Value v) { return push(std::move(v)); }
  // Object: inserts or replaces `key`, keeping first-insertion order (a null value becomes an empty object first).
  Value& set(const std::string& key, Value v);
  // The member `key` of an object, or nullptr when absent (or when this is not an object).
  const Value* find(const std::string& key) const;
  // Object member; throws std::invalid_argument "[json] ..." when this is not an object or the key is absent.
  const Value& at(const std::string& key) const;
  bool contains(const std::string& key) const { return find(key) != nullptr; }
  size_t size() const;  // elements of an array or members of an object, else 0

  // Pretty-printed with `indent` spaces (0 = one line). Numbers: integers exactly, others with 10 significant
  // digits; non-finite numbers are written as null (JSON has no NaN).
  std::string dump(int indent = 2) const;

 private:
  friend class Parser;
  void write(std::string& out, int indent, int depth) const;
  Type type_ = Type::kNull;
  bool bool_ = false;
  double num_ = 0.0;
  bool integer_ = false;
  int64_t int_ = 0;
  std::string str_;
  std::vector<Value> items_;
  std::vector<std::pair<std::string, Value>> members_;
};

const char* type_name(Value::Type type);  // "null", "a boolean", "a number", "a string", "an array", "an object"

}  // namespace qkv::json
