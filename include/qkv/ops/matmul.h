// Matrix products through CBLAS: batched matmul with broadcasting and PyTorch's linear.
#pragma once

#include "qkv/core/tensor.h"

namespace qkv {

// a: (..., M, K)  b: (..., K, N)  ->  (..., M, N); leading dims broadcast; 1-D operands are not accepted.
Tensor matmul(const Tensor& a, const Tensor& b);

// x: (..., in)  weight: (out, in)  bias: (out) or undefined  ->  (..., out).   y = x·weightᵀ + bias
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = {});

}  // namespace qkv
