// Initial parameter draws, skipped inside a SkipInit scope (modules built only to be loaded).
#include "qkv/nn/init.h"

namespace qkv::nn {
namespace {
thread_local int skip_depth = 0;
}  // namespace

SkipInit::SkipInit() { ++skip_depth; }
SkipInit::~SkipInit() { --skip_depth; }
bool SkipInit::active() { return skip_depth > 0; }

Tensor init_uniform(Rng& rng, const Shape& shape, float lo, float hi) {
  return SkipInit::active() ? Tensor::empty(shape) : rng.uniform(shape, lo, hi);
}

Tensor init_normal(Rng& rng, const Shape& shape, float mean, float stddev) {
  return SkipInit::active() ? Tensor::empty(shape) : rng.normal(shape, mean, stddev);
}

}  // namespace qkv::nn
