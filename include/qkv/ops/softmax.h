// Numerically stable softmax and log-softmax along one axis (max subtracted; an all -inf slice gives 0, not NaN).
#pragma once

#include "qkv/core/tensor.h"

namespace qkv {

// x: any shape -> same shape; rows along `axis` sum to 1 (or are all 0 when every entry is -inf).
Tensor softmax(const Tensor& x, int64_t axis = -1);
// An all -inf slice gives all -inf (log of 0), never NaN.
Tensor log_softmax(const Tensor& x, int64_t axis = -1);

// y = softmax(x, axis), dy: y's shape  ->  dx = y * (dy - sum(dy * y, axis)). A fully masked row (y all 0) gets dx 0.
Tensor softmax_backward(const Tensor& y, const Tensor& dy, int64_t axis = -1);
// y = log_softmax(x, axis)  ->  dx = dy - exp(y) * sum(dy, axis)   (PyTorch's formula).
Tensor log_softmax_backward(const Tensor& y, const Tensor& dy, int64_t axis = -1);

}  // namespace qkv
