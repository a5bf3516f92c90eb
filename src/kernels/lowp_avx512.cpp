// The packed low-precision products (qkv/kernels/lowp.h) with AVX-512: micro.h's microkernel on 16 lanes with bf16
// pairs (vdpbf16ps, AVX512-BF16; 14x32 tiles, and one row by up to 4 panels for decoding) and u8·s8 quads
// (vpdpbusd, AVX512-VNNI; 7x32, each block's exact sums scaled into float sums). The activations are packed per
// tile as [group][row] 32-bit words (two bf16, or four int8 offset by +128 to unsigned), so one broadcast feeds two
// zmm of a weight panel. This file alone is compiled with -mavx512bf16 -mavx512vnni; it holds no inline code from
// the standard library, so nothing built here can stand in for another unit's copy on an older CPU.
#include <immintrin.h>

#include "lowp_avx512_impl.h"
#include "micro_int8.h"
#include "qkv/kernels/lowp.h"

namespace qkv::kernels {
namespace {

constexpr int64_t kMR = detail::kPackedRows;  // rows of c per microkernel: 28 accumulators + 2 weights + 1 broadcast

using detail::lanes;
using L = detail::Lanes512;
using detail::PairsBf16;
using BiasOut = detail::BiasOut<L>;

// The pair word of two rounded halves: even k low, odd k high.
inline __m512i pair_words(__m512 even, __m512 odd) {
  return _mm512_or_si512(_mm512_srli_epi32(detail::bf16_round16_hi(even), 16), detail::bf16_round16_hi(odd));
}

// Rows [0, rows) of x read across (x[r][p] at x[r + p * xks], k columns; rows <= 16 · halves) as bf16 pair words,
// group g's at dst + g * ld: per half of 16 rows the lanes of `keep` stored, zero from row `rows` on.
void pack_pairs_across(const float* x, int64_t xks, int64_t rows, int64_t k, int64_t groups, uint32_t* dst, int64_t ld,
                       int halves, __mmask16 keep) {
  const __mmask16 m[2] = {lanes(rows), lanes(rows - 16)};
  for (int64_t g = 0; g < groups; ++g)
    for (int h = 0; h < halves; ++h) {
      const float* e = x + 16 * h + 2 * g * xks;
      const __m512 odd = 2 * g + 1 < k ? _mm512_maskz_loadu_ps(m[h], e + xks) : _mm512_setzero_ps();
      _mm512_mask_storeu_epi32(dst + g * ld + 16 * h, keep, pair_words(_mm512_maskz_loadu_ps(m[h], e), odd));
    }
}

// Rows [0, rows) of x (x[r][p] at x[r * ldx + p * xks], k columns) as [group][ld] words of bf16 pairs (low half:
// even k). xks == 1: rows read along k; ldx == 1 (a transposed operand): the tile's rows of each k read at once.
void pack_a_bf16(const float* x, int64_t ldx, int64_t xks, int64_t rows, int64_t k, int64_t groups, uint32_t* dst,
                 int64_t ld = kMR) {
  if (xks != 1 && ldx == 1) return pack_pairs_across(x, xks, rows, k, groups, dst, ld, 1, lanes(rows));  // <= 16
  if (xks != 1) {  // any other layout: one element at a time
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t g = 0; g < groups; ++g) {
        const float e = x[r * ldx + 2 * g * xks], o = 2 * g + 1 < k ? x[r * ldx + (2 * g + 1) * xks] : 0.0f;
        dst[g * ld + r] = static_cast<uint32_t>(_mm_cvtsi128_si32(_mm512_castsi512_si128(
            pair_words(_mm512_set1_ps(e), _mm512_set1_ps(o)))));
      }
    return;
  }
  alignas(64) uint32_t pairs[16];
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * ldx;
    for (int64_t g0 = 0; g0 < groups; g0 += 16) {  // 32 floats (k = 2 g0 ..) -> 16 words; past k zero
      _mm512_store_si512(pairs, detail::bf16_pairs32(xr + 2 * g0, k - 2 * g0));
      const int64_t gn = detail::min64(16, groups - g0);
      for (int64_t g = 0; g < gn; ++g) dst[(g0 + g) * ld + r] = pairs[g];
    }
  }
}

}  // namespace

