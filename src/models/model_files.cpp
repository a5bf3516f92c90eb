// Reading a model folder's files: whole-file reads, JSON parsing and typed lookups, each error naming the file.
#include "model_files.h"

#include <cmath>
#include <fstream>
#include <map>
#include <vector>
#include <sstream>
#include <sys/stat.h>

#include "qkv/core/error.h"
#include "qkv/core/safetensors.h"

namespace qkv::models::files {

bool exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

bool is_regular_file(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
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

int64_t size_bound(const std::string& key) {
  static const std::map<std::string, int64_t> bounds = {
      {"vocab_size", int64_t{1} << 24},          {"hidden_size", int64_t{1} << 17},
      {"intermediate_size", int64_t{1} << 20},   {"num_hidden_layers", int64_t{1} << 12},
      {"num_attention_heads", int64_t{1} << 12}, {"num_key_value_heads", int64_t{1} << 12},
      {"head_dim", int64_t{1} << 12},            {"max_position_embeddings", int64_t{1} << 24},
      {"sliding_window", int64_t{1} << 24},      {"type_vocab_size", int64_t{1} << 16},
      {"max_seq_length", int64_t{1} << 24},
  };
  const auto it = bounds.find(key);
  return it == bounds.end() ? int64_t{9000000000000000} : it->second;
}

int64_t JsonObject::integer(const std::string& key) const {
  const json::Value* x = get(key);
  QKV_CHECK_RUNTIME(x != nullptr, "[", op, "] ", path, " has no \"", key, "\"");
  if (x->type() != json::Value::Type::kNumber || x->as_number() < 0 || x->as_number() != std::floor(x->as_number()) ||
      x->as_number() > 9.0e15) {
    wrong_type(*this, key, "a non-negative integer", *x);
  }
  const auto v = static_cast<int64_t>(x->as_number());
  QKV_CHECK_RUNTIME(v <= size_bound(key), "[", op, "] ", path, ": \"", key, "\" is ", v, ", more than ",
                    size_bound(key), " (the bound qkv sets on this size, far above any released model)");
  return v;
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

std::map<std::string, Tensor> read_weights(const std::string& dir, const char* op, std::string& source) {
  auto load = [](const std::string& path) {
    try {
      return load_safetensors(path);
    } catch (const std::invalid_argument& e) {
      throw std::runtime_error(e.what());
    }
  };
  const std::string single = dir + "/model.safetensors", index = dir + "/model.safetensors.index.json";
  if (exists(single) || !exists(index)) {
    QKV_CHECK_RUNTIME(exists(single), "[", op, "] model folder ", dir,
                      " has no model.safetensors (nor model.safetensors.index.json for sharded weights)");
    source = single;
    return load(single).tensors;
  }
  source = index;
  const json::Value doc = read_json(index, op);
  const json::Value* map = doc.type() == json::Value::Type::kObject ? doc.find("weight_map") : nullptr;
  QKV_CHECK_RUNTIME(map != nullptr && map->type() == json::Value::Type::kObject, "[", op, "] ", index,
                    " has no \"weight_map\" object (tensor name -> shard file)");
  std::map<std::string, std::string> where;  // tensor -> shard
  std::map<std::string, std::vector<std::string>> shards;
  for (const auto& [name, file] : map->members()) {
    QKV_CHECK_RUNTIME(file.type() == json::Value::Type::kString, "[", op, "] ", index, ": weight_map[\"", name,
                      "\"] must be a file name (a string)");
    const std::string& f = file.as_string();
    QKV_CHECK_RUNTIME(!f.empty() && f.find('/') == std::string::npos && f != "." && f != "..", "[", op, "] ", index,
                      ": weight_map[\"", name, "\"] = \"", f, "\" is not a file name in the folder");
    QKV_CHECK_RUNTIME(where.emplace(name, f).second, "[", op, "] ", index, ": tensor \"", name,
                      "\" is mapped twice");
    shards[f].push_back(name);
  }
  QKV_CHECK_RUNTIME(!where.empty(), "[", op, "] ", index, ": \"weight_map\" is empty");
  std::map<std::string, Tensor> out;
  for (const auto& [f, names] : shards) {
    const std::string path = dir + "/" + f;
    QKV_CHECK_RUNTIME(exists(path), "[", op, "] ", index, " names shard ", f, " (for \"", names.front(),
                      "\"), which is not in ", dir);
    SafeTensorsFile shard = load(path);
    for (auto& [name, t] : shard.tensors) {
      const auto it = where.find(name);
      QKV_CHECK_RUNTIME(it != where.end() && it->second == f, "[", op, "] ", path, " holds tensor \"", name,
                        "\", which ", index, it == where.end() ? " does not list" : " maps to " + it->second);
      out.emplace(name, std::move(t));
    }
    for (const std::string& name : names)
      QKV_CHECK_RUNTIME(out.count(name) == 1, "[", op, "] ", index, " maps \"", name, "\" to ", f,
                        ", which does not hold it");
  }
  return out;
}

}  // namespace qkv::models::files
