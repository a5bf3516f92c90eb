// AVX-512 microkernels of the fused attention: attention_flash_blocks.h's register-blocked FMA product (up to
// 12x32), plus the 16-lane instantiation of attention_flash_simd.h (exp2, online softmax, backward probabilities:
// the AVX2 set's operations in the same order), both on micro.h's Lanes512. Compiled with -mavx512f/bw/dq/vl;
// picked at run time only when the CPU has all four.
#include <immintrin.h>

#include "attention_flash_blocks.h"
#include "attention_flash_simd.h"
#include "micro.h"  // also silences GCC 12's false -Wmaybe-uninitialized in its AVX-512 intrinsics

namespace qkv::kernels::flash {
namespace {

// The lane traits of attention_flash_simd.h and attention_flash_blocks.h: micro.h's Lanes512 and the four-row lane
// sum of decoding's scores (pairs of rows and pairs of pairs in each 128-bit lane, then the lanes).
struct Avx512 : detail::Lanes512 {
  static void sums4(F a0, F a1, F a2, F a3, float* out) {
    const __m512 t0 = _mm512_add_ps(_mm512_unpacklo_ps(a0, a1), _mm512_unpackhi_ps(a0, a1));
    const __m512 t1 = _mm512_add_ps(_mm512_unpacklo_ps(a2, a3), _mm512_unpackhi_ps(a2, a3));
    const __m512d d0 = _mm512_castps_pd(t0), d1 = _mm512_castps_pd(t1);
    const __m512 u = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(d0, d1)),
                                   _mm512_castpd_ps(_mm512_unpackhi_pd(d0, d1)));
    const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(u), _mm512_extractf32x8_ps(u, 1));
    _mm_storeu_ps(out, _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1)));
  }
};

// Blocks of up to kMaxNV vectors by R rows (R·NV accumulators fit the 32 registers).
constexpr int max_vectors(int rows) { return rows <= 2 ? 8 : rows <= 6 ? 4 : 2; }

// Narrow products (head-dim wide: P·V, dV, dK, dQ) take 12 rows at a time, wide ones (score tiles) 6. A product of
// one to three rows (decoding's P·V) is memory-bound: the AVX2 kernels' wide column blocks stream each row of V
// once with enough independent accumulators, and measured twice as fast as 512-bit row blocks here. Four to eight
// rows wider than 64 columns (GQA decoding's stacked query heads against D = 128 values) go two rows at a time
// across all columns: the first pair reads each V row whole, in order (as one prefetched stream), the others find
// it in L1; blocks of four rows over 64-column strips read every row in pieces and were 5-15 % slower (Zen 4).
void gemm(const Gemm& g) {
  if (g.rows <= 3) return avx2_kernels().gemm(g);
  if (g.rows <= 8 && g.cols > 64) return product<Avx512, detail::FmaF32, 2, max_vectors>(g);
  if (g.cols <= 32)
    product<Avx512, detail::FmaF32, 12, max_vectors>(g);
  else
    product<Avx512, detail::FmaF32, 6, max_vectors>(g);
}

// Eight columns or fewer (decoding's few query rows) fill at most half a 16-lane vector: the 8-lane set runs the
// same operations (the same bits) on half-width vectors, which CPUs that split 512-bit operations in two (Zen 4)
// issue at twice the rate.
void softmax_cols(float* st, int64_t ld, int64_t nk, int64_t ncols, float* m, float* l, float* alpha) {
  if (ncols <= 8) return avx2_kernels().softmax_cols(st, ld, nk, ncols, m, l, alpha);
  softmax_cols_impl<Avx512>(st, ld, nk, ncols, m, l, alpha);
}

}  // namespace

const Kernels& avx512_kernels() {
  static const Kernels k{"avx512", gemm, softmax_cols, dot_scores_impl<Avx512>, bwd_probs_impl<Avx512>};
  return k;
}

}  // namespace qkv::kernels::flash
