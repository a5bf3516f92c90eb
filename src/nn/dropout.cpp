// nn::Dropout: a seeded Rng of its own and qkv::dropout; p == 1 in training gives zeros, as PyTorch.
// Eval mode and p == 0 return the input itself.
#include "qkv/nn/dropout.h"

#include <cmath>

#include "qkv/core/error.h"
#include "qkv/ops/dropout.h"

namespace qkv::nn {

Dropout::Dropout(float p, uint64_t seed) : p_(p), rng_(seed) {
  QKV_CHECK_ARG(p >= 0.0f && p <= 1.0f, "[Dropout] p must be in [0, 1], got ", p);
}

Tensor Dropout::forward(const Tensor& x) {
  QKV_CHECK_ARG(x.defined(), "[Dropout] input is undefined");
  return forward(Context(&rng_), x).value;
}

}  // namespace qkv::nn
