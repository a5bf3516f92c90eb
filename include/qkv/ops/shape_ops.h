// Concatenation and stacking along an axis (copies).
#pragma once

#include <vector>

#include "qkv/core/tensor.h"

namespace qkv {

// All inputs equal in every dim but `axis`.
Tensor concat(const std::vector<Tensor>& xs, int64_t axis);
// All inputs the same shape; inserts a new axis.
Tensor stack(const std::vector<Tensor>& xs, int64_t axis);

}  // namespace qkv
