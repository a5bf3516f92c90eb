// The article's §5 example as a function: shared by `qkv demo` (shapes, a row sum, a PNG) and `qkv viz demo`.
#pragma once

#include <cstdint>

#include "qkv/core/tensor.h"

namespace qkv::cli {

struct DemoAttention {
  Tensor out;      // (B, T, E) = (2, 10, 64): after the output projection
  Tensor weights;  // (B, H, T, T) = (2, 4, 10, 10)
};

// Multi-head self-attention over x ~ N(0, 1) with W ~ N(0, 1/sqrt(E)), as the article, heads split as views.
DemoAttention demo_attention(uint64_t seed);

}  // namespace qkv::cli