namespace avx512bf16 {
void gemm_bf16_packed_block(const float* x, int64_t ldx, const PackedBView& w, const float* bias, float* c,
                            int64_t ldc, int64_t m0, int64_t m1, int64_t n0, int64_t n1, int64_t xks) {
  const int64_t l_begin = w.col0 + n0, l_end = w.col0 + n1;
  if (m1 - m0 == 1 && l_begin % kPanel == 0 && n0 < n1) {  // one row from a panel's start: panels four at a time
    const int64_t groups = w.groups;
    uint32_t* a = detail::packed_scratch.get(groups * kMR);
    pack_a_bf16(x + m0 * ldx, ldx, xks, 1, w.k, groups, a);
    float* row = c + m0 * ldc + n0;
    const float* brow = bias ? bias + n0 : nullptr;
    const int64_t panels = (l_end - l_begin + kPanel - 1) / kPanel, words = groups * kPanel;
    const uint32_t* b = w.data + l_begin / kPanel * words;
    for (int64_t p = 0; p < panels;) {  // 2·take independent chains, each the tile path's (the same bits)
      const int64_t take = detail::min64(4, panels - p), n = l_end - l_begin - p * kPanel;
      const BiasOut out{brow ? brow + p * kPanel : nullptr};
      const auto run = [&]<int C>() { detail::micro<L, 1, C, PairsBf16, detail::BiasOut>(groups, a, kMR, b + p * words, words, row + p * kPanel, 0, out, n); };
      if (take == 4) run.template operator()<8>();
      else if (take == 3) run.template operator()<6>();
      else if (take == 2) run.template operator()<4>();
      else run.template operator()<2>();
      p += take;
    }
    return;
  }
  detail::run_packed_block(
      w, bias, c, ldc, m0, m1, n0, n1,
      [](int64_t rows, int64_t groups, const uint32_t* a, const uint32_t* b, float* c, int64_t ldc, const BiasOut& out,
         int64_t n) { detail::micro_tile<L, kMR, 2, PairsBf16, detail::BiasOut>(rows, groups, a, kMR, b, c, ldc, out, n); },
      [&](int64_t r0, int64_t rows, uint32_t* dst) { pack_a_bf16(x + r0 * ldx, ldx, xks, rows, w.k, w.groups, dst); },
      [](int64_t, int64_t, const float* b) { return BiasOut{b}; });
}

void pack_bf16_panels(const float* w, int64_t n, int64_t k, int64_t stride_n, int64_t stride_k, int64_t p0,
                      int64_t p1, uint32_t* data) {
  const int64_t groups = (k + 1) / 2;
  for (int64_t p = p0; p < p1; ++p) {
    uint32_t* panel = data + p * groups * kPanel;
    const int64_t j0 = p * kPanel, cols = detail::min64(kPanel, n - j0);
    if (stride_n == 1) {  // a (k, n) row-major B: each k's 32 columns are adjacent
      pack_pairs_across(w + j0, stride_k, cols, k, groups, panel, kPanel, 2, lanes(16));
    } else {  // each column's k along stride_k: pack_a_bf16's row packing, 32 columns as the rows, 16 groups a time
      for (int64_t i = 0; i < groups * kPanel; ++i) panel[i] = 0u;  // lanes past n
      for (int64_t g0 = 0; g0 < groups; g0 += 16)
        pack_a_bf16(w + j0 * stride_n + 2 * g0 * stride_k, stride_n, stride_k, cols, detail::min64(k - 2 * g0, 32),
                    detail::min64(16, groups - g0), panel + g0 * kPanel, kPanel);
    }
  }
}
}  // namespace avx512bf16

namespace avx512vnni {
// micro_int8.h in blocks of 7 rows by 32 columns: the float and int32 sums of 14 rows do not fit in the registers.
void gemm_int8_packed_block(const Int8View& a, const PackedBView& w, const float* bias, float* c, int64_t ldc,
                            int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
  detail::int8_packed_block<L, 7>(a, w, bias, c, ldc, m0, m1, n0, n1);
}
}  // namespace avx512vnni

}  // namespace qkv::kernels
