// A small GGUF writer for tests: metadata values and tensors in, file bytes out, with the byte offset of every
// field recorded so that tests can corrupt one field and check that the refusal names its byte.
#pragma once

#include <cstdint>
#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "qkv/core/gguf.h"

namespace qkv::testing::gguf_files {

using ::qkv::gguf::Type;
using ::qkv::gguf::ValueType;

template <typename T>
std::string le(T v) {
  std::string s(sizeof(T), '\0');
  std::memcpy(s.data(), &v, sizeof(T));
  return s;
}
inline std::string str(const std::string& s) { return le<uint64_t>(s.size()) + s; }

// An encoded value: its u32 type followed by its payload.
inline std::string value(ValueType t, const std::string& payload) { return le<uint32_t>(uint32_t(t)) + payload; }
template <typename T>
std::string scalar(ValueType t, T v) { return value(t, le<T>(v)); }
inline std::string string_value(const std::string& s) { return value(ValueType::STRING, str(s)); }
template <typename T>
std::string array(ValueType elem, const std::vector<T>& v) {
  std::string s = le<uint32_t>(uint32_t(ValueType::ARRAY)) + le<uint32_t>(uint32_t(elem)) + le<uint64_t>(v.size());
  for (const T& x : v) s += le<T>(x);
  return s;
}
inline std::string string_array(const std::vector<std::string>& v) {
  std::string s = le<uint32_t>(uint32_t(ValueType::ARRAY)) + le<uint32_t>(uint32_t(ValueType::STRING)) +
                  le<uint64_t>(v.size());
  for (const std::string& x : v) s += str(x);
  return s;
}

struct TensorSpec {
  std::string name;
  std::vector<int64_t> ne;
  uint32_t type = 0;               // ggml type number
  std::string data;                // the tensor's bytes (written at its offset)
  std::optional<uint64_t> offset;  // default: the running sum of padded sizes
};

struct Builder {
  uint32_t version = 3;
  std::optional<int64_t> n_tensors, n_kv;  // default: the real counts
  uint64_t alignment = 32;                 // used to pad (write general.alignment yourself to change the reader's)
  std::vector<std::pair<std::string, std::string>> kvs;  // key, encoded value
  std::vector<TensorSpec> tensors;
  bool pad_last = true;  // pad the data section after the last tensor

  // Byte offsets of the fields of the last build(): "key:K" (the key's length), "type:K" (its value type),
  // "tensor:N" (the name's length), "dims:N", "ne:N:d", "ttype:N", "offset:N", "data:N", "data" (section start).
  std::map<std::string, size_t> at;

  Builder& kv(const std::string& key, const std::string& encoded) {
    kvs.emplace_back(key, encoded);
    return *this;
  }
  Builder& tensor(const std::string& name, std::vector<int64_t> ne, uint32_t type, std::string data) {
    tensors.push_back({name, std::move(ne), type, std::move(data), std::nullopt});
    return *this;
  }

  static uint64_t pad(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

  std::string build() {
    at.clear();
    std::string b = "GGUF" + le<uint32_t>(version);
    b += le<int64_t>(n_tensors.value_or(static_cast<int64_t>(tensors.size())));
    b += le<int64_t>(n_kv.value_or(static_cast<int64_t>(kvs.size())));
    for (const auto& [k, v] : kvs) {
      at["key:" + k] = b.size();
      b += str(k);
      at["type:" + k] = b.size();
      b += v;
    }
    uint64_t running = 0;
    std::vector<uint64_t> offsets;
    for (const TensorSpec& t : tensors) {
      at["tensor:" + t.name] = b.size();
      b += str(t.name);
      at["dims:" + t.name] = b.size();
      b += le<uint32_t>(static_cast<uint32_t>(t.ne.size()));
      for (size_t d = 0; d < t.ne.size(); ++d) {
        at["ne:" + t.name + ":" + std::to_string(d)] = b.size();
        b += le<int64_t>(t.ne[d]);
      }
      at["ttype:" + t.name] = b.size();
      b += le<uint32_t>(t.type);
      at["offset:" + t.name] = b.size();
      const uint64_t off = t.offset.value_or(running);
      offsets.push_back(off);
      b += le<uint64_t>(off);
      running += pad(t.data.size(), alignment);
    }
    b.resize(pad(b.size(), alignment), '\0');
    at["data"] = b.size();
    const size_t base = b.size();
    for (size_t i = 0; i < tensors.size(); ++i) {
      at["data:" + tensors[i].name] = base + offsets[i];
      if (b.size() < base + offsets[i]) b.resize(base + offsets[i], '\0');
      b.replace(base + offsets[i], std::min(tensors[i].data.size(), b.size() - base - offsets[i]), tensors[i].data);
      if (pad_last || i + 1 < tensors.size()) b.resize(pad(b.size(), alignment), '\0');
    }
    return b;
  }
};

inline std::string f32_bytes(const std::vector<float>& v) {
  std::string s;
  for (float x : v) s += le<float>(x);
  return s;
}

}  // namespace qkv::testing::gguf_files
