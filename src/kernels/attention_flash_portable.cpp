// Portable microkernels of the fused attention: plain loops (the compiler may vectorise them for the baseline ISA).
// Used on CPUs without AVX2+FMA and as the readable twin of attention_flash_avx2.cpp.
#include <cmath>
#include <limits>

#include "attention_flash_kernels.h"

namespace qkv::kernels::flash {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

void gemm(const Gemm& g) {
  for (int64_t r = 0; r < g.rows; ++r) {
    float* c = g.c + r * g.c_rs;
    const float s = g.row_scale ? g.row_scale[r] : 1.0f;
    for (int64_t j = 0; j < g.cols; ++j) c[j] = g.accumulate ? c[j] * s : 0.0f;
    const float* a = g.a + r * g.a_rs;
    for (int64_t k = 0; k < g.depth; ++k) {
      const float av = a[k * g.a_ks];
      const float* b = g.b + k * g.b_ks;
      for (int64_t j = 0; j < g.cols; ++j) c[j] += av * b[j];
    }
  }
}

void softmax_cols(float* st, int64_t ld, int64_t nk, int64_t ncols, float* m, float* l, float* alpha) {
  for (int64_t c = 0; c < ncols; ++c) {
    float mx = m[c];
    for (int64_t j = 0; j < nk; ++j) mx = std::max(mx, st[j * ld + c]);
    const float base = mx == kNegInf ? 0.0f : mx;
    const float a = std::exp2(m[c] - base);
    float sum = 0.0f;
    for (int64_t j = 0; j < nk; ++j) {
      const float p = std::exp2(st[j * ld + c] - base);
      st[j * ld + c] = p;
      sum += p;
    }
    alpha[c] = a;
    l[c] = a * l[c] + sum;
    m[c] = mx;
  }
}

void dot_scores(const float* q, int64_t nq, int64_t dk, const float* k, int64_t k_rs, int64_t nk, float* st,
                int64_t ld) {
  for (int64_t j = 0; j < nk; ++j)
    for (int64_t i = 0; i < nq; ++i) {
      float s = 0.0f;
      for (int64_t d = 0; d < dk; ++d) s += q[i * dk + d] * k[j * k_rs + d];
      st[j * ld + i] = s;
    }
}

void bwd_probs(float* s, const float* bias, float* dp, int64_t ld, int64_t rows, int64_t cols, const float* lse2,
               const float* delta, float scale) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < cols; ++j) {
      const int64_t x = r * ld + j;
      // A blocked pair (score or bias -inf) gives p = 0 and dS = 0 even when its score or the row's lse/delta is NaN (the reference's
      // rule: dS = 0 wherever P = 0).
      const bool blocked = s[x] == kNegInf || (bias && bias[x] == kNegInf);
      const float p = blocked ? 0.0f : std::exp2(s[x] + (bias ? bias[x] : 0.0f) - lse2[r]);
      s[x] = p;
      dp[x] = p == 0.0f ? 0.0f : scale * p * (dp[x] - delta[r]);
    }
}

}  // namespace

const Kernels& portable_kernels() {
  static const Kernels k{"portable", gemm, softmax_cols, dot_scores, bwd_probs};
  return k;
}

}  // namespace qkv::kernels::flash
