// AVX-512 microkernels of the fused attention: the same operations as attention_flash_avx2.cpp on 16-float vectors
// (register-blocked FMA product up to 12x32, Cephes exp2, online softmax, backward probabilities). Compiled with
// -mavx512f/bw/dq/vl; picked at run time only when the CPU has all four. Sums run in the same order as the AVX2 set.
#include <immintrin.h>

// GCC 12 flags its own _mm512_undefined_ps inside the intrinsic headers (a known false positive).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <algorithm>
#include <limits>

#include "attention_flash_kernels.h"

namespace qkv::kernels::flash {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// 2^x for x <= 127, to about 2 ulp; 0 for x < -125 (and for -inf). The polynomial of the AVX2 set.
inline __m512 exp2_ps(__m512 x) {  // NaN in, NaN out, as in the AVX2 version
  const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
  const __mmask16 keep = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-125.0f), _CMP_GE_OQ);
  const __m512 x_in = x;
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-125.0f)), _mm512_set1_ps(127.0f));
  const __m512 magic = _mm512_set1_ps(12582912.0f);  // 1.5·2^23: round to nearest, n in the low mantissa bits
  const __m512 t = _mm512_add_ps(x, magic);
  const __m512 n = _mm512_sub_ps(t, magic);
  const __m512 f = _mm512_sub_ps(x, n);
  __m512 p = _mm512_set1_ps(1.535336188319500e-4f);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.339887440266574e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.618437357674640e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.550332471162809e-2f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.402264791363012e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.931472028550421e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
  const __m512i e = _mm512_slli_epi32(_mm512_castps_si512(t), 23);
  const __m512 r = _mm512_castsi512_ps(_mm512_add_epi32(_mm512_castps_si512(p), e));
  return _mm512_mask_mov_ps(_mm512_maskz_mov_ps(keep, r), nan, x_in);
}

inline __mmask16 tail_mask(int64_t n) {  // lanes [0, n) on, 0 < n <= 16
  return static_cast<__mmask16>((1u << n) - 1u);
}

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
  int64_t r = 0;
  for (; r + R <= g.rows; r += R) row_block<R>(g, r);
  switch (g.rows - r) {
    case 11: if constexpr (R > 11) row_block<11>(g, r); break;
    case 10: if constexpr (R > 10) row_block<10>(g, r); break;
    case 9: if constexpr (R > 9) row_block<9>(g, r); break;
    case 8: if constexpr (R > 8) row_block<8>(g, r); break;
    case 7: if constexpr (R > 7) row_block<7>(g, r); break;
    case 6: if constexpr (R > 6) row_block<6>(g, r); break;
    case 5: row_block<5>(g, r); break;
    case 4: row_block<4>(g, r); break;
    case 3: row_block<3>(g, r); break;
    case 2: row_block<2>(g, r); break;
    case 1: row_block<1>(g, r); break;
    default: break;
  }
}

// Narrow products (head-dim wide: P·V, dV, dK, dQ) take 12 rows at a time, wide ones (score tiles) 6. A product of
// one to three rows (decoding's P·V) is memory-bound: the AVX2 kernels' wide column blocks stream each row of V
// once with enough independent accumulators, and measured twice as fast as 512-bit row blocks here.
void gemm(const Gemm& g) {
  if (g.rows <= 3) return avx2_kernels().gemm(g);
  if (g.cols <= 32)
    row_blocks<12>(g);
  else
    row_blocks<6>(g);
}

