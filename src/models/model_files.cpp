// Reading a model folder's files: whole-file reads, JSON parsing and typed lookups, each error naming the file.
#include "model_files.h"

#include <cmath>
#include <fstream>
#include <sstream>
#include <sys/stat.h>

#include "qkv/core/error.h"

namespace qkv::models::files {

bool exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

std::string read_text(const std::string& path, const char* op) {
  std::ifstream in(path, std::ios::binary);
  QKV_CHECK_RUNTIME(in.good(), "[", op, "] cannot read ", path);
  std::ostringstream ss;
  ss << in.rdbuf();
  QKV_CHECK_RUNTIME(!in.bad(), "[", op, "] error while reading ", path);
  return ss.str();
}

json::Value read_json(const std::string& path, const char* op) {
  const std::string text = read_text(path, op);
  try {
    return json::Value::parse(text, std::string("[") + op + "] " + path + " is not valid JSON");
  } catch (const std::invalid_argument& e) {
    throw std::runtime_error(e.what());
  }
}

namespace {
[[noreturn]] void wrong_type(const JsonObject& o, const std::string& key, const char* want, const json::Value& v) {
  throw std::runtime_error(detail::concat("[", o.op, "] ", o.path, ": \"", key, "\" must be ", want, ", got ",
                                          json::type_name(v.type())));
}
}  // namespace

int64_t JsonObject::integer(const std::string& key) const {
  const json::Value* x = get(key);
  QKV_CHECK_RUNTIME(x != nullptr, "[", op, "] ", path, " has no \"", key, "\"");
  if (x->type() != json::Value::Type::kNumber || x->as_number() < 0 || x->as_number() != std::floor(x->as_number()) ||
      x->as_number() > 9.0e15) {
    wrong_type(*this, key, "a non-negative integer", *x);
  }
  return static_cast<int64_t>(x->as_number());
}

int64_t JsonObject::integer_or(const std::string& key, int64_t fallback) const {
  return has(key) ? integer(key) : fallback;
}

double JsonObject::number_or(const std::string& key, double fallback) const {
  if (!has(key)) return fallback;
  const json::Value& x = *get(key);
  if (x.type() != json::Value::Type::kNumber) wrong_type(*this, key, "a number", x);
  return x.as_number();
}

bool JsonObject::boolean_or(const std::string& key, bool fallback) const {
  if (!has(key)) return fallback;
  const json::Value& x = *get(key);
  if (x.type() != json::Value::Type::kBool) wrong_type(*this, key, "true or false", x);
  return x.as_bool();
}

std::string JsonObject::string_or(const std::string& key, const std::string& fallback) const {
  if (!has(key)) return fallback;
  const json::Value& x = *get(key);
  if (x.type() != json::Value::Type::kString) wrong_type(*this, key, "a string", x);
  return x.as_string();
}

}  // namespace qkv::models::files
