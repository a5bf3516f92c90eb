// T5 relative attention bias (Raffel et al. 2020): the distance j - i falls into one of num_buckets buckets (exact
// for small distances, logarithmic up to max_distance); each bucket holds one learned scalar per head.
#pragma once

#include <cstdint>

#include "qkv/core/rng.h"
#include "qkv/core/tensor.h"
#include "qkv/nn/module.h"
#include "qkv/ops/positional/t5_bias.h"

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
