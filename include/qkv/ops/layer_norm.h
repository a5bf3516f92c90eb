// LayerNorm over the last dimension. The forward returns what its backward needs (mean and rstd).
#pragma once

#include "qkv/core/tensor.h"

namespace qkv {

struct LayerNormResult {
  Tensor y;     // (..., E)
  Tensor mean;  // (...)
  Tensor rstd;  // (...)  1/sqrt(var + eps), biased variance as PyTorch
};

// x: (..., E)  weight: (E) or undefined  bias: (E) or undefined
LayerNormResult layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps = 1e-5f);

struct LayerNormGrads {
  Tensor dx;       // (..., E)
  Tensor dweight;  // (E); undefined when weight is undefined
  Tensor dbias;    // (E) = sum of dy over the leading dims (always computed: the caller knows if it has a bias)
};

// x, weight, mean, rstd: as given to / returned by layer_norm;  dy: (..., E).
LayerNormGrads layer_norm_backward(const Tensor& x, const Tensor& weight, const Tensor& mean,
                                   const Tensor& rstd, const Tensor& dy);

}  // namespace qkv
