// Products at a chosen Precision (qkv/core/precision.h). Tensors stay float32; the precision says how the product
// is computed. A LinearWeight holds a weight converted once (bf16-rounded, or int8 per output channel), so no call
// converts weights; activations are rounded or quantized per call in one pass.
#pragma once

#include <memory>

#include "qkv/core/precision.h"
#include "qkv/core/tensor.h"
#include "qkv/kernels/lowp.h"
#include "qkv/kernels/quant_gemm.h"
#include "qkv/kernels/sgemm.h"

namespace qkv {

// x rounded to bfloat16 element-wise (a new contiguous float32 tensor; NaN stays NaN, inf stays inf).
Tensor round_to_bf16(const Tensor& x);

// bfloat16 pairs, the storage of a bf16 KV cache (nn::KvCache): x (..., D), D even  ->  (..., D/2) float-sized words
// (a new contiguous tensor whose elements are bit patterns, not numbers: copy them, never compute on them), word i
// holding x[2i] rounded as round_to_bf16 in its low 16 bits and x[2i + 1] in its high 16 bits.
Tensor to_bf16_pairs(const Tensor& x);
// The inverse: words (..., C)  ->  (..., 2C) float32, each element its bf16 value exactly.
Tensor from_bf16_pairs(const Tensor& words);

// A linear layer's weight (out, in) prepared once for one precision and the kernels this CPU runs.
//   kFloat32:  the weight itself (shared storage), and where sgemm runs its own AVX-512 kernel its transpose packed
//              once into that kernel's panels (twice the weight's memory); linear() gives the float32 bits exactly.
//              The packed copy is taken here: a weight changed in place later needs a new LinearWeight.
//   kBFloat16: with AVX512-BF16 (qkv/kernels/cpu.h Isa::kAvx512Bf16), bfloat16 packed for vdpbf16ps; otherwise a
//              bf16-rounded float32 copy for the float32 kernels.
//   kInt8:     int8 values per output channel (symmetric scale max|row| / 127); with AVX512-VNNI, or AVX-VNNI
//              on the avx2vnni path, packed for vpdpbusd (in <= 65536), otherwise rows for the vpmaddwd / portable
//              kernel. All give the same bits.
// rows(begin, end) is the weight of output channels [begin, end) without copying (a packed Q/K/V projection).
// quantized(w): a GGUF weight (out, in) kept in its stored blocks (qkv/kernels/quant_gemm.h); linear() runs
// kernels::gemm_quant on it (where the avx512vnni build runs, on a copy of its 16-row tiles repacked once here:
// QuantMatrix::for_products). Its precision() is kInt8 where the type has the integer block product (Q4_0, Q4_1,
// Q5_0, Q5_1, Q8_0: int8 activations per 32, int32 sums) and kFloat32 for the types read through float32 rows.
class LinearWeight {
 public:
  LinearWeight() = default;
  LinearWeight(const Tensor& weight, Precision precision);
  static LinearWeight quantized(kernels::QuantMatrix weight);

  Precision precision() const { return precision_; }
  bool quantized() const { return quant_ != nullptr; }
  const kernels::QuantMatrix* quant() const { return quant_.get(); }  // every row; nullptr unless quantized()
  int64_t out_features() const { return end_ - begin_; }
  int64_t in_features() const { return in_; }
  bool defined() const { return in_ >= 0; }
  LinearWeight rows(int64_t begin, int64_t end) const;

 private:
  friend Tensor linear(const Tensor& x, const LinearWeight& w, const Tensor& bias);
  Precision precision_ = Precision::kFloat32;
  Tensor weight_;                                  // kFloat32, converting kBFloat16: (out, in) over [begin_, end_)
  std::shared_ptr<const kernels::Int8Rows> int8_;  // kInt8 without a packed build: every row; [begin_, end_) used
  std::shared_ptr<const kernels::PackedB> packed_;  // AVX512-BF16 kBFloat16, avx512vnni/avx2vnni kInt8: every row
  std::shared_ptr<const kernels::SgemmPackedB> packed32_;  // kFloat32 on sgemm's AVX-512 kernel: every row
  std::shared_ptr<const kernels::QuantMatrix> quant_;      // quantized(): every row; [begin_, end_) used
  int64_t begin_ = 0, end_ = 0, in_ = -1;
};

// x: (..., in) -> (..., out) = x·weightᵀ + bias at the weight's precision. kFloat32 is linear(x, weight, bias);
// kBFloat16 is the packed AVX512-BF16 product or linear(round_to_bf16(x), rounded weight, bias); kInt8 quantizes each row of x (per token) and runs the
// int8 kernel (exact int32 sums, float32 scale and bias).
Tensor linear(const Tensor& x, const LinearWeight& w, const Tensor& bias = {});

// matmul(a, b) at `precision`: kFloat32 is matmul(a, b); kBFloat16 runs the AVX512-BF16 kernel (b packed per
// product, float32 accumulation) where the CPU has it, else rounds both operands and runs the float32 product. kInt8 throws std::invalid_argument (int8 is for linear layers only).
Tensor matmul(const Tensor& a, const Tensor& b, Precision precision);

}  // namespace qkv
