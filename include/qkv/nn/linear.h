// nn::Linear: y = x·weightᵀ + bias with PyTorch's parameter names ("weight" (out, in), "bias" (out)) and init.
// Init as torch.nn.Linear: weight and bias ~ U(-1/sqrt(in), 1/sqrt(in)) drawn from the caller's qkv::Rng.
#pragma once

#include <cstdint>

#include "qkv/core/rng.h"
#include "qkv/core/tensor.h"
#include "qkv/nn/context.h"
#include "qkv/nn/module.h"

namespace qkv::nn {

class Linear : public Module {
 public:
  // in, out >= 0 (in == 0 gives zero weights and bias, as PyTorch's init leaves them empty/zero-bounded).
  Linear(int64_t in_features, int64_t out_features, bool bias, Rng& rng);
  Linear(int64_t in_features, int64_t out_features, Rng& rng) : Linear(in_features, out_features, true, rng) {}

  // x: (..., in)  ->  (..., out). Records its backward when `c` trains. with_bias false: x·weightᵀ alone (the bias
  // then joins a fused step that follows, as ad::add_bias_gelu or ad::add_layer_norm).
  ad::Var forward(const Context& c, const ad::Var& x, bool with_bias = true) const;
  Tensor forward(const Tensor& x) const { return forward(Context(), x).value; }

  int64_t in_features() const { return in_features_; }
  int64_t out_features() const { return out_features_; }
  bool has_bias() const { return bias.defined(); }

  Tensor weight;  // (out, in)
  Tensor bias;    // (out), undefined when constructed with bias = false

 private:
  int64_t in_features_;
  int64_t out_features_;
};

}  // namespace qkv::nn
