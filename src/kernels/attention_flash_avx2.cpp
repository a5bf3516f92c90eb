// AVX2+FMA microkernels of the fused attention: a 6x16 register-blocked FMA product, plus the 8-lane instantiation
// of attention_flash_simd.h (exp2, online softmax, backward probabilities, decoding's dot-product scores). Compiled
// with -mavx2 -mfma.
#include <immintrin.h>

#include "attention_flash_kernels.h"
#include "attention_flash_simd.h"

namespace qkv::kernels::flash {
namespace {

inline __m256i tail_mask(int64_t n) {  // lanes [0, n) on, 0 < n <= 8
  const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n)), idx);
}

// Lane traits of attention_flash_simd.h: 8 floats, masks as vectors.
struct Avx2 {
  using F = __m256;
  using M = __m256;
  using Tail = __m256i;
  static constexpr int64_t kW = 8;
  static constexpr int kRegs = 16;  // vector registers
  static F set1(float v) { return _mm256_set1_ps(v); }
  static F zero() { return _mm256_setzero_ps(); }
  static F load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, F v) { _mm256_storeu_ps(p, v); }
  static Tail tail(int64_t n) { return tail_mask(n); }
  static F load_n(const float* p, Tail t) { return _mm256_maskload_ps(p, t); }
  static void store_n(float* p, Tail t, F v) { _mm256_maskstore_ps(p, t, v); }
  static F add(F a, F b) { return _mm256_add_ps(a, b); }
  static F sub(F a, F b) { return _mm256_sub_ps(a, b); }
  static F mul(F a, F b) { return _mm256_mul_ps(a, b); }
  static F fmadd(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
  static F max(F a, F b) { return _mm256_max_ps(a, b); }
  static F min(F a, F b) { return _mm256_min_ps(a, b); }
  static M eq(F a, F b) { return _mm256_cmp_ps(a, b, _CMP_EQ_OQ); }
  static M ge(F a, F b) { return _mm256_cmp_ps(a, b, _CMP_GE_OQ); }
  static M unord(F a, F b) { return _mm256_cmp_ps(a, b, _CMP_UNORD_Q); }
  static M or_(M a, M b) { return _mm256_or_ps(a, b); }
  static F select(M m, F a, F b) { return _mm256_blendv_ps(b, a, m); }
  static F zero_unless(M m, F a) { return _mm256_and_ps(a, m); }
  static F pow2n(F p, F t) {
    const __m256i e = _mm256_slli_epi32(_mm256_castps_si256(t), 23);  // n << 23; t's exponent bits shift out
    return _mm256_castsi256_ps(_mm256_add_epi32(_mm256_castps_si256(p), e));
  }
  static float hsum(F v) {
    __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_add_ps(x, _mm_movehl_ps(x, x));
    x = _mm_add_ss(x, _mm_movehdup_ps(x));
    return _mm_cvtss_f32(x);
  }
};

// R rows x NV vectors of C, with B loads masked by `mask` when kMasked (then NV == 1).
template <int R, int NV, bool kMasked>
inline void micro(const Gemm& g, const float* a, const float* b, float* c, __m256i mask) {
  __m256 acc[R][NV];
  if (g.accumulate) {
    for (int r = 0; r < R; ++r) {
      const __m256 s = g.row_scale ? _mm256_broadcast_ss(g.row_scale + r) : _mm256_set1_ps(1.0f);
      for (int v = 0; v < NV; ++v) {
        const __m256 x = kMasked ? _mm256_maskload_ps(c + r * g.c_rs, mask) : _mm256_loadu_ps(c + r * g.c_rs + 8 * v);
        acc[r][v] = _mm256_mul_ps(x, s);
      }
    }
  } else {
    for (int r = 0; r < R; ++r)
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm256_setzero_ps();
  }
  const int64_t a_rs = g.a_rs, a_ks = g.a_ks, b_ks = g.b_ks;
  for (int64_t k = 0; k < g.depth; ++k) {
    __m256 bv[NV];
    for (int v = 0; v < NV; ++v) bv[v] = kMasked ? _mm256_maskload_ps(b, mask) : _mm256_loadu_ps(b + 8 * v);
    for (int r = 0; r < R; ++r) {
      const __m256 av = _mm256_broadcast_ss(a + r * a_rs);
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm256_fmadd_ps(av, bv[v], acc[r][v]);
    }
    a += a_ks;
    b += b_ks;
  }
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < NV; ++v) {
      if (kMasked)
        _mm256_maskstore_ps(c + r * g.c_rs, mask, acc[r][v]);
      else
        _mm256_storeu_ps(c + r * g.c_rs + 8 * v, acc[r][v]);
    }
}

