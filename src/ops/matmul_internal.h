// Private to ops/ (not installed): the float32 linear over a weight whose transpose sgemm has packed once.
#pragma once

#include <cstdint>

#include "qkv/core/tensor.h"
#include "qkv/kernels/sgemm.h"

namespace qkv::detail {

// qkv::linear(x, weight, bias), with weightᵀ's panels read from `packed` (sgemm_pack_b of the whole weightᵀ;
// `weight` is its output rows [col0, col0 + out), col0 a multiple of 32) where sgemm runs its own kernel. The
// same bits as qkv::linear(x, weight, bias); packed null or empty is exactly that call.
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias, const kernels::SgemmPackedB* packed,
              int64_t col0);

}  // namespace qkv::detail
