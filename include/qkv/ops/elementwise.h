// Elementwise arithmetic with numpy broadcasting, and the activations, with their backward halves.
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
Tensor gelu(const Tensor& x, GeluApprox approx = GeluApprox::kNone);  // vectorised kernel when x is contiguous
Tensor gelu_reference(const Tensor& x, GeluApprox approx = GeluApprox::kNone);  // libm erf/tanh per element
// Inference only, in place: x <- gelu(x + bias), the bias broadcast over rows (the bias + activation after a linear
// layer run without its bias). x: (..., F) contiguous  bias: (F) or undefined. Vectorised kernel; threads over rows.
void add_bias_gelu_(Tensor& x, const Tensor& bias, GeluApprox approx = GeluApprox::kNone);
Tensor tanh(const Tensor& x);
Tensor sigmoid(const Tensor& x);
Tensor silu(const Tensor& x);  // x·sigmoid(x) (SiLU / swish, torch.nn.functional.silu); contiguous x: the kernel
Tensor silu_reference(const Tensor& x);  // libm exp per element

// --- backward halves: dy has the forward output's shape ----------------------------------------------------

// Sums a broadcast gradient back to `shape`: g (S) -> (shape), where `shape` broadcasts to S.
// This is the backward of expand, and reduces add/sub/mul gradients to each operand's shape.
// Returns g itself (shared) when shape == g.shape(); otherwise a fresh tensor (sums in double).
Tensor sum_to(const Tensor& g, const Shape& shape);

struct BinaryGrads {
  Tensor da;  // shape of a
  Tensor db;  // shape of b
};
// add/sub: da and db may share dy's storage when no reduction is needed.
BinaryGrads add_backward(const Shape& a, const Shape& b, const Tensor& dy);  // da = dy, db = dy (summed)
BinaryGrads sub_backward(const Shape& a, const Shape& b, const Tensor& dy);  // da = dy, db = -dy
BinaryGrads mul_backward(const Tensor& a, const Tensor& b, const Tensor& dy);  // da = dy*b, db = dy*a

Tensor relu_backward(const Tensor& x, const Tensor& dy);                 // dy * (x > 0)
Tensor gelu_backward(const Tensor& x, const Tensor& dy, GeluApprox approx = GeluApprox::kNone);
Tensor gelu_backward_reference(const Tensor& x, const Tensor& dy, GeluApprox approx = GeluApprox::kNone);
Tensor tanh_backward(const Tensor& y, const Tensor& dy);                 // y = tanh(x): dy * (1 - y^2)
Tensor sigmoid_backward(const Tensor& y, const Tensor& dy);              // y = sigmoid(x): dy * y * (1 - y)
Tensor silu_backward(const Tensor& x, const Tensor& dy);                 // dy * s·(1 + x·(1 - s)), s = sigmoid(x)

}  // namespace qkv