template <int R>
inline void row_block(const Gemm& g, int64_t r0) {
  const float* a = g.a + r0 * g.a_rs;
  float* c = g.c + r0 * g.c_rs;
  const Gemm* gp = &g;
  Gemm shifted;
  if (g.row_scale) {
    shifted = g;
    shifted.row_scale = g.row_scale + r0;
    gp = &shifted;
  }
  int64_t j = 0;
  const __m256i none = _mm256_setzero_si256();
  // Few rows (decoding): wider column blocks, so that enough independent accumulators hide the FMA latency and
  // each row of B streams through once.
  if constexpr (R == 1) {
    for (; j + 128 <= g.cols; j += 128) micro<1, 16, false>(*gp, a, g.b + j, c + j, none);
    if (j + 64 <= g.cols) micro<1, 8, false>(*gp, a, g.b + j, c + j, none), j += 64;
    if (j + 32 <= g.cols) micro<1, 4, false>(*gp, a, g.b + j, c + j, none), j += 32;
  } else if constexpr (R == 2) {
    for (; j + 48 <= g.cols; j += 48) micro<2, 6, false>(*gp, a, g.b + j, c + j, none);
    if (j + 32 <= g.cols) micro<2, 4, false>(*gp, a, g.b + j, c + j, none), j += 32;
  } else if constexpr (R == 3) {
    for (; j + 32 <= g.cols; j += 32) micro<3, 4, false>(*gp, a, g.b + j, c + j, none);
  }
  for (; j + 16 <= g.cols; j += 16) micro<R, 2, false>(*gp, a, g.b + j, c + j, none);
  if (j + 8 <= g.cols) {
    micro<R, 1, false>(*gp, a, g.b + j, c + j, none);
    j += 8;
  }
  if (j < g.cols) micro<R, 1, true>(*gp, a, g.b + j, c + j, tail_mask(g.cols - j));
}

void gemm(const Gemm& g) {
  int64_t r = 0;
  for (; r + 6 <= g.rows; r += 6) row_block<6>(g, r);
  switch (g.rows - r) {
    case 5: row_block<5>(g, r); break;
    case 4: row_block<4>(g, r); break;
    case 3: row_block<3>(g, r); break;
    case 2: row_block<2>(g, r); break;
    case 1: row_block<1>(g, r); break;
    default: break;
  }
}

void softmax_cols(float* st, int64_t ld, int64_t nk, int64_t ncols, float* m, float* l, float* alpha) {
  softmax_cols_impl<Avx2>(st, ld, nk, ncols, m, l, alpha);
}

void bwd_probs(float* s, const float* bias, float* dp, int64_t ld, int64_t rows, int64_t cols, const float* lse2,
               const float* delta, float scale) {
  bwd_probs_impl<Avx2>(s, bias, dp, ld, rows, cols, lse2, delta, scale);
}

}  // namespace

const Kernels& avx2_kernels() {
  static const Kernels k{"avx2", gemm, softmax_cols, dot_scores_impl<Avx2>, bwd_probs};
  return k;
}

}  // namespace qkv::kernels::flash
