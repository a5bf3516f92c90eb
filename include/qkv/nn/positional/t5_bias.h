// T5 relative attention bias (Raffel et al. 2020): the distance j - i falls into one of num_buckets buckets (exact
// for small distances, logarithmic up to max_distance); each bucket holds one learned scalar per head.
#pragma once

#include <cstdint>

#include "qkv/core/rng.h"
#include "qkv/core/tensor.h"
#include "qkv/nn/module.h"

namespace qkv {

// Bucket of relative_position = key_pos - query_pos, bit-for-bit as HF transformers' _relative_position_bucket
// (the log term in float32, truncated toward zero). Returns a value in [0, num_buckets).
// bidirectional: half the buckets for keys after the query (j > i), half for keys at or before it.
// Unidirectional: keys after the query all fall in bucket 0.
// Needs num_buckets >= 2 (>= 4 when bidirectional) and max_distance > max_exact, where
// max_exact = num_buckets / 2 (num_buckets / 4 when bidirectional).
int64_t t5_relative_bucket(int64_t relative_position, bool bidirectional, int64_t num_buckets = 32,
                           int64_t max_distance = 128);

// table: (num_buckets, H)  ->  bias (1, H, Tq, Tk) with bias[0, h, i, j] = table[bucket(j - (i + query_offset)), h]
// Pass query_offset = Tk - Tq when decoding against a KV cache (HF slices the last Tq rows; same result).
Tensor t5_relative_bias(const Tensor& table, int64_t Tq, int64_t Tk, bool bidirectional, int64_t max_distance = 128,
                        int64_t query_offset = 0);

}  // namespace qkv

namespace qkv::nn {

class T5RelativeBias : public Module {
 public:
  // "relative_attention_bias.weight": (num_buckets, num_heads), zeros (load a state_dict).
  T5RelativeBias(int64_t num_buckets, int64_t max_distance, int64_t num_heads, bool bidirectional);
  // Same, ~ N(0, init_std).
  T5RelativeBias(int64_t num_buckets, int64_t max_distance, int64_t num_heads, bool bidirectional, Rng& rng,
                 float init_std = 1.0f);

  // -> (1, H, Tq, Tk) additive bias: pass as AttentionOptions::mask with MaskKind::kAdditive.
  Tensor forward(int64_t Tq, int64_t Tk, int64_t query_offset = 0) const;

  int64_t num_buckets() const { return num_buckets_; }
  int64_t max_distance() const { return max_distance_; }
  int64_t num_heads() const { return num_heads_; }
  bool bidirectional() const { return bidirectional_; }

  Tensor weight;  // (num_buckets, H), registered as "relative_attention_bias.weight"

 private:
  int64_t num_buckets_;
  int64_t max_distance_;
  int64_t num_heads_;
  bool bidirectional_;
};

}  // namespace qkv::nn
