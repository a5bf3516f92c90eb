// Numerically stable softmax and log-softmax along one axis (max subtracted; an all -inf slice gives 0, not NaN).
#pragma once

#include "qkv/core/tensor.h"

namespace qkv {

// x: any shape -> same shape; rows along `axis` sum to 1 (or are all 0 when every entry is -inf).
Tensor softmax(const Tensor& x, int64_t axis = -1);
Tensor log_softmax(const Tensor& x, int64_t axis = -1);

}  // namespace qkv
