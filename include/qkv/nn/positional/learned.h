// Learned absolute positional embedding (GPT-2 / BERT style): a trainable table of one row per position.
// Parameter "weight" (max_len, E), as PyTorch's nn.Embedding, so a state_dict loads with no renaming.
#pragma once

#include <cstdint>

#include "qkv/core/rng.h"
#include "qkv/core/tensor.h"
#include "qkv/nn/module.h"

namespace qkv::nn {

class LearnedPositionalEmbedding : public Module {
 public:
  // weight: (max_len, E) zeros (fill it with load_state_dict). max_len >= 1, E >= 1.
  LearnedPositionalEmbedding(int64_t max_len, int64_t E);
  // weight: (max_len, E) ~ N(0, init_std) (nn.Embedding's default is init_std = 1).
  LearnedPositionalEmbedding(int64_t max_len, int64_t E, Rng& rng, float init_std = 1.0f);

  // x: (..., T, E)  ->  x + weight[offset : offset + T]  (new contiguous tensor); offset + T <= max_len.
  Tensor forward(const Tensor& x, int64_t offset = 0) const;
  // -> (T, E): a view of weight rows offset .. offset + T - 1; offset + T <= max_len.
  Tensor rows(int64_t T, int64_t offset = 0) const;

  int64_t max_len() const { return max_len_; }
  int64_t embed_dim() const { return embed_dim_; }

  Tensor weight;  // (max_len, E)

 private:
  int64_t max_len_;
  int64_t embed_dim_;
};

}  // namespace qkv::nn
