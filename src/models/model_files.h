// Internal: reading the files of a model folder with one-line errors that name the file.
#pragma once

#include <map>
#include <string>

#include "qkv/core/json.h"
#include "qkv/core/tensor.h"

namespace qkv::models::files {

bool exists(const std::string& path);
bool is_regular_file(const std::string& path);  // after following links
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
  // Required, >= 0, and at most size_bound(key): a size that would exhaust memory is refused naming the key.
  int64_t integer(const std::string& key) const;
  int64_t integer_or(const std::string& key, int64_t fallback) const;
  double number_or(const std::string& key, double fallback) const;
  bool boolean_or(const std::string& key, bool fallback) const;
  std::string string_or(const std::string& key, const std::string& fallback) const;
};

// The largest value a config.json may give a known size key ("num_hidden_layers": 4096, "vocab_size": 2^24, ...):
// far above any released model, far below sizes whose allocation would fail. Other keys: 9e15.
int64_t size_bound(const std::string& key);

// The weights of a model folder: DIR/model.safetensors, or else the shards that DIR/model.safetensors.index.json's
// "weight_map" (tensor name -> shard file) names, each read by the strict safetensors reader; a shard must hold
// exactly the tensors the map gives it. Errors: std::runtime_error "[<op>] ..." naming the file (no weights at all,
// a missing shard, a tensor in two shards or not where the map says). `source` receives what was read, for messages.
std::map<std::string, Tensor> read_weights(const std::string& dir, const char* op, std::string& source);

}  // namespace qkv::models::files
