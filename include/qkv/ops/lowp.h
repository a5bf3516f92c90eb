// Products at a chosen Precision (qkv/core/precision.h). Tensors stay float32; the precision says how the product
// is computed. A LinearWeight holds a weight converted once (bf16-rounded, or int8 per output channel), so no call
// converts weights; activations are rounded or quantized per call in one pass.
#pragma once

#include <memory>

#include "qkv/core/precision.h"
#include "qkv/core/tensor.h"
#include "qkv/kernels/lowp.h"

namespace qkv {

// x rounded to bfloat16 element-wise (a new contiguous float32 tensor; NaN stays NaN, inf stays inf).
Tensor round_to_bf16(const Tensor& x);

// A linear layer's weight (out, in) prepared for one precision.
//   kFloat32:  the weight itself (shared storage), so linear() gives the float32 bits exactly.
//   kBFloat16: a bf16-rounded float32 copy.
//   kInt8:     int8 values per output channel (symmetric scale max|row| / 127).
// rows(begin, end) is the weight of output channels [begin, end) without copying (a packed Q/K/V projection).
class LinearWeight {
 public:
  LinearWeight() = default;
  LinearWeight(const Tensor& weight, Precision precision);

  Precision precision() const { return precision_; }
  int64_t out_features() const { return end_ - begin_; }
  int64_t in_features() const { return in_; }
  bool defined() const { return in_ >= 0; }
  LinearWeight rows(int64_t begin, int64_t end) const;

 private:
  friend Tensor linear(const Tensor& x, const LinearWeight& w, const Tensor& bias);
  Precision precision_ = Precision::kFloat32;
  Tensor weight_;                                  // kFloat32 / kBFloat16: (out, in) over [begin_, end_)
  std::shared_ptr<const kernels::Int8Rows> int8_;  // kInt8: every row; [begin_, end_) of them are used
  int64_t begin_ = 0, end_ = 0, in_ = -1;
};

// x: (..., in) -> (..., out) = x·weightᵀ + bias at the weight's precision. kFloat32 is linear(x, weight, bias);
// kBFloat16 is linear(round_to_bf16(x), rounded weight, bias); kInt8 quantizes each row of x (per token) and runs the
// int8 kernel (exact int32 sums, float32 scale and bias).
Tensor linear(const Tensor& x, const LinearWeight& w, const Tensor& bias = {});

// matmul(a, b) at `precision`: kFloat32 is matmul(a, b); kBFloat16 rounds both operands (activations, one pass each)
// and runs the float32 product. kInt8 throws std::invalid_argument (int8 is for linear layers only).
Tensor matmul(const Tensor& a, const Tensor& b, Precision precision);

}  // namespace qkv
