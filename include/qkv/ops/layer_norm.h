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

// Inference only (no mean/rstd kept, no backward): the residual + bias + LayerNorm of a post-LN block, in place.
//   y <- layer_norm(x + (y + y_bias), weight, bias, eps)
// y: (..., E) contiguous (overwritten)  x: y's shape, last dim contiguous, or undefined  y_bias, weight, bias: (E) or
// undefined. One pass over memory per row, AVX2 when the CPU has it, threads over rows; statistics in double as
// layer_norm, so the result matches add_layer_norm_reference to float rounding.
void add_layer_norm_(Tensor& y, const Tensor& x, const Tensor& y_bias, const Tensor& weight, const Tensor& bias,
                     float eps = 1e-5f);
// The plain twin of add_layer_norm_: layer_norm(add(x, add(y, y_bias)), weight, bias, eps).y as a fresh tensor.
Tensor add_layer_norm_reference(const Tensor& y, const Tensor& x, const Tensor& y_bias, const Tensor& weight,
                                const Tensor& bias, float eps = 1e-5f);

struct LayerNormGrads {
  Tensor dx;       // (..., E)
  Tensor dweight;  // (E); undefined when weight is undefined
  Tensor dbias;    // (E) = sum of dy over the leading dims (always computed: the caller knows if it has a bias)
};

// x, weight, mean, rstd: as given to / returned by layer_norm;  dy: (..., E).
LayerNormGrads layer_norm_backward(const Tensor& x, const Tensor& weight, const Tensor& mean,
                                   const Tensor& rstd, const Tensor& dy);

// RMSNorm (Zhang & Sennrich 2019) over the last dimension, as Llama's and Gemma's:
//   y = x · rstd · g,   rstd = 1 / sqrt(mean(x²) + eps),   g = weight, or 1 + weight when unit_offset (Gemma)
// Statistics in double, rounded once to float32 (HF computes them in float32).
struct RmsNormResult {
  Tensor y;     // (..., E)
  Tensor rstd;  // (...)
};
// x: (..., E), E > 0, any strides  weight: (E) or undefined (g = 1, or 2 with unit_offset)  eps: finite, >= 0
RmsNormResult rms_norm(const Tensor& x, const Tensor& weight, float eps = 1e-6f, bool unit_offset = false);

struct RmsNormGrads {
  Tensor dx;       // (..., E)
  Tensor dweight;  // (E); undefined when weight is undefined
};
// x, weight, rstd: as given to / returned by rms_norm with the same unit_offset;  dy: (..., E).
RmsNormGrads rms_norm_backward(const Tensor& x, const Tensor& weight, const Tensor& rstd, const Tensor& dy,
                               bool unit_offset = false);

}  // namespace qkv
