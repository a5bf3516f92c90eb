// Relative position representations (Shaw, Uszkoreit & Vaswani 2018): learned vectors for the clipped distance j - i
// added to the keys (inside the scores) and to the values (inside the weighted sum).
#pragma once

#include <cstdint>

#include "qkv/core/rng.h"
#include "qkv/core/tensor.h"
#include "qkv/nn/module.h"
#include "qkv/ops/positional/relative.h"

namespace qkv::nn {

// Holds Shaw's two tables; forward runs relative_attention on already projected, head-split q, k, v.
class ShawRelativePosition : public Module {
 public:
  // rel_k, rel_v: (2·clip+1, D) zeros. clip >= 0, D >= 1.
  ShawRelativePosition(int64_t clip, int64_t D);
  // rel_k, rel_v ~ N(0, init_std).
  ShawRelativePosition(int64_t clip, int64_t D, Rng& rng, float init_std = 1.0f);

  // q: (B, H, Tq, D)  k: (B, H, Tk, D)  v: (B, H, Tk, D)  ->  out (B, H, Tq, D) (+ weights (B, H, Tq, Tk))
  AttentionResult forward(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& options = {},
                          int64_t query_offset = 0) const;

  int64_t clip() const { return clip_; }
  int64_t head_dim() const { return head_dim_; }

  Tensor rel_k;  // (2·clip+1, D)
  Tensor rel_v;  // (2·clip+1, D)

 private:
  int64_t clip_;
  int64_t head_dim_;
};

}  // namespace qkv::nn
