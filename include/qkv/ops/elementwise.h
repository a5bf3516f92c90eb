// Elementwise arithmetic with numpy broadcasting, and the activations (forward halves).
#pragma once

#include "qkv/core/tensor.h"

namespace qkv {

Tensor add(const Tensor& a, const Tensor& b);  // broadcast
Tensor sub(const Tensor& a, const Tensor& b);  // broadcast
Tensor mul(const Tensor& a, const Tensor& b);  // broadcast
Tensor scale(const Tensor& a, float s);        // a * s
Tensor add_scalar(const Tensor& a, float s);   // a + s

enum class GeluApprox { kNone, kTanh };  // exact erf form, or PyTorch's approximate="tanh"

Tensor relu(const Tensor& x);
Tensor gelu(const Tensor& x, GeluApprox approx = GeluApprox::kNone);
Tensor tanh(const Tensor& x);
Tensor sigmoid(const Tensor& x);

}  // namespace qkv
