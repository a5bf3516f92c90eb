// The Adam/AdamW element update in torch.optim's float32 operation order: a portable loop and an AVX2+FMA build
// that give the same bits (FMA, sqrt and division are exactly rounded), and the threaded dispatcher the
// optimizers call.
#pragma once

#include <cstdint>

namespace qkv::kernels {

// Per-parameter constants of one Adam step (see train::Adam::step).
struct AdamScalars {
  float decay, wd, w1, b2, w2, eps, neg_step_size, bc2_sqrt;
  bool decay_on, decoupled;
};

// All n elements of p, m, v updated from g: chunks over OpenMP threads (each element's update is independent, so
// any split gives the same bits), each chunk on the widest path active_isa() allows (qkv/kernels/cpu.h).
void adam_update(const AdamScalars& c, int64_t n, float* p, const float* g, float* m, float* v);

// Elements [begin, end) on one thread, one path by name (avx2:: only when cpu_supports(Isa::kAvx2)).
namespace portable {
void adam_update_range(const AdamScalars& c, int64_t begin, int64_t end, float* p, const float* g, float* m,
                       float* v);
}  // namespace portable
namespace avx2 {
void adam_update_range(const AdamScalars& c, int64_t begin, int64_t end, float* p, const float* g, float* m,
                       float* v);
}  // namespace avx2

}  // namespace qkv::kernels
