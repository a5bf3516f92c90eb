// The draws of every module's initial parameter values, and a scope that skips them for a module built only to
// have its parameters loaded.
#pragma once

#include "qkv/core/rng.h"
#include "qkv/core/tensor.h"

namespace qkv::nn {

// While a SkipInit lives on this thread, init_uniform and init_normal return uninitialised tensors (nothing drawn
// from the Rng, nothing written: a large model's pages are not touched before its weights are loaded):
// for a module built only to have every parameter loaded next (LlamaForCausalLM::from_pretrained,
// SentenceEncoder), as PyTorch's torch.nn.utils.skip_init. Scopes nest.
class SkipInit {
 public:
  SkipInit();
  ~SkipInit();
  SkipInit(const SkipInit&) = delete;
  SkipInit& operator=(const SkipInit&) = delete;
  static bool active();
};

// U[lo, hi) of `shape` from rng (lo < hi), or uninitialised under SkipInit.
Tensor init_uniform(Rng& rng, const Shape& shape, float lo, float hi);
// N(mean, stddev²) of `shape` from rng, or uninitialised under SkipInit.
Tensor init_normal(Rng& rng, const Shape& shape, float mean = 0.0f, float stddev = 1.0f);

}  // namespace qkv::nn
