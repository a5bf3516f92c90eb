// nn::Dropout: inverted dropout with its own seeded Rng; identity in eval mode (Module::training() false) or p == 0.
// No parameters, so it adds nothing to state_dict, but registering it as a child makes train()/eval() reach it.
#pragma once

#include <cstdint>

#include "qkv/core/rng.h"
#include "qkv/core/tensor.h"
#include "qkv/nn/context.h"
#include "qkv/nn/module.h"

namespace qkv::nn {

class Dropout : public Module {
 public:
  // p in [0, 1]; p == 1 zeroes everything in training, as PyTorch.
  explicit Dropout(float p = 0.5f, uint64_t seed = 0);

  // x: any shape -> same shape. Eval mode or p == 0 returns x itself (shared storage, no copy).
  // On a Context: draws from the Context's dropout Rng (the run's one stream), not from this module's own.
  ad::Var forward(const Context& c, const ad::Var& x) const { return c.dropout(x, p_, training(), "Dropout"); }
  // Draws from this module's own Rng.
  Tensor forward(const Tensor& x);

  float p() const { return p_; }
  Rng& rng() { return rng_; }

 private:
  float p_;
  Rng rng_;
};

}  // namespace qkv::nn
