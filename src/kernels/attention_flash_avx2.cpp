// AVX2+FMA microkernels of the fused attention: a 6x16 register-blocked FMA product, a vectorised exp2 (Cephes
// polynomial, <= 2 ulp), the column-wise online softmax and the backward probability step. Compiled with -mavx2 -mfma.
#include <immintrin.h>

#include <cmath>
#include <limits>

#include "attention_flash_kernels.h"

namespace qkv::kernels::flash {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// 2^x for x <= 127, to about 2 ulp; 0 for x < -125 (and for -inf); NaN for NaN. Cephes exp2f: 2^x = 2^n * P(x - n).
// NaN in, NaN out (a NaN score must reach the output, as in PyTorch, not vanish like a masked one).
inline __m256 exp2_ps(__m256 x) {
  const __m256 nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
  const __m256 keep = _mm256_cmp_ps(x, _mm256_set1_ps(-125.0f), _CMP_NLT_UQ);  // x >= -125 or NaN
  const __m256 x_in = x;
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-125.0f)), _mm256_set1_ps(127.0f));
  // Round to nearest by adding 1.5·2^23: the low mantissa bits of t then hold n in two's complement.
  const __m256 magic = _mm256_set1_ps(12582912.0f);
  const __m256 t = _mm256_add_ps(x, magic);
  const __m256 n = _mm256_sub_ps(t, magic);
  const __m256 f = _mm256_sub_ps(x, n);
  __m256 p = _mm256_set1_ps(1.535336188319500e-4f);
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.339887440266574e-3f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(9.618437357674640e-3f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(5.550332471162809e-2f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(2.402264791363012e-1f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(6.931472028550421e-1f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f));
  const __m256i e = _mm256_slli_epi32(_mm256_castps_si256(t), 23);  // n << 23; t's exponent bits shift out
  const __m256 r = _mm256_castsi256_ps(_mm256_add_epi32(_mm256_castps_si256(p), e));
  return _mm256_blendv_ps(_mm256_and_ps(r, keep), x_in, nan);
}

inline __m256i tail_mask(int64_t n) {  // lanes [0, n) on, 0 < n < 8
  const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n)), idx);
}

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
  const __m256 ninf = _mm256_set1_ps(kNegInf);
  for (int64_t c = 0; c < ncols; c += 8) {
    float* col = st + c;
    const __m256 m_old = _mm256_loadu_ps(m + c);
    __m256 mx0 = m_old, mx1 = ninf, mx2 = ninf, mx3 = ninf;
    int64_t j = 0;
    for (; j + 4 <= nk; j += 4) {
      mx0 = _mm256_max_ps(mx0, _mm256_loadu_ps(col + (j + 0) * ld));
      mx1 = _mm256_max_ps(mx1, _mm256_loadu_ps(col + (j + 1) * ld));
      mx2 = _mm256_max_ps(mx2, _mm256_loadu_ps(col + (j + 2) * ld));
      mx3 = _mm256_max_ps(mx3, _mm256_loadu_ps(col + (j + 3) * ld));
    }
    for (; j < nk; ++j) mx0 = _mm256_max_ps(mx0, _mm256_loadu_ps(col + j * ld));
    const __m256 m_new = _mm256_max_ps(_mm256_max_ps(mx0, mx1), _mm256_max_ps(mx2, mx3));
    // A column still fully masked uses base 0: 2^(-inf - 0) = 0 instead of NaN.
    const __m256 base = _mm256_blendv_ps(m_new, _mm256_setzero_ps(), _mm256_cmp_ps(m_new, ninf, _CMP_EQ_OQ));
    const __m256 a = exp2_ps(_mm256_sub_ps(m_old, base));
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    j = 0;
    for (; j + 2 <= nk; j += 2) {
      const __m256 p0 = exp2_ps(_mm256_sub_ps(_mm256_loadu_ps(col + j * ld), base));
      const __m256 p1 = exp2_ps(_mm256_sub_ps(_mm256_loadu_ps(col + (j + 1) * ld), base));
      _mm256_storeu_ps(col + j * ld, p0);
      _mm256_storeu_ps(col + (j + 1) * ld, p1);
      s0 = _mm256_add_ps(s0, p0);
      s1 = _mm256_add_ps(s1, p1);
    }
    if (j < nk) {
      const __m256 p0 = exp2_ps(_mm256_sub_ps(_mm256_loadu_ps(col + j * ld), base));
      _mm256_storeu_ps(col + j * ld, p0);
      s0 = _mm256_add_ps(s0, p0);
    }
    _mm256_storeu_ps(alpha + c, a);
    _mm256_storeu_ps(l + c, _mm256_fmadd_ps(a, _mm256_loadu_ps(l + c), _mm256_add_ps(s0, s1)));
    _mm256_storeu_ps(m + c, m_new);
  }
}

inline float hsum(__m256 v) {
  __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  x = _mm_add_ps(x, _mm_movehl_ps(x, x));
  x = _mm_add_ss(x, _mm_movehdup_ps(x));
  return _mm_cvtss_f32(x);
}

