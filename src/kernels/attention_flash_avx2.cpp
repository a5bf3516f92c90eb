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

// Blocks of up to max_vectors(R) vectors by R rows: few rows (decoding) take wider column blocks, so that enough
// independent accumulators hide the FMA latency and each row of B streams through once.
constexpr int max_vectors(int rows) { return rows == 1 ? 16 : rows == 2 ? 6 : rows == 3 ? 4 : 2; }

void gemm(const Gemm& g) { product<Avx2, detail::FmaF32, 6, max_vectors>(g); }

}  // namespace

const Kernels& avx2_kernels() {
  static const Kernels k{"avx2", gemm, softmax_cols_impl<Avx2>, dot_scores_impl<Avx2>, bwd_probs_impl<Avx2>};
  return k;
}

}  // namespace qkv::kernels::flash
