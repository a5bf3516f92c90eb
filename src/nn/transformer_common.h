// Private helpers shared by the transformer modules' sources (not installed): config checks, seeds, input checks.
// Errors name the calling module via `op`.
#pragma once

#include <cstdint>

#include "qkv/core/rng.h"
#include "qkv/core/tensor.h"
#include "qkv/nn/transformer.h"

namespace qkv::nn::detail {

// Validates d_model, nhead, dim_feedforward, dropout and eps; returns d_model.
int64_t checked_layer_config(const TransformerLayerConfig& c, const char* op);

// A 64-bit seed drawn from `rng` (for a Dropout child's own Rng).
uint64_t draw_seed(Rng& rng);

// x must be (B, T, d_model), or (N, d_model) when packed (cu_seqlens given).
void check_sequence(const Tensor& x, int64_t d_model, const char* op, const char* name, bool packed = false);

}  // namespace qkv::nn::detail
