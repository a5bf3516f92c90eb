// AVX2+FMA microkernels of the fused attention: attention_flash_blocks.h's register-blocked FMA product in blocks of
// up to 6x16 (wider for few rows), plus the 8-lane instantiation of attention_flash_simd.h (exp2, online softmax,
// backward probabilities, decoding's dot-product scores), both on micro.h's Lanes256. Compiled with -mavx2 -mfma.
#include <immintrin.h>

#include "attention_flash_blocks.h"
#include "attention_flash_simd.h"
#include "micro.h"

namespace qkv::kernels::flash {
namespace {

// The lane traits of attention_flash_simd.h and attention_flash_blocks.h: micro.h's Lanes256 and the four-row lane
// sum of decoding's scores (pairs of rows, then pairs of pairs, then the two halves).
struct Avx2 : detail::Lanes256 {
  static void sums4(F a0, F a1, F a2, F a3, float* out) {
    const __m256 t0 = _mm256_add_ps(_mm256_unpacklo_ps(a0, a1), _mm256_unpackhi_ps(a0, a1));
    const __m256 t1 = _mm256_add_ps(_mm256_unpacklo_ps(a2, a3), _mm256_unpackhi_ps(a2, a3));
    const __m256d d0 = _mm256_castps_pd(t0), d1 = _mm256_castps_pd(t1);
    const __m256 u = _mm256_add_ps(_mm256_castpd_ps(_mm256_unpacklo_pd(d0, d1)),
                                   _mm256_castpd_ps(_mm256_unpackhi_pd(d0, d1)));
    _mm_storeu_ps(out, _mm_add_ps(_mm256_castps256_ps128(u), _mm256_extractf128_ps(u, 1)));
  }
};

template <int R, int NV, bool kTail>
inline void micro(const Gemm& g, const float* a, const float* b, float* c, __m256i last) {
  product_block<Avx2, detail::FmaF32, R, NV, kTail>(g, a, b, c, last);
}

template <int R>
inline void row_block(const Gemm& g, int64_t r0) {
  const float* a = g.a + r0 * g.a_rs;
  float* c = g.c + r0 * g.c_rs;
  const Gemm gr = rows_from(g, r0);
  int64_t j = 0;
  const __m256i none = _mm256_setzero_si256();
  // Few rows (decoding): wider column blocks, so that enough independent accumulators hide the FMA latency and
  // each row of B streams through once.
  if constexpr (R == 1) {
    for (; j + 128 <= g.cols; j += 128) micro<1, 16, false>(gr, a, g.b + j, c + j, none);
    if (j + 64 <= g.cols) micro<1, 8, false>(gr, a, g.b + j, c + j, none), j += 64;
    if (j + 32 <= g.cols) micro<1, 4, false>(gr, a, g.b + j, c + j, none), j += 32;
  } else if constexpr (R == 2) {
    for (; j + 48 <= g.cols; j += 48) micro<2, 6, false>(gr, a, g.b + j, c + j, none);
    if (j + 32 <= g.cols) micro<2, 4, false>(gr, a, g.b + j, c + j, none), j += 32;
  } else if constexpr (R == 3) {
    for (; j + 32 <= g.cols; j += 32) micro<3, 4, false>(gr, a, g.b + j, c + j, none);
  }
  for (; j + 16 <= g.cols; j += 16) micro<R, 2, false>(gr, a, g.b + j, c + j, none);
  if (j + 8 <= g.cols) {
    micro<R, 1, false>(gr, a, g.b + j, c + j, none);
    j += 8;
  }
  if (j < g.cols) micro<R, 1, true>(gr, a, g.b + j, c + j, Avx2::tail(g.cols - j));
}

void gemm(const Gemm& g) {
  for_row_blocks<6>(g.rows, [&]<int R>(int64_t r) { row_block<R>(g, r); });
}

}  // namespace

const Kernels& avx2_kernels() {
  static const Kernels k{"avx2", gemm, softmax_cols_impl<Avx2>, dot_scores_impl<Avx2>, bwd_probs_impl<Avx2>};
  return k;
}

}  // namespace qkv::kernels::flash
