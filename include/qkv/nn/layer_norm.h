// nn::LayerNorm over the last dimension, as torch.nn.LayerNorm(E, eps, elementwise_affine, bias).
// Parameters "weight" (E) = 1 and "bias" (E) = 0; absent when elementwise_affine is false (bias also when bias is false).
#pragma once

#include <cstdint>

#include "qkv/core/tensor.h"
#include "qkv/nn/context.h"
#include "qkv/nn/module.h"

namespace qkv::nn {

class LayerNorm : public Module {
 public:
  // E > 0, eps > 0 and finite.
  explicit LayerNorm(int64_t normalized_shape, float eps = 1e-5f, bool elementwise_affine = true,
                     bool bias = true);

  // x: (..., E)  ->  (..., E). Records its backward when `c` trains.
  ad::Var forward(const Context& c, const ad::Var& x) const;
  Tensor forward(const Tensor& x) const { return forward(Context(), x).value; }

  int64_t normalized_shape() const { return size_; }
  float eps() const { return eps_; }

  Tensor weight;  // (E) or undefined
  Tensor bias;    // (E) or undefined

 private:
  int64_t size_;
  float eps_;
};

// RMSNorm over the last dimension with one parameter "weight" (E), as HF's LlamaRMSNorm (weight = 1 at init,
// y = x·rstd·weight) or, with unit_offset, Gemma's (weight = 0 at init, y = x·rstd·(1 + weight)).
class RmsNorm : public Module {
 public:
  // E > 0, eps >= 0 and finite.
  explicit RmsNorm(int64_t normalized_shape, float eps = 1e-6f, bool unit_offset = false);

  // x: (..., E)  ->  (..., E). Records its backward when `c` trains.
  ad::Var forward(const Context& c, const ad::Var& x) const;
  Tensor forward(const Tensor& x) const { return forward(Context(), x).value; }

  int64_t normalized_shape() const { return size_; }
  float eps() const { return eps_; }
  bool unit_offset() const { return unit_offset_; }

  Tensor weight;  // (E)

 private:
  int64_t size_;
  float eps_;
  bool unit_offset_;
};

}  // namespace qkv::nn
