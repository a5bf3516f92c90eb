// Matrix products through CBLAS: batched matmul with broadcasting and PyTorch's linear, with backward halves.
#pragma once

#include "qkv/core/tensor.h"

namespace qkv {

// a: (..., M, K)  b: (..., K, N)  ->  (..., M, N); leading dims broadcast; 1-D operands are not accepted.
Tensor matmul(const Tensor& a, const Tensor& b);

// x: (..., in)  weight: (out, in)  bias: (out) or undefined  ->  (..., out).   y = x·weightᵀ + bias
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = {});

struct MatmulGrads {
  Tensor da;  // shape of a: dc·bᵀ summed over the dims a was broadcast along
  Tensor db;  // shape of b: aᵀ·dc summed likewise
};
// dc: (..., M, N), the broadcast output shape.
MatmulGrads matmul_backward(const Tensor& a, const Tensor& b, const Tensor& dc);

struct LinearGrads {
  Tensor dx;       // (..., in)  = dy·weight
  Tensor dweight;  // (out, in)  = dyᵀ·x over all leading dims
  Tensor dbias;    // (out)      = sum of dy over the leading dims (always computed)
};
// x: (..., in)  weight: (out, in)  dy: (..., out)
LinearGrads linear_backward(const Tensor& x, const Tensor& weight, const Tensor& dy);

}  // namespace qkv
