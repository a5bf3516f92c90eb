// Baseline build of the GELU loops (activations_impl.h) and the run-time dispatch: AVX2+FMA when the CPU has both
// (checked once), chunks of the array spread over OpenMP threads.
#include "qkv/kernels/activations.h"

#include <algorithm>

#include "activations_impl.h"

namespace qkv::kernels {

namespace portable {

void gelu_forward(const float* x, float* y, int64_t n, bool tanh_approx) {
  if (tanh_approx) gelu_tanh_fwd(x, y, n);
  else gelu_erf_fwd(x, y, n);
}

void gelu_backward(const float* x, const float* dy, float* dx, int64_t n, bool tanh_approx) {
  if (tanh_approx) gelu_tanh_bwd(x, dy, dx, n);
  else gelu_erf_bwd(x, dy, dx, n);
}

void tanh_forward(const float* x, float* y, int64_t n) { tanh_fwd(x, y, n); }
void sigmoid_forward(const float* x, float* y, int64_t n) { sigmoid_fwd(x, y, n); }

}  // namespace portable

namespace {

bool use_avx2() {
  static const bool on = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return on;
}

// Elements per OpenMP work item: arrays below two chunks stay on one thread (a parallel region costs more than
// ~100 µs of this work when the machine is busy).
constexpr int64_t kChunk = int64_t{1} << 16;

}  // namespace

void gelu_forward(const float* x, float* y, int64_t n, bool tanh_approx) {
  const bool v = use_avx2();
  const int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (chunks > 1)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t s = c * kChunk, len = std::min(kChunk, n - s);
    if (v) avx2::gelu_forward(x + s, y + s, len, tanh_approx);
    else portable::gelu_forward(x + s, y + s, len, tanh_approx);
  }
}

void gelu_backward(const float* x, const float* dy, float* dx, int64_t n, bool tanh_approx) {
  const bool v = use_avx2();
  const int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (chunks > 1)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t s = c * kChunk, len = std::min(kChunk, n - s);
    if (v) avx2::gelu_backward(x + s, dy + s, dx + s, len, tanh_approx);
    else portable::gelu_backward(x + s, dy + s, dx + s, len, tanh_approx);
  }
}

void tanh_forward(const float* x, float* y, int64_t n) {
  const bool v = use_avx2();
  const int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (chunks > 1)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t s = c * kChunk, len = std::min(kChunk, n - s);
    if (v) avx2::tanh_forward(x + s, y + s, len);
    else portable::tanh_forward(x + s, y + s, len);
  }
}

void sigmoid_forward(const float* x, float* y, int64_t n) {
  const bool v = use_avx2();
  const int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (chunks > 1)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t s = c * kChunk, len = std::min(kChunk, n - s);
    if (v) avx2::sigmoid_forward(x + s, y + s, len);
    else portable::sigmoid_forward(x + s, y + s, len);
  }
}

}  // namespace qkv::kernels
