// The portable build of the Adam element update (adam_impl.h) and the threaded dispatcher; the AVX2+FMA build is
// adam_avx2.cpp.
#include "qkv/kernels/adam.h"

#include <algorithm>

#include "adam_impl.h"
#include "qkv/kernels/cpu.h"

namespace qkv::kernels {
namespace {
constexpr int64_t kParallelMin = int64_t{1} << 17;  // parameter elements per OpenMP region
}  // namespace

namespace portable {
void adam_update_range(const AdamScalars& c, int64_t begin, int64_t end, float* p, const float* g, float* m,
                       float* v) {
  detail::adam_update_loop(c, begin, end, p, g, m, v);
}
}  // namespace portable

void adam_update(const AdamScalars& c, int64_t n, float* p, const float* g, float* m, float* v) {
  const auto kernel = active_isa() >= Isa::kAvx2 ? avx2::adam_update_range : portable::adam_update_range;
  // Chunks of the parameter over the threads; each element's update is independent (same bits for any split).
  const int64_t chunks = n >= kParallelMin ? std::max<int64_t>(1, n / (kParallelMin / 4)) : 1;
#pragma omp parallel for schedule(static) if (chunks > 1)
  for (int64_t ch = 0; ch < chunks; ++ch) {
    const int64_t b = n * ch / chunks, e = n * (ch + 1) / chunks;
    kernel(c, b, e, p, g, m, v);
  }
}

}  // namespace qkv::kernels
