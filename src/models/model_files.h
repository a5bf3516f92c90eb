// Internal: reading the files of a model folder with one-line errors that name the file.
#pragma once

#include <string>

#include "qkv/core/json.h"

namespace qkv::models::files {

bool exists(const std::string& path);
// The whole file; std::runtime_error "[<op>] cannot read <path>" when it cannot be read.
std::string read_text(const std::string& path, const char* op);
// read_text + json::Value::parse; a parse error becomes std::runtime_error "[<op>] <path> is not valid JSON: ...".
json::Value read_json(const std::string& path, const char* op);

// Typed members of a JSON object; a wrong type throws std::runtime_error "[<op>] <path>: \"key\" must be ...".
struct JsonObject {
  const json::Value& v;
  std::string path;
  const char* op;

  const json::Value* get(const std::string& key) const { return v.find(key); }
  bool has(const std::string& key) const { return get(key) && !get(key)->is_null(); }
  int64_t integer(const std::string& key) const;                   // required, >= 0
  int64_t integer_or(const std::string& key, int64_t fallback) const;
  double number_or(const std::string& key, double fallback) const;
  bool boolean_or(const std::string& key, bool fallback) const;
  std::string string_or(const std::string& key, const std::string& fallback) const;
};

}  // namespace qkv::models::files
