// Rotary position embedding (Su et al. 2021): rotate pairs of q/k features by pos·θ_i, θ_i = base^(-2i/D), so that
// q_m·k_n depends only on m - n. Two pairings exist in the wild; both are offered.
#pragma once

#include <cstdint>
#include <vector>

#include "qkv/core/tensor.h"

namespace qkv {

enum class RopeVariant {
  kInterleaved,  // pairs (2i, 2i+1): GPT-J, Meta LLaMA (complex view)
  kHalfSplit,    // pairs (i, i + D/2): GPT-NeoX, HF transformers (rotate_half)
};

// x: (..., T, D), D even  ->  rotated copy (..., T, D), contiguous; x may be strided.
// Row t has position offset + t. For pair (a, b) of frequency i, angle φ = pos·θ_i:
//   a' = a·cos φ - b·sin φ,   b' = a·sin φ + b·cos φ
// θ_i and φ follow the reference float32 recipe (inv_freq = 1 / base^(2i/D), φ = pos · inv_freq in float32).
// offset >= 0, base > 0 and finite.
Tensor rope_apply(const Tensor& x, int64_t offset = 0, float base = 10000.0f,
                  RopeVariant variant = RopeVariant::kHalfSplit);

// Same, with an explicit position per row: positions.size() == T, each >= 0.
Tensor rope_apply(const Tensor& x, const std::vector<int64_t>& positions, float base = 10000.0f,
                  RopeVariant variant = RopeVariant::kHalfSplit);

}  // namespace qkv
