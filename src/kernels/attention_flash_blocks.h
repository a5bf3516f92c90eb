// Private (not installed): the register-blocked products of the fused attention (attention_flash_kernels.h Gemm,
// GemmBf16) written once over lane traits and a dot policy (micro.h: Lanes256 / Lanes512, FmaF32 / PairsBf16), and
// their row blocking. Included by attention_flash_avx2.cpp, attention_flash_avx512.cpp and
// attention_flash_avx512bf16.cpp after micro.h, each compiling its own copy (internal linkage) with its flags.
#pragma once

#include <cstdint>
#include <type_traits>

#include "attention_flash_kernels.h"
#include "static_dispatch.h"

namespace qkv::kernels::flash {
namespace {

// R rows x NV vectors of C (attention_flash_kernels.h GemmOf) from A by broadcasts and B by rows: each output one
// chain of D::step over k. When kTail the last vector's loads and stores are limited to lanes `last` (masked
// stores are slow on some CPUs: full blocks never use them). The bf16 products fold GemmBf16::scale into the store.
template <class L, template <class> class Dot, int R, int NV, bool kTail>
inline void product_block(const GemmOf<typename Dot<L>::Word>& g, const typename Dot<L>::Word* a,
                          const typename Dot<L>::Word* b, float* c, typename L::Tail last) {
  using D = Dot<L>;
  constexpr int64_t W = L::kW;
  typename L::F acc[R][NV];
  if (g.accumulate) {
    for (int r = 0; r < R; ++r) {
      const typename L::F s = g.row_scale ? L::set1(g.row_scale[r]) : L::set1(1.0f);
      for (int v = 0; v < NV; ++v) {
        const typename L::F x = kTail && v == NV - 1 ? L::load_n(c + r * g.c_rs + W * v, last)
                                                     : L::load(c + r * g.c_rs + W * v);
        acc[r][v] = L::mul(x, s);
      }
    }
  } else {
    for (int r = 0; r < R; ++r)
      for (int v = 0; v < NV; ++v) acc[r][v] = L::zero();
  }
  const int64_t a_rs = g.a_rs, a_ks = g.a_ks, b_ks = g.b_ks;
  for (int64_t k = 0; k < g.depth; ++k) {
    typename D::B bv[NV];
    for (int v = 0; v < NV; ++v) bv[v] = kTail && v == NV - 1 ? L::load_n(b + W * v, last) : L::load(b + W * v);
    for (int r = 0; r < R; ++r) {
      const typename D::A av = L::set1(a[r * a_rs]);
      for (int v = 0; v < NV; ++v) acc[r][v] = D::step(acc[r][v], av, bv[v]);
    }
    a += a_ks;
    b += b_ks;
  }
  if constexpr (!std::is_same_v<typename D::Word, float>) {
    if (!g.accumulate && g.scale != 1.0f) {
      const typename L::F s = L::set1(g.scale);
      for (int r = 0; r < R; ++r)
        for (int v = 0; v < NV; ++v) acc[r][v] = L::mul(acc[r][v], s);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < NV; ++v) {
      if (kTail && v == NV - 1)
        L::store_n(c + r * g.c_rs + W * v, last, acc[r][v]);
      else
        L::store(c + r * g.c_rs + W * v, acc[r][v]);
    }
}

// g with its row_scale moved to row r0 (the block's rows see their own scales from index 0).
template <class G>
inline G rows_from(const G& g, int64_t r0) {
  G shifted = g;
  if (g.row_scale) shifted.row_scale = g.row_scale + r0;
  return shifted;
}

// The last nv (1..kMaxNV) vectors of a row block, n_last lanes in the last one: full ones unmasked.
template <class L, template <class> class Dot, int R, int kMaxNV>
inline void product_tail(const GemmOf<typename Dot<L>::Word>& g, const typename Dot<L>::Word* a,
                         const typename Dot<L>::Word* b, float* c, int64_t nv, int64_t n_last) {
  const typename L::Tail last = L::tail(n_last);
  detail::with_index<kMaxNV + 1>(nv, [&]<int NV>() {
    if constexpr (NV > 0) {
      if (n_last == L::kW) product_block<L, Dot, R, NV, false>(g, a, b, c, last);
      else product_block<L, Dot, R, NV, true>(g, a, b, c, last);
    }
  });
}

// Rows r0..r0+R of C, all columns: blocks of kMaxNV vectors, then the rest. Out of line, one function per R: inlined
// into the row dispatch, GCC 12's 4-row AVX2 product ran 20-35 % slower (Zen 4).
template <class L, template <class> class Dot, int R, int kMaxNV>
[[gnu::noinline]] void product_rows(const GemmOf<typename Dot<L>::Word>& g, int64_t r0) {
  constexpr int64_t W = L::kW;
  const auto* a = g.a + r0 * g.a_rs;
  float* c = g.c + r0 * g.c_rs;
  const GemmOf<typename Dot<L>::Word> gr = rows_from(g, r0);
  const typename L::Tail full = L::tail(W);
  int64_t j = 0;
  for (; j + W * kMaxNV <= g.cols; j += W * kMaxNV)
    product_block<L, Dot, R, kMaxNV, false>(gr, a, g.b + j, c + j, full);
  const int64_t rest = g.cols - j;
  if (rest <= 0) return;
  const int64_t nv = (rest + W - 1) / W;
  product_tail<L, Dot, R, kMaxNV>(gr, a, g.b + j, c + j, nv, rest - W * (nv - 1));
}

using detail::for_row_blocks;

// The whole product in blocks of R rows (then the rest), each kMaxNV(rows) vectors wide: R·NV accumulators fit the
// registers.
template <class L, template <class> class Dot, int R, int (*kMaxNV)(int)>
inline void product(const GemmOf<typename Dot<L>::Word>& g) {
  for_row_blocks<R>(g.rows, [&]<int RR>(int64_t r) { product_rows<L, Dot, RR, kMaxNV(RR)>(g, r); });
}

}  // namespace
}  // namespace qkv::kernels::flash