// Four dot products of q (dk floats) with rows k0..k3.
inline void dot4(const float* q, int64_t dk, const float* k0, const float* k1, const float* k2, const float* k3,
                 float* out) {
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
  int64_t d = 0;
  for (; d + 8 <= dk; d += 8) {
    const __m256 qv = _mm256_loadu_ps(q + d);
    a0 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + d), a0);
    a1 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k1 + d), a1);
    a2 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k2 + d), a2);
    a3 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k3 + d), a3);
  }
  if (d < dk) {
    const __m256i mk = tail_mask(dk - d);
    const __m256 qv = _mm256_maskload_ps(q + d, mk);
    a0 = _mm256_fmadd_ps(qv, _mm256_maskload_ps(k0 + d, mk), a0);
    a1 = _mm256_fmadd_ps(qv, _mm256_maskload_ps(k1 + d, mk), a1);
    a2 = _mm256_fmadd_ps(qv, _mm256_maskload_ps(k2 + d, mk), a2);
    a3 = _mm256_fmadd_ps(qv, _mm256_maskload_ps(k3 + d, mk), a3);
  }
  out[0] = hsum(a0);
  out[1] = hsum(a1);
  out[2] = hsum(a2);
  out[3] = hsum(a3);
}

void dot_scores(const float* q, int64_t nq, int64_t dk, const float* k, int64_t k_rs, int64_t nk, float* st,
                int64_t ld) {
  float tmp[4];
  int64_t j = 0;
  for (; j + 4 <= nk; j += 4) {
    const float* kj = k + j * k_rs;
    for (int64_t i = 0; i < nq; ++i) {
      dot4(q + i * dk, dk, kj, kj + k_rs, kj + 2 * k_rs, kj + 3 * k_rs, tmp);
      for (int t = 0; t < 4; ++t) st[(j + t) * ld + i] = tmp[t];
    }
  }
  for (; j < nk; ++j) {
    const float* kj = k + j * k_rs;
    for (int64_t i = 0; i < nq; ++i) {
      dot4(q + i * dk, dk, kj, kj, kj, kj, tmp);
      st[j * ld + i] = tmp[0];
    }
  }
}

void bwd_probs(float* s, const float* bias, float* dp, int64_t ld, int64_t rows, int64_t cols, const float* lse2,
               const float* delta, float scale) {
  const __m256 vscale = _mm256_set1_ps(scale);
  for (int64_t r = 0; r < rows; ++r) {
    float* sr = s + r * ld;
    float* dr = dp + r * ld;
    const float* br = bias ? bias + r * ld : nullptr;
    const __m256 nl = _mm256_set1_ps(-lse2[r]);
    const __m256 dl = _mm256_set1_ps(delta[r]);
    int64_t j = 0;
    // A blocked pair (score or bias -inf) gives p = 0, and p = 0 gives dS = 0, even when its score or the row's lse/delta
    // is NaN: the reference's rule.
    const __m256 ninf = _mm256_set1_ps(kNegInf), zero = _mm256_setzero_ps();
    for (; j + 8 <= cols; j += 8) {
      const __m256 sj = _mm256_loadu_ps(sr + j);
      __m256 x = _mm256_add_ps(sj, nl);
      __m256 blocked = _mm256_cmp_ps(sj, ninf, _CMP_EQ_OQ);
      if (br) {
        const __m256 bj = _mm256_loadu_ps(br + j);
        x = _mm256_add_ps(x, bj);
        blocked = _mm256_or_ps(blocked, _mm256_cmp_ps(bj, ninf, _CMP_EQ_OQ));
      }
      const __m256 p = _mm256_blendv_ps(exp2_ps(x), zero, blocked);
      _mm256_storeu_ps(sr + j, p);
      const __m256 d = _mm256_sub_ps(_mm256_loadu_ps(dr + j), dl);
      const __m256 ds = _mm256_mul_ps(_mm256_mul_ps(p, vscale), d);
      _mm256_storeu_ps(dr + j, _mm256_blendv_ps(ds, zero, _mm256_cmp_ps(p, zero, _CMP_EQ_OQ)));
    }
    if (j < cols) {
      const __m256i mk = tail_mask(cols - j);
      const __m256 sj = _mm256_maskload_ps(sr + j, mk);
      __m256 x = _mm256_add_ps(sj, nl);
      __m256 blocked = _mm256_cmp_ps(sj, ninf, _CMP_EQ_OQ);
      if (br) {
        const __m256 bj = _mm256_maskload_ps(br + j, mk);
        x = _mm256_add_ps(x, bj);
        blocked = _mm256_or_ps(blocked, _mm256_cmp_ps(bj, ninf, _CMP_EQ_OQ));
      }
      const __m256 p = _mm256_blendv_ps(exp2_ps(x), zero, blocked);
      _mm256_maskstore_ps(sr + j, mk, p);
      const __m256 d = _mm256_sub_ps(_mm256_maskload_ps(dr + j, mk), dl);
      const __m256 ds = _mm256_mul_ps(_mm256_mul_ps(p, vscale), d);
      _mm256_maskstore_ps(dr + j, mk, _mm256_blendv_ps(ds, zero, _mm256_cmp_ps(p, zero, _CMP_EQ_OQ)));
    }
  }
}

}  // namespace

const Kernels& avx2_kernels() {
  static const Kernels k{"avx2", gemm, softmax_cols, dot_scores, bwd_probs};
  return k;
}

}  // namespace qkv::kernels::flash
