// The Llama layers' linear weights as a GGUF file stores them, where they have the integer block product
// (kernels::gemm_quant): what the layers' inference fast paths (one call for Q, K and V; the gated MLP in one
// kernel) take instead of composing products op by op.
#pragma once

#include "qkv/kernels/quant_gemm.h"
#include "qkv/nn/linear.h"

namespace qkv::models::detail {

// The weight of l as stored, where it has the integer product and is not a slice (nullptr otherwise).
inline const kernels::QuantMatrix* stored_integer_weight(const nn::Linear& l) {
  if (!l.has_stored_weights()) return nullptr;
  const LinearWeight& w = l.linear_weight(l.weight);
  const kernels::QuantMatrix* q = w.quant();
  if (q == nullptr || !kernels::quant_gemm_integer(q->type) || w.out_features() != q->rows) return nullptr;
  return q;
}

// l's bias as a contiguous array; nullptr where it has none, or one that is not contiguous (bias_ok says which).
inline const float* bias_data(const nn::Linear& l) {
  return l.has_bias() && l.bias.is_contiguous() ? l.bias.data() : nullptr;
}
inline bool bias_ok(const nn::Linear& l) { return !l.has_bias() || bias_data(l) != nullptr; }

}  // namespace qkv::models::detail
