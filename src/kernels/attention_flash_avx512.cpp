// AVX-512 microkernels of the fused attention: the register-blocked FMA product (up to 12x32), plus the 16-lane
// instantiation of attention_flash_simd.h (exp2, online softmax, backward probabilities: the AVX2 set's operations
// in the same order). Compiled with -mavx512f/bw/dq/vl; picked at run time only when the CPU has all four.
#include <immintrin.h>

// GCC 12 flags its own _mm512_undefined_ps inside the intrinsic headers (a known false positive).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

#include "attention_flash_blocks.h"
#include "attention_flash_kernels.h"
#include "attention_flash_simd.h"

namespace qkv::kernels::flash {
namespace {

inline __mmask16 tail_mask(int64_t n) {  // lanes [0, n) on, 0 < n <= 16
  return static_cast<__mmask16>((1u << n) - 1u);
}

// Lane traits of attention_flash_simd.h: 16 floats, masks in mask registers.
struct Avx512 {
  using F = __m512;
  using M = __mmask16;
  using Tail = __mmask16;
  static constexpr int64_t kW = 16;
  static constexpr int kRegs = 32;  // vector registers
  static F set1(float v) { return _mm512_set1_ps(v); }
  static F zero() { return _mm512_setzero_ps(); }
  static F load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, F v) { _mm512_storeu_ps(p, v); }
  static Tail tail(int64_t n) { return tail_mask(n); }
  static F load_n(const float* p, Tail t) { return _mm512_maskz_loadu_ps(t, p); }
  static void store_n(float* p, Tail t, F v) { _mm512_mask_storeu_ps(p, t, v); }
  static F add(F a, F b) { return _mm512_add_ps(a, b); }
  static F sub(F a, F b) { return _mm512_sub_ps(a, b); }
  static F mul(F a, F b) { return _mm512_mul_ps(a, b); }
  static F fmadd(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
  static F max(F a, F b) { return _mm512_max_ps(a, b); }
  static F min(F a, F b) { return _mm512_min_ps(a, b); }
  static M eq(F a, F b) { return _mm512_cmp_ps_mask(a, b, _CMP_EQ_OQ); }
  static M ge(F a, F b) { return _mm512_cmp_ps_mask(a, b, _CMP_GE_OQ); }
  static M unord(F a, F b) { return _mm512_cmp_ps_mask(a, b, _CMP_UNORD_Q); }
  static M or_(M a, M b) { return static_cast<M>(a | b); }
  static F select(M m, F a, F b) { return _mm512_mask_blend_ps(m, b, a); }
  static F zero_unless(M m, F a) { return _mm512_maskz_mov_ps(m, a); }
  static F pow2n(F p, F t) {
    const __m512i e = _mm512_slli_epi32(_mm512_castps_si512(t), 23);
    return _mm512_castsi512_ps(_mm512_add_epi32(_mm512_castps_si512(p), e));
  }
  static float hsum(F v) { return _mm512_reduce_add_ps(v); }
};

// R rows x NV vectors of C; when kTail, the last vector's loads and stores are limited to `last` lanes (masked
// stores are slow on some CPUs: full blocks never use them).
template <int R, int NV, bool kTail>
inline void micro(const Gemm& g, const float* a, const float* b, float* c, __mmask16 last) {
  __m512 acc[R][NV];
  if (g.accumulate) {
    for (int r = 0; r < R; ++r) {
      const __m512 s = g.row_scale ? _mm512_set1_ps(g.row_scale[r]) : _mm512_set1_ps(1.0f);
      for (int v = 0; v < NV; ++v) {
        const __m512 x = kTail && v == NV - 1 ? _mm512_maskz_loadu_ps(last, c + r * g.c_rs + 16 * v)
                                     : _mm512_loadu_ps(c + r * g.c_rs + 16 * v);
        acc[r][v] = _mm512_mul_ps(x, s);
      }
    }
  } else {
    for (int r = 0; r < R; ++r)
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_setzero_ps();
  }
  const int64_t a_rs = g.a_rs, a_ks = g.a_ks, b_ks = g.b_ks;
  for (int64_t k = 0; k < g.depth; ++k) {
    __m512 bv[NV];
    for (int v = 0; v < NV; ++v)
      bv[v] = kTail && v == NV - 1 ? _mm512_maskz_loadu_ps(last, b + 16 * v) : _mm512_loadu_ps(b + 16 * v);
    for (int r = 0; r < R; ++r) {
      const __m512 av = _mm512_set1_ps(a[r * a_rs]);
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_fmadd_ps(av, bv[v], acc[r][v]);
    }
    a += a_ks;
    b += b_ks;
  }
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < NV; ++v) {
      if (kTail && v == NV - 1)
        _mm512_mask_storeu_ps(c + r * g.c_rs + 16 * v, last, acc[r][v]);
      else
        _mm512_storeu_ps(c + r * g.c_rs + 16 * v, acc[r][v]);
    }
}

// The last nv vectors of a row block: full ones unmasked, only a partial last vector masked.
template <int R, int NV>
inline void tail(const Gemm& g, const float* a, const float* b, float* c, __mmask16 last) {
  if (last == 0xFFFF)
    micro<R, NV, false>(g, a, b, c, last);
  else
    micro<R, NV, true>(g, a, b, c, last);
}

// Rows r0..r0+R of C, all columns: blocks of up to kMaxNV vectors (R·NV accumulators fit the 32 registers).
template <int R>
inline void row_block(const Gemm& g, int64_t r0) {
  constexpr int kMaxNV = R <= 2 ? 8 : R <= 6 ? 4 : 2;
  static_assert(kMaxNV <= 8, "the tail switch below handles up to 8 vectors");
  const float* a = g.a + r0 * g.a_rs;
  float* c = g.c + r0 * g.c_rs;
  const Gemm* gp = &g;
  Gemm shifted;
  if (g.row_scale) {
    shifted = g;
    shifted.row_scale = g.row_scale + r0;
    gp = &shifted;
  }
  const __mmask16 full = 0xFFFF;
  int64_t j = 0;
  for (; j + 16 * kMaxNV <= g.cols; j += 16 * kMaxNV) micro<R, kMaxNV, false>(*gp, a, g.b + j, c + j, full);
  const int64_t rest = g.cols - j;
  if (rest <= 0) return;
  const int64_t nv = (rest + 15) / 16;
  const __mmask16 last = tail_mask(rest - 16 * (nv - 1));
  switch (nv) {  // 1 <= nv <= kMaxNV <= 8
    case 1: tail<R, 1>(*gp, a, g.b + j, c + j, last); break;
    case 2: if constexpr (kMaxNV >= 2) tail<R, 2>(*gp, a, g.b + j, c + j, last); break;
    case 3: if constexpr (kMaxNV >= 3) tail<R, 3>(*gp, a, g.b + j, c + j, last); break;
    case 4: if constexpr (kMaxNV >= 4) tail<R, 4>(*gp, a, g.b + j, c + j, last); break;
    case 5: if constexpr (kMaxNV >= 5) tail<R, 5>(*gp, a, g.b + j, c + j, last); break;
    case 6: if constexpr (kMaxNV >= 6) tail<R, 6>(*gp, a, g.b + j, c + j, last); break;
    case 7: if constexpr (kMaxNV >= 7) tail<R, 7>(*gp, a, g.b + j, c + j, last); break;
    case 8: if constexpr (kMaxNV >= 8) tail<R, 8>(*gp, a, g.b + j, c + j, last); break;
    default: break;
  }
}

template <int R>
inline void row_blocks(const Gemm& g) {
  for_row_blocks<R>(g.rows, [&]<int RR>(int64_t r) { row_block<RR>(g, r); });
}

// Narrow products (head-dim wide: P·V, dV, dK, dQ) take 12 rows at a time, wide ones (score tiles) 6. A product of
// one to three rows (decoding's P·V) is memory-bound: the AVX2 kernels' wide column blocks stream each row of V
// once with enough independent accumulators, and measured twice as fast as 512-bit row blocks here. Four to eight
// rows wider than 64 columns (GQA decoding's stacked query heads against D = 128 values) go two rows at a time
// across all columns: the first pair reads each V row whole, in order (as one prefetched stream), the others find
// it in L1; blocks of four rows over 64-column strips read every row in pieces and were 5-15 % slower (Zen 4).
void gemm(const Gemm& g) {
  if (g.rows <= 3) return avx2_kernels().gemm(g);
  if (g.rows <= 8 && g.cols > 64) {
    int64_t r = 0;
    for (; r + 2 <= g.rows; r += 2) row_block<2>(g, r);
    if (r < g.rows) row_block<1>(g, r);
    return;
  }
  if (g.cols <= 32)
    row_blocks<12>(g);
  else
    row_blocks<6>(g);
}

// Eight columns or fewer (decoding's few query rows) fill at most half a 16-lane vector: the 8-lane set runs the
// same operations (the same bits) on half-width vectors, which CPUs that split 512-bit operations in two (Zen 4)
// issue at twice the rate.
void softmax_cols(float* st, int64_t ld, int64_t nk, int64_t ncols, float* m, float* l, float* alpha) {
  if (ncols <= 8) return avx2_kernels().softmax_cols(st, ld, nk, ncols, m, l, alpha);
  softmax_cols_impl<Avx512>(st, ld, nk, ncols, m, l, alpha);
}

void bwd_probs(float* s, const float* bias, float* dp, int64_t ld, int64_t rows, int64_t cols, const float* lse2,
               const float* delta, float scale) {
  bwd_probs_impl<Avx512>(s, bias, dp, ld, rows, cols, lse2, delta, scale);
}

}  // namespace

const Kernels& avx512_kernels() {
  static const Kernels k{"avx512", gemm, softmax_cols, dot_scores_impl<Avx512>, bwd_probs};
  return k;
}

}  // namespace qkv::kernels::flash
