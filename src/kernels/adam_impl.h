// Private (not installed): the Adam/AdamW element update in torch.optim's float32 operation order, as one inline
// loop shared by adam.cpp (portable build) and adam_avx2.cpp (the tail there, compiled with FMA, so std::fma is one
// instruction).
#pragma once

#include <cmath>
#include <cstdint>

#include "qkv/kernels/adam.h"

// Internal linkage: each including file (compiled with different -m flags) keeps its own copy.
namespace qkv::kernels::detail {
namespace {

// Elements [begin, end) of p, m, v updated from g. std::fma and IEEE sqrt/div are exactly rounded, so every build
// gives the same bits.
inline void adam_update_loop(const AdamScalars& c, int64_t begin, int64_t end, float* p, const float* g, float* m,
                             float* v) {
  const bool lerp_low = c.w1 < 0.5f;
#pragma omp simd
  for (int64_t j = begin; j < end; ++j) {
    float gj = g[j];
    float pj = p[j];
    if (c.decay_on) {
      if (c.decoupled) pj = pj * c.decay;
      else gj = std::fma(pj, c.wd, gj);  // grad.add(param, alpha=wd): a fused multiply-add in PyTorch
    }
    // lerp as PyTorch's vectorised kernel: fmadd(w, g - m, m), or fnmadd(g - m, 1 - w, g) for w >= 0.5.
    const float mj = lerp_low ? std::fma(c.w1, gj - m[j], m[j]) : std::fma(-(gj - m[j]), 1.0f - c.w1, gj);
    const float vj = std::fma(c.w2 * gj, gj, v[j] * c.b2);  // mul_(β2).addcmul_(g, g, 1 - β2), fused as in PyTorch
    m[j] = mj;
    v[j] = vj;
    const float denom = std::sqrt(vj) / c.bc2_sqrt + c.eps;
    p[j] = pj + c.neg_step_size * mj / denom;
  }
}

}  // namespace
}  // namespace qkv::kernels::detail
