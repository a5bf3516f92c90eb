// Private (not installed): the parts of the fused-attention microkernels written once over the vector width: the
// Cephes exp2, the column-wise online-softmax step and the backward probability step. Included by
// attention_flash_avx2.cpp and attention_flash_avx512.cpp, each after defining its lane traits V (below), and
// decoding's dot-product scores; only the register-blocked products stay per ISA.
//
// V provides, for its vector type V::F (kW floats), mask type V::M and tail type V::Tail (lanes [0, n)):
//   set1 zero load store tail(n) load_n(p, t) (other lanes 0) store_n(p, t, v)
//   add sub mul fmadd(a, b, c) = a·b + c, max min (x86 semantics: the second operand when either is NaN)
//   eq (ordered ==), ge (ordered >=), unord (either NaN), or_
//   select(m, a, b) = m ? a : b, zero_unless(m, a) = m ? a : 0
//   pow2n(p, t): p · 2^n where t = x + 1.5·2^23 holds n in its low mantissa bits (integer add of t << 23)
//   sums4(a0, a1, a2, a3, out): out[i] = the sum of a_i's lanes, the four in one transposing tree (a lane sum of
//     its own per row cost decoding's scores twice the time of their products)
// and kW (lanes) and kRegs (vector registers).
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>

#include "attention_flash_kernels.h"
#include "static_dispatch.h"

