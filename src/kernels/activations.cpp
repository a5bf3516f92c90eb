// Baseline build of the GELU loops (activations_impl.h) and the run-time dispatch: AVX2+FMA when active_isa()
// allows it (qkv/kernels/cpu.h), chunks of the array spread over OpenMP threads.
#include "qkv/kernels/activations.h"
#include "qkv/kernels/rnn_cells.h"

#include <algorithm>

#define QKV_ACT_BUILD portable
#include "activations_impl.h"
#include "qkv/kernels/cpu.h"

namespace qkv::kernels {

namespace {

bool use_avx2() { return active_isa() >= Isa::kAvx2; }

// Elements per OpenMP work item: arrays below two chunks stay on one thread (a parallel region costs more than
// ~100 µs of this work when the machine is busy).
constexpr int64_t kChunk = int64_t{1} << 16;
constexpr int64_t kBiasGeluParallelMin = int64_t{1} << 16;  // add_bias_gelu_rows: elements below this, one thread

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

namespace {

// y = f(x) in chunks of kChunk over the threads, each chunk on the AVX2 or the portable build of f.
void unary_chunks(const float* x, float* y, int64_t n, void (*fast)(const float*, float*, int64_t),
                  void (*plain)(const float*, float*, int64_t)) {
  const auto f = use_avx2() ? fast : plain;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (chunks > 1)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t s = c * kChunk;
    f(x + s, y + s, std::min(kChunk, n - s));
  }
}

}  // namespace

void tanh_forward(const float* x, float* y, int64_t n) {
  unary_chunks(x, y, n, avx2::tanh_forward, portable::tanh_forward);
}

void sigmoid_forward(const float* x, float* y, int64_t n) {
  unary_chunks(x, y, n, avx2::sigmoid_forward, portable::sigmoid_forward);
}

void silu_forward(const float* x, float* y, int64_t n) {
  unary_chunks(x, y, n, avx2::silu_forward, portable::silu_forward);
}

void add_bias_gelu_rows(float* x, const float* bias, int64_t rows, int64_t f, bool tanh_approx) {
  if (rows <= 0 || f <= 0) return;
  (void)use_avx2();  // resolves QKV_ISA here, outside the parallel region (gelu_forward reads the cached result)
  // Blocks of rows (about 16K elements: cache-resident between the two steps) spread over the threads.
  const int64_t block = std::max<int64_t>(1, (int64_t{1} << 14) / f);
  const int64_t blocks = (rows + block - 1) / block;
#pragma omp parallel for schedule(static) if (blocks > 1 && rows * f >= kBiasGeluParallelMin)
  for (int64_t k = 0; k < blocks; ++k) {
    const int64_t r0 = k * block, n = std::min(block, rows - r0);
    float* p = x + r0 * f;
    if (bias)
      for (int64_t r = 0; r < n; ++r)
        for (int64_t j = 0; j < f; ++j) p[r * f + j] += bias[j];
    gelu_forward(p, p, n * f, tanh_approx);
  }
}

// The RNN gates: this 4-lane baseline build only (an FMA build would change their bits).
void gru_cell_rows(int64_t nb, int64_t hs, const float* xi, int64_t xi_rs, const float* hh, const float* hp,
                   float* r, float* z, float* n, float* hn, float* h_out) {
  for (int64_t b = 0; b < nb; ++b) {
    const int64_t o = b * hs;
    gru_row(hs, xi + b * xi_rs, hh + 3 * o, hp + o, r + o, z + o, n + o, hn + o, h_out + o);
  }
}

void lstm_cell_rows(int64_t nb, int64_t hs, const float* xi, int64_t xi_rs, const float* hh, const float* cp,
                    float* i, float* f, float* g, float* o, float* c_out, float* h_out) {
  for (int64_t b = 0; b < nb; ++b) {
    const int64_t k = b * hs;
    lstm_row(hs, xi + b * xi_rs, hh + 4 * k, cp + k, i + k, f + k, g + k, o + k, c_out + k, h_out + k);
  }
}

}  // namespace qkv::kernels