void softmax_cols(float* st, int64_t ld, int64_t nk, int64_t ncols, float* m, float* l, float* alpha) {
  const __m512 ninf = _mm512_set1_ps(kNegInf);
  for (int64_t c = 0; c < ncols; c += 16) {
    const __mmask16 mk = tail_mask(std::min<int64_t>(16, ncols - c));
    float* col = st + c;
    auto load = [&](int64_t j) { return _mm512_maskz_loadu_ps(mk, col + j * ld); };
    const __m512 m_old = _mm512_maskz_loadu_ps(mk, m + c);
    __m512 mx0 = m_old, mx1 = ninf, mx2 = ninf, mx3 = ninf;
    int64_t j = 0;
    for (; j + 4 <= nk; j += 4) {
      mx0 = _mm512_max_ps(mx0, load(j));
      mx1 = _mm512_max_ps(mx1, load(j + 1));
      mx2 = _mm512_max_ps(mx2, load(j + 2));
      mx3 = _mm512_max_ps(mx3, load(j + 3));
    }
    for (; j < nk; ++j) mx0 = _mm512_max_ps(mx0, load(j));
    const __m512 m_new = _mm512_max_ps(_mm512_max_ps(mx0, mx1), _mm512_max_ps(mx2, mx3));
    // A column still fully masked uses base 0: 2^(-inf - 0) = 0 instead of NaN.
    const __m512 base = _mm512_mask_mov_ps(m_new, _mm512_cmp_ps_mask(m_new, ninf, _CMP_EQ_OQ), _mm512_setzero_ps());
    const __m512 a = exp2_ps(_mm512_sub_ps(m_old, base));
    __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
    j = 0;
    for (; j + 2 <= nk; j += 2) {
      const __m512 p0 = exp2_ps(_mm512_sub_ps(load(j), base));
      const __m512 p1 = exp2_ps(_mm512_sub_ps(load(j + 1), base));
      _mm512_mask_storeu_ps(col + j * ld, mk, p0);
      _mm512_mask_storeu_ps(col + (j + 1) * ld, mk, p1);
      s0 = _mm512_add_ps(s0, p0);
      s1 = _mm512_add_ps(s1, p1);
    }
    if (j < nk) {
      const __m512 p0 = exp2_ps(_mm512_sub_ps(load(j), base));
      _mm512_mask_storeu_ps(col + j * ld, mk, p0);
      s0 = _mm512_add_ps(s0, p0);
    }
    _mm512_mask_storeu_ps(alpha + c, mk, a);
    _mm512_mask_storeu_ps(l + c, mk, _mm512_fmadd_ps(a, _mm512_maskz_loadu_ps(mk, l + c), _mm512_add_ps(s0, s1)));
    _mm512_mask_storeu_ps(m + c, mk, m_new);
  }
}

// Decoding's dot-product scores use the AVX2 kernel (an AVX-512 CPU has AVX2 and FMA): it reduces several keys
// together, where a 512-bit version summing one key at a time horizontally read K at half the speed.

void bwd_probs(float* s, const float* bias, float* dp, int64_t ld, int64_t rows, int64_t cols, const float* lse2,
               const float* delta, float scale) {
  const __m512 vscale = _mm512_set1_ps(scale);
  for (int64_t r = 0; r < rows; ++r) {
    float* sr = s + r * ld;
    float* dr = dp + r * ld;
    const float* br = bias ? bias + r * ld : nullptr;
    const __m512 nl = _mm512_set1_ps(-lse2[r]);
    const __m512 dl = _mm512_set1_ps(delta[r]);
    // A blocked pair (score or bias -inf) gives p = 0, and p = 0 gives dS = 0, even when the row's lse/delta is
    // NaN: the reference's rule.
    const __m512 ninf = _mm512_set1_ps(kNegInf);
    for (int64_t j = 0; j < cols; j += 16) {
      const __mmask16 mk = tail_mask(std::min<int64_t>(16, cols - j));
      const __m512 sj = _mm512_maskz_loadu_ps(mk, sr + j);
      __m512 x = _mm512_add_ps(sj, nl);
      __mmask16 open = _mm512_cmp_ps_mask(sj, ninf, _CMP_NEQ_UQ);
      if (br) {
        const __m512 bj = _mm512_maskz_loadu_ps(mk, br + j);
        x = _mm512_add_ps(x, bj);
        open &= _mm512_cmp_ps_mask(bj, ninf, _CMP_NEQ_UQ);
      }
      const __m512 p = _mm512_maskz_mov_ps(open, exp2_ps(x));
      _mm512_mask_storeu_ps(sr + j, mk, p);
      const __m512 d = _mm512_sub_ps(_mm512_maskz_loadu_ps(mk, dr + j), dl);
      const __mmask16 live = _mm512_cmp_ps_mask(p, _mm512_setzero_ps(), _CMP_NEQ_UQ);
      _mm512_mask_storeu_ps(dr + j, mk, _mm512_maskz_mul_ps(live, _mm512_mul_ps(p, vscale), d));
    }
  }
}

}  // namespace

const Kernels& avx512_kernels() {
  static const Kernels k{"avx512", gemm, softmax_cols, avx2_kernels().dot_scores, bwd_probs};
  return k;
}

}  // namespace qkv::kernels::flash