namespace qkv::kernels::flash {
namespace {

// 2^x for x <= 127, to about 2 ulp; 0 for x < -125 (and for -inf); NaN for NaN (a NaN score must reach the
// output, as in PyTorch, not vanish like a masked one). Cephes exp2f: 2^x = 2^n · P(x - n).
template <class V>
inline typename V::F exp2v(typename V::F x) {
  const typename V::M nan = V::unord(x, x);
  const typename V::M keep = V::ge(x, V::set1(-125.0f));
  const typename V::F x_in = x;
  x = V::min(V::max(x, V::set1(-125.0f)), V::set1(127.0f));
  // Round to nearest by adding 1.5·2^23: the low mantissa bits of t then hold n in two's complement.
  const typename V::F magic = V::set1(12582912.0f);
  const typename V::F t = V::add(x, magic);
  const typename V::F n = V::sub(t, magic);
  const typename V::F f = V::sub(x, n);
  typename V::F p = V::set1(1.535336188319500e-4f);
  p = V::fmadd(p, f, V::set1(1.339887440266574e-3f));
  p = V::fmadd(p, f, V::set1(9.618437357674640e-3f));
  p = V::fmadd(p, f, V::set1(5.550332471162809e-2f));
  p = V::fmadd(p, f, V::set1(2.402264791363012e-1f));
  p = V::fmadd(p, f, V::set1(6.931472028550421e-1f));
  p = V::fmadd(p, f, V::set1(1.0f));
  return V::select(nan, x_in, V::zero_unless(keep, V::pow2n(p, t)));
}

// One block of kW score columns (kPartial: the first lanes of `tail` only) of softmax_cols.
template <class V, bool kPartial>
inline void softmax_block(float* col, int64_t ld, int64_t nk, float* m, float* l, float* alpha,
                          typename V::Tail tail) {
  using F = typename V::F;
  auto load = [&](const float* p) { return kPartial ? V::load_n(p, tail) : V::load(p); };
  auto store = [&](float* p, F v) {
    if constexpr (kPartial) V::store_n(p, tail, v);
    else V::store(p, v);
  };
  const F ninf = V::set1(-std::numeric_limits<float>::infinity());
  const F m_old = load(m);
  F mx0 = m_old, mx1 = ninf, mx2 = ninf, mx3 = ninf;
  int64_t j = 0;
  for (; j + 4 <= nk; j += 4) {
    mx0 = V::max(mx0, load(col + (j + 0) * ld));
    mx1 = V::max(mx1, load(col + (j + 1) * ld));
    mx2 = V::max(mx2, load(col + (j + 2) * ld));
    mx3 = V::max(mx3, load(col + (j + 3) * ld));
  }
  for (; j < nk; ++j) mx0 = V::max(mx0, load(col + j * ld));
  const F m_new = V::max(V::max(mx0, mx1), V::max(mx2, mx3));
  // A column still fully masked uses base 0: 2^(-inf - 0) = 0 instead of NaN.
  const F base = V::select(V::eq(m_new, ninf), V::zero(), m_new);
  const F a = exp2v<V>(V::sub(m_old, base));
  F s0 = V::zero(), s1 = V::zero();
  j = 0;
  for (; j + 2 <= nk; j += 2) {
    const F p0 = exp2v<V>(V::sub(load(col + j * ld), base));
    const F p1 = exp2v<V>(V::sub(load(col + (j + 1) * ld), base));
    store(col + j * ld, p0);
    store(col + (j + 1) * ld, p1);
    s0 = V::add(s0, p0);
    s1 = V::add(s1, p1);
  }
  if (j < nk) {
    const F p0 = exp2v<V>(V::sub(load(col + j * ld), base));
    store(col + j * ld, p0);
    s0 = V::add(s0, p0);
  }
  store(alpha, a);
  store(l, V::fmadd(a, load(l), V::add(s0, s1)));
  store(m, m_new);
}

// Kernels::softmax_cols (see attention_flash_kernels.h).
template <class V>
void softmax_cols_impl(float* st, int64_t ld, int64_t nk, int64_t ncols, float* m, float* l, float* alpha) {
  int64_t c = 0;
  for (; c + V::kW <= ncols; c += V::kW)
    softmax_block<V, false>(st + c, ld, nk, m + c, l + c, alpha + c, V::tail(V::kW));
  if (c < ncols) softmax_block<V, true>(st + c, ld, nk, m + c, l + c, alpha + c, V::tail(ncols - c));
}

// kW entries (kPartial: the first lanes of `tail`) of one row of bwd_probs.
template <class V, bool kPartial>
inline void bwd_probs_block(float* sr, const float* br, float* dr, typename V::F nl, typename V::F dl,
                            typename V::F vscale, typename V::Tail tail) {
  using F = typename V::F;
  auto load = [&](const float* p) { return kPartial ? V::load_n(p, tail) : V::load(p); };
  auto store = [&](float* p, F v) {
    if constexpr (kPartial) V::store_n(p, tail, v);
    else V::store(p, v);
  };
  // A blocked pair (score or bias -inf) gives p = 0, and p = 0 gives dS = 0, even when its score or the row's
  // lse/delta is NaN: the reference's rule.
  const F ninf = V::set1(-std::numeric_limits<float>::infinity()), zero = V::zero();
  const F sj = load(sr);
  F x = V::add(sj, nl);
  typename V::M blocked = V::eq(sj, ninf);
  if (br) {
    const F bj = load(br);
    x = V::add(x, bj);
    blocked = V::or_(blocked, V::eq(bj, ninf));
  }
  const F p = V::select(blocked, zero, exp2v<V>(x));
  store(sr, p);
  const F d = V::sub(load(dr), dl);
  const F ds = V::mul(V::mul(p, vscale), d);
  store(dr, V::select(V::eq(p, zero), zero, ds));
}

// Kernels::bwd_probs (see attention_flash_kernels.h).
template <class V>
void bwd_probs_impl(float* s, const float* bias, float* dp, int64_t ld, int64_t rows, int64_t cols, const float* lse2,
                    const float* delta, float scale) {
  const typename V::F vscale = V::set1(scale);
  for (int64_t r = 0; r < rows; ++r) {
    float* sr = s + r * ld;
    float* dr = dp + r * ld;
    const float* br = bias ? bias + r * ld : nullptr;
    const typename V::F nl = V::set1(-lse2[r]);
    const typename V::F dl = V::set1(delta[r]);
    int64_t j = 0;
    for (; j + V::kW <= cols; j += V::kW)
      bwd_probs_block<V, false>(sr + j, br ? br + j : nullptr, dr + j, nl, dl, vscale, V::tail(V::kW));
    if (j < cols)
      bwd_probs_block<V, true>(sr + j, br ? br + j : nullptr, dr + j, nl, dl, vscale, V::tail(cols - j));
  }
}

// out[i] = the lane sum of a[i][0] + a[i][1] for i < NI <= 4, through sums4 (rows past NI are zero there and
// not written here): a row's sum has the same bits whatever the other rows hold.
template <class V, int NI>
inline void store_row_sums(const typename V::F (&a)[NI][2], float* out) {
  typename V::F s[4];
  for (int i = 0; i < 4; ++i) s[i] = i < NI ? V::add(a[i][0], a[i][1]) : V::zero();
  if constexpr (NI == 4) {
    V::sums4(s[0], s[1], s[2], s[3], out);
  } else {
    float all[4];
    V::sums4(s[0], s[1], s[2], s[3], all);
    for (int i = 0; i < NI; ++i) out[i] = all[i];
  }
}

// Scores of NI <= 4 query rows (dk floats each, rows dk apart) against key row kj: out[i] = q_i · k. Each sum runs
// in two chains (even and odd vectors of d) and ends in store_row_sums.
template <class V, int NI>
inline void dot_key(const float* q, int64_t dk, const float* kj, float* out) {
  using F = typename V::F;
  constexpr int64_t W = V::kW;
  F a[NI][2];
  for (int i = 0; i < NI; ++i) a[i][0] = a[i][1] = V::zero();
  int64_t d = 0;
  for (; d + 2 * W <= dk; d += 2 * W) {
    const F k0 = V::load(kj + d), k1 = V::load(kj + d + W);
    for (int i = 0; i < NI; ++i) {
      a[i][0] = V::fmadd(V::load(q + i * dk + d), k0, a[i][0]);
      a[i][1] = V::fmadd(V::load(q + i * dk + d + W), k1, a[i][1]);
    }
  }
  if (d + W <= dk) {
    const F k0 = V::load(kj + d);
    for (int i = 0; i < NI; ++i) a[i][0] = V::fmadd(V::load(q + i * dk + d), k0, a[i][0]);
    d += W;
  }
  if (d < dk) {
    const typename V::Tail t = V::tail(dk - d);
    const F k1 = V::load_n(kj + d, t);
    for (int i = 0; i < NI; ++i) a[i][1] = V::fmadd(V::load_n(q + i * dk + d, t), k1, a[i][1]);
  }
  store_row_sums<V, NI>(a, out);
}

// dot_key for NI query rows of dk = NV·kW floats held in registers across the nk keys (k_rs apart), into
// st[j·ld + i]: a key then costs its own NV loads, not the rows' NI·NV again (the loads, not the FMAs, bounded
// the scores). The chains of dot_key (even and odd vectors of d), so the same bits.
template <class V, int NI, int NV>
inline void dot_keys_held(const float* q, int64_t dk, const float* k, int64_t k_rs, int64_t nk, float* st,
                          int64_t ld) {
  using F = typename V::F;
  F qv[NI][NV];
  for (int i = 0; i < NI; ++i)
    for (int v = 0; v < NV; ++v) qv[i][v] = V::load(q + i * dk + v * V::kW);
  for (int64_t j = 0; j < nk; ++j) {
    const float* kj = k + j * k_rs;
    F a[NI][2];
    for (int i = 0; i < NI; ++i) a[i][0] = a[i][1] = V::zero();
    for (int v = 0; v < NV; ++v) {
      const F x = V::load(kj + v * V::kW);
      for (int i = 0; i < NI; ++i) a[i][v & 1] = V::fmadd(qv[i][v], x, a[i][v & 1]);
    }
    store_row_sums<V, NI>(a, st + j * ld);
  }
}

// The most query rows of NV vectors that fit in the registers with their two chains and a key vector (0: none).
template <class V, int NV>
constexpr int held_rows() {
  for (int ni = 4; ni >= 1; --ni)
    if (ni * NV + 2 * ni + 4 <= V::kRegs) return ni;
  return 0;
}

// dot_scores_impl where dk is NV whole vectors: the rows in groups held in registers; false where none fits, or
// where one row at a time would take several passes over the keys (AVX2 at D 64: the rows reloaded per key then).
template <class V, int NV>
inline bool dot_scores_held(const float* q, int64_t nq, int64_t dk, const float* k, int64_t k_rs, int64_t nk,
                            float* st, int64_t ld) {
  constexpr int kNI = held_rows<V, NV>();
  if constexpr (kNI == 0) {
    return false;
  } else {
    if (kNI == 1 && nq > 1) return false;
    detail::for_row_blocks<kNI>(nq, [&]<int NI>(int64_t i0) {
      dot_keys_held<V, NI, NV>(q + i0 * dk, dk, k, k_rs, nk, st + i0, ld);
    });
    return true;
  }
}

// The scores of a few query rows (decoding; q holds nq rows of dk floats) against nk key rows, k_rs apart:
// st[j·ld + i] = q_i · k_j. Keys one at a time in memory order, so K streams from memory as one sequence the
// hardware prefetcher follows. Where dk is at most 8 whole vectors the rows stay in registers, as many as fit
// (AVX-512, D 128: two; D 64: four), a group after another over the same keys (the later ones find the tile in L2):
// GQA decode Hq 32 / Hkv 8 / Tk 8192 / D 128 on a Zen 4 read K/V 1.2x faster than with the rows reloaded per key.
// Otherwise up to four rows share each key load. (Two or four keys at a time, each row read in interleaved pieces,
// read K 10-25 % slower on Zen 4.)
template <class V>
inline void dot_scores_impl(const float* q, int64_t nq, int64_t dk, const float* k, int64_t k_rs, int64_t nk,
                            float* st, int64_t ld) {
  bool done = false;
  if (dk % V::kW == 0)
    detail::with_index<9>(dk / V::kW, [&]<int NV>() {
      if constexpr (NV > 0) done = dot_scores_held<V, NV>(q, nq, dk, k, k_rs, nk, st, ld);
    });
  if (done) return;
  detail::for_row_blocks<4>(nq, [=]<int NI>(int64_t i0) {
    for (int64_t j = 0; j < nk; ++j) dot_key<V, NI>(q + i0 * dk, dk, k + j * k_rs, st + i0 + j * ld);
  });
}

}  // namespace
}  // namespace qkv::kernels::flash
