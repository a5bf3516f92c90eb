// Concatenation and stacking along an axis (copies), and split, their backward (views).
#pragma once

#include <vector>

#include "qkv/core/tensor.h"

namespace qkv {

// All inputs equal in every dim but `axis`.
Tensor concat(const std::vector<Tensor>& xs, int64_t axis);
// All inputs the same shape; inserts a new axis.
Tensor stack(const std::vector<Tensor>& xs, int64_t axis);

// Views of consecutive pieces of x along `axis`; sizes must add up to x.size(axis). The backward of concat.
std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t axis);

}  // namespace qkv
