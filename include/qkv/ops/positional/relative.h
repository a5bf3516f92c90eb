// Relative position representations (Shaw, Uszkoreit & Vaswani 2018): learned vectors for the clipped distance j - i
// added to the keys (inside the scores) and to the values (inside the weighted sum).
#pragma once

#include <cstdint>

#include "qkv/core/tensor.h"
#include "qkv/ops/attention.h"

namespace qkv {

// Table row for a key at position j seen from a query at position p: clamp(j - p, -clip, clip) + clip.
int64_t shaw_relative_index(int64_t j_minus_p, int64_t clip);

// q: (..., Tq, D)  k: (..., Tk, D)  v: (..., Tk, Dv)  rel_k: (2·clip+1, D)  rel_v: (2·clip+1, Dv) or undefined
//   ->  out (..., Tq, Dv); weights (..., Tq, Tk) if options.return_weights; lse (..., Tq) if options.return_lse
// Query i sits at position p_i = i + query_offset (pass Tk - Tq when decoding against a KV cache); key j at j.
//   r_ij  = clamp(j - p_i, -clip, clip)
//   e_ij  = scale · q_i · (k_j + rel_k[r_ij + clip])  (+ additive mask; blocked pairs -> -inf)
//   z_i   = Σ_j α_ij (v_j + rel_v[r_ij + clip]),  α = softmax_j(e)
// q, k, v share the same leading dims (no broadcasting); options.mask broadcasts to (..., Tq, Tk).
// options.mask / mask_kind / causal / scale / return_weights / return_lse mean what they mean in qkv::attention.
// A fully masked row gives out 0, weights 0, lse -inf. clip >= 0. Inputs may be strided.
AttentionResult relative_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& rel_k,
                                   const Tensor& rel_v, int64_t clip, const AttentionOptions& options = {},
                                   int64_t query_offset = 0);

}  // namespace qkv
