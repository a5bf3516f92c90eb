// Internal: a small strict JSON document reader for model folders' config files (config.json & co.).
// Values become a tree; numbers are doubles. Errors throw std::invalid_argument "<context>: <what> at byte N".
#pragma once

#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace qkv::models::json {

struct Value {
  enum class Type { kNull, kBool, kNumber, kString, kArray, kObject };
  Type type = Type::kNull;
  bool boolean = false;
  double number = 0.0;
  std::string string;
  std::vector<Value> array;
  std::map<std::string, Value> object;  // duplicate keys are rejected

  bool is_null() const { return type == Type::kNull; }
  // The member `key` of an object, or nullptr when absent (or when this is not an object).
  const Value* find(const std::string& key) const;
};

// Parses a whole document (nesting depth <= 64). `context` prefixes every error message.
Value parse(std::string_view text, const std::string& context);

const char* type_name(Value::Type type);  // "null", "a boolean", "a number", ...

}  // namespace qkv::models::json
