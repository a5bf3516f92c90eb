// Ids: integer ids with a shape (token ids (B, T), targets), the integer counterpart of Tensor.
#pragma once

#include <cstdint>
#include <vector>

#include "qkv/core/shape.h"

namespace qkv {

// Integer ids with a shape, e.g. token ids (B, T).
struct Ids {
  std::vector<int64_t> data;
  Shape shape;
};

}  // namespace qkv
