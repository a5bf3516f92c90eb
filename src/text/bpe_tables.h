// The BPE tokenizer's lookup tables (src/text/bpe.cpp): token string -> id over the tokenizer's one list of token
// strings, and (left id, right id) -> (rank, merged id). Open addressing, linear probing, at most half full: a few
// MB for a 50 K-token vocabulary, where node-based hash maps of strings took about four times that.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace qkv::text::detail {

// The slots of a table holding n entries at most half full: a power of two, at least 16.
inline size_t half_full_capacity(size_t n) {
  size_t cap = 16;
  while (cap < 2 * n) cap *= 2;
  return cap;
}

// Token string -> id. Holds ids only; key_of(id) gives an id's string (const std::string&), so the strings stay in
// the tokenizer's token list. The first id of a string wins, as HF's vocab map; empty strings are not indexed.
class VocabIndex {
 public:
  template <class KeyOf>
  void build(size_t n, KeyOf key_of) {
    slots_.assign(half_full_capacity(n), -1);
    mask_ = slots_.size() - 1;
    for (size_t id = 0; id < n; ++id) {
      const std::string& key = key_of(static_cast<int32_t>(id));
      if (key.empty()) continue;
      for (size_t i = std::hash<std::string_view>()(key) & mask_;; i = (i + 1) & mask_) {
        if (slots_[i] < 0) {
          slots_[i] = static_cast<int32_t>(id);
          break;
        }
        if (key_of(slots_[i]) == key) break;  // the first id wins
      }
    }
  }
  // The id of key, -1 when absent.
  template <class KeyOf>
  int64_t find(std::string_view key, KeyOf key_of) const {
    if (slots_.empty() || key.empty()) return -1;
    for (size_t i = std::hash<std::string_view>()(key) & mask_;; i = (i + 1) & mask_) {
      const int32_t id = slots_[i];
      if (id < 0) return -1;
      if (key_of(id) == key) return id;
    }
  }

 private:
  std::vector<int32_t> slots_;  // -1: empty
  size_t mask_ = 0;
};

// (left id, right id) -> (rank, merged id).
class MergeTable {
 public:
  struct Entry {
    uint64_t key = kEmpty;
    int32_t rank = 0, id = 0;
  };
  static constexpr uint64_t kEmpty = ~uint64_t{0};

  void reserve(size_t n) {
    slots_.assign(half_full_capacity(n), Entry{});
    mask_ = slots_.size() - 1;
    shift_ = 64;
    for (size_t c = slots_.size(); c > 1; c >>= 1) --shift_;
  }
  // Keeps the first entry of a pair (HF keeps the lowest rank). reserve() first.
  void insert(int32_t a, int32_t b, int32_t rank, int32_t id) {
    const uint64_t key = pack(a, b);
    for (size_t i = slot(key);; i = (i + 1) & mask_) {
      if (slots_[i].key == key) return;
      if (slots_[i].key == kEmpty) {
        slots_[i] = {key, rank, id};
        return;
      }
    }
  }
  // nullptr when (a, b) is not a merge.
  const Entry* find(int64_t a, int64_t b) const {
    if (slots_.empty()) return nullptr;
    const uint64_t key = pack(static_cast<int32_t>(a), static_cast<int32_t>(b));
    for (size_t i = slot(key);; i = (i + 1) & mask_) {
      if (slots_[i].key == key) return &slots_[i];
      if (slots_[i].key == kEmpty) return nullptr;
    }
  }

 private:
  static uint64_t pack(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  // Fibonacci hashing: the top bits of key times 2^64 / phi.
  size_t slot(uint64_t key) const { return static_cast<size_t>((key * 0x9E3779B97F4A7C15ull) >> shift_); }

  std::vector<Entry> slots_;
  size_t mask_ = 0;
  int shift_ = 64;
};

}  // namespace qkv::text::detail
