// KvCache: one attention layer's keys and values for incremental decoding, (N, H, T, D) per row, growing by
// doubling; rows can be reordered (beam forks, finished rows dropped) without recomputation.
#pragma once

#include <cstdint>
#include <vector>

#include "qkv/core/tensor.h"

namespace qkv::nn {

class KvCache {
 public:
  KvCache() = default;
  // Empties the cache for `rows` rows of `heads` x `head_dim`; reserves `capacity` positions (grows as needed).
  void reset(int64_t rows, int64_t heads, int64_t head_dim, int64_t capacity = 16);
  // k, v: (N, H, Tn, D), any strides  ->  stored at positions [length, length + Tn).
  void append(const Tensor& k, const Tensor& v);
  // Row i of the result is row rows[i] of the current cache (repeats allowed). Every index in [0, this->rows()).
  void reorder(const std::vector<int64_t>& rows);
  Tensor keys() const;    // (N, H, length, D) view into the cache
  Tensor values() const;  // (N, H, length, D)
  int64_t length() const { return len_; }
  bool ready() const { return k_.defined(); }  // reset() has been called
  int64_t rows() const { return rows_; }

 private:
  void grow(int64_t need);
  Tensor k_, v_;  // (N, H, capacity, D)
  int64_t rows_ = 0, heads_ = 0, dim_ = 0, len_ = 0;
};

// Row i of the result is x.select(0, rows[i]) (a copy); x: (R, ...)  ->  (N, ...). Indices in [0, R).
Tensor gather_rows(const Tensor& x, const std::vector<int64_t>& rows, int64_t axis = 0);

// True when rows == {0, 1, ..., n - 1} (nothing to reorder).
bool is_identity(const std::vector<int64_t>& rows, int64_t n);

}  // namespace qkv::nn
