// Private helpers shared by the positional-encoding sources (not installed, not part of the API).
// add_position_rows: x (..., T, E) + table rows, the common "absolute encoding" step.
#pragma once

#include <algorithm>
#include <cstdint>

#include "qkv/core/error.h"
#include "qkv/core/tensor.h"

namespace qkv::detail {

// x: (..., T, E)  table: contiguous (T, E)  ->  x + table broadcast over the leading dims (new contiguous tensor).
inline Tensor add_position_rows(const Tensor& x, const Tensor& table) {
  QKV_ASSERT(table.is_contiguous() && table.dim() == 2);
  QKV_ASSERT(x.size(-2) == table.size(0) && x.size(-1) == table.size(1));
  Tensor out = x.clone();
  const int64_t rows = table.numel();
  if (rows == 0) return out;
  const int64_t batches = out.numel() / rows;
  float* o = out.data();
  const float* t = table.data();
  for (int64_t b = 0; b < batches; ++b) {
    float* ob = o + b * rows;
    for (int64_t i = 0; i < rows; ++i) ob[i] += t[i];
  }
  return out;
}

}  // namespace qkv::detail
