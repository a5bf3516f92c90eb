// ALiBi (Press, Smith & Lewis 2022): no position embedding; each head adds -slope_h · distance to its scores.
// Slopes are a geometric sequence per head count, with the paper's recipe for non-powers of two.
#pragma once

#include <cstdint>

#include "qkv/core/tensor.h"

namespace qkv {

// -> (H): for H a power of two, slope_h = 2^(-8(h+1)/H) (H = 8: 1/2, 1/4, ..., 1/256).
// Otherwise, with c the largest power of two below H: the c slopes of c, then every other slope of 2c
// (2c's slopes 0, 2, 4, ...) until H slopes. H >= 1.
Tensor alibi_slopes(int64_t H);

enum class AlibiMode {
  kCausal,     // -slope·(p_i - j) for keys at or before the query, -inf after it (causal mask folded in)
  kSymmetric,  // -slope·|p_i - j| (bidirectional encoders)
};

// -> (1, H, Tq, Tk) additive bias; query i sits at p_i = i + query_offset (pass Tk - Tq when decoding against a
// KV cache), key j at j. Pass as AttentionOptions::mask with MaskKind::kAdditive. H >= 1, Tq, Tk >= 0.
// With kCausal a query that sees no key (p_i < 0) gets a fully masked row, which attention maps to 0.
Tensor alibi_bias(int64_t H, int64_t Tq, int64_t Tk, AlibiMode mode, int64_t query_offset = 0);

}  // namespace qkv
