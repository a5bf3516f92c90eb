// Attention in 40 lines: softmax(q·kᵀ·scale + mask)·v as plain float64 loops (src/ops/attention_plain.cpp), the
// formula a learner reads and the float64 oracle the tests compare every attention path against.
#pragma once

#include <vector>

#include "qkv/core/attention_types.h"
#include "qkv/core/shape.h"
#include "qkv/core/tensor.h"

namespace qkv {

// A row-major float64 array.
struct Array64 {
  Shape shape;
  std::vector<double> data;
};
Array64 to_array64(const Tensor& t);  // any strides

struct PlainAttention {
  Shape batch;                  // the broadcast leading dims of q, k and v (with GQA: the outer dims, then Hq)
  std::vector<double> out;      // (batch..., Tq, Dv)
  std::vector<double> weights;  // (batch..., Tq, Tk); a fully masked row is 0
  std::vector<double> lse;      // (batch..., Tq); -inf on a fully masked row
};

// q: (..., Tq, Dk)  k: (..., Tk, Dk)  v: (..., Tk, Dv); mask: nullptr for none, else broadcast to
// (batch..., Tq, Tk) and read as options.mask_kind (options.mask itself is not read). causal, scale, enable_gqa,
// the window and softcap mean what they mean to attention(); the arguments are checked as attention() checks them.
// Everything runs and is returned in float64: precision, return_weights and return_lse are not read.
PlainAttention attention_plain(const Array64& q, const Array64& k, const Array64& v, const Array64* mask,
                               const AttentionOptions& options = {});
// The same on float32 tensors (copied to float64; options.mask is the mask).
PlainAttention attention_plain(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& options = {});

}  // namespace qkv
