// Private to ops (not installed): attention after attention_check has run, so that each attention checks its
// arguments once: attention() and its fused and reference entries, ad::attention's node and its backward.
#pragma once

#include "qkv/core/attention_types.h"
#include "qkv/core/tensor.h"

namespace qkv::detail {

// What attention() runs once `batch` = attention_check(q, k, v, options): an empty input gives zeros (allow_empty),
// dropout the reference with the dropped weights, else the fused kernel unless weights are asked for.
AttentionResult attention_checked(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& options,
                                  const Shape& batch);
// attention_backward after the forward's check: d_out must have the output's shape (a tape's dout has it).
AttentionGrads attention_backward_checked(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                                          const Tensor& lse, const Tensor& d_out, const AttentionOptions& options,
                                          const Shape& batch);

}  // namespace qkv::detail
