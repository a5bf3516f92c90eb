// Reference attention kernels: scores -> mask -> softmax -> weights·v with BLAS, materialising the weights.
// The plain twin of the fused kernel and the oracle for it; inputs are validated by qkv::attention_check first.
#pragma once

#include <algorithm>
#include <cstdint>

#include "qkv/core/attention_types.h"

namespace qkv::kernels {

// Exclusive end of the keys query row i may see under `causal` (keys [0, end)); Tk when causal is kNone.
// kTopLeft: j <= i.  kBottomRight: j <= i + Tk - Tq.  The result is clamped to [0, Tk]; 0 = fully masked row.
inline int64_t causal_key_end(Causal causal, int64_t i, int64_t tq, int64_t tk) {
  int64_t end = tk;
  if (causal == Causal::kTopLeft) end = i + 1;
  if (causal == Causal::kBottomRight) end = i + 1 + (tk - tq);
  return std::clamp<int64_t>(end, 0, tk);
}

// q: (..., Tq, Dk)  k: (..., Tk, Dk)  v: (..., Tk, Dv)  ->  out: (batch..., Tq, Dv)
// weights (batch..., Tq, Tk) when options.return_weights, lse (batch..., Tq) when options.return_lse.
// `batch` is attention_check's broadcast batch shape, `scale` the effective scale. Any strides.
AttentionResult attention_reference_forward(const Tensor& q, const Tensor& k, const Tensor& v,
                                            const AttentionOptions& options, const Shape& batch,
                                            float scale);

// q, k, v as above; out, d_out: (batch..., Tq, Dv); lse: (batch..., Tq).
// out and lse may be undefined: they are then recomputed. -> dq, dk, dv with the shapes of q, k, v
// (summed over the batch axes each one was broadcast along).
AttentionGrads attention_reference_backward(const Tensor& q, const Tensor& k, const Tensor& v,
                                            const Tensor& out, const Tensor& lse, const Tensor& d_out,
                                            const AttentionOptions& options, const Shape& batch,
                                            float scale);

}  // namespace qkv::kernels
