// The float64 oracle of the attention tests: the library's plain attention (qkv/ops/attention_plain.h, "attention
// in 40 lines"), which shares no code with the kernels, under the names the tests use.
#pragma once

#include "qkv/core/shape.h"
#include "qkv/core/tensor.h"
#include "qkv/ops/attention.h"
#include "qkv/ops/attention_plain.h"

namespace qkv::testing {

using DTensor = Array64;
using OracleResult = PlainAttention;

inline DTensor to_dtensor(const Tensor& t) { return to_array64(t); }

inline Shape lead_of(const Shape& s) { return Shape(s.begin(), s.end() - 2); }

inline bool oracle_causal_allows(Causal causal, int64_t i, int64_t j, int64_t tq, int64_t tk) {
  switch (causal) {
    case Causal::kNone: return true;
    case Causal::kTopLeft: return j <= i;
    case Causal::kBottomRight: return j <= i + tk - tq;
  }
  return true;
}

// mask: nullptr for none, else broadcast to (batch..., Tq, Tk) and read as o.mask_kind (o.mask is not read).
inline OracleResult attention_oracle(const DTensor& q, const DTensor& k, const DTensor& v, const DTensor* mask,
                                     const AttentionOptions& o) {
  return attention_plain(q, k, v, mask, o);
}

inline OracleResult attention_oracle(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& o) {
  return attention_plain(q, k, v, o);
}

}  // namespace qkv::testing
