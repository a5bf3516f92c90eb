// The packed low-precision products (qkv/kernels/lowp.h) with AVX-512: bf16 through vdpbf16ps (AVX512-BF16) and
// int8 through vpdpbusd (AVX512-VNNI), one 14x32 register-blocked microkernel for both. The activations are packed
// per tile as [group][row] 32-bit words (two bf16, or four int8 offset by +128 to unsigned), so one broadcast feeds
// two zmm of a weight panel (int8: tiles of 7 rows, each block's exact sums scaled into float accumulators).
// This file alone is compiled with -mavx512bf16 -mavx512vnni; it holds no inline code
// from the standard library, so nothing built here can stand in for another unit's copy on an older CPU.
#include <immintrin.h>

#include "lowp_avx512_impl.h"
#include "lowp_packed_impl.h"
#include "qkv/kernels/lowp.h"

namespace qkv::kernels {
namespace {

constexpr int64_t kMR = detail::kPackedRows;  // rows of c per microkernel: 28 accumulators + 2 weights + 1 broadcast

using detail::lanes;

// The pair word of two rounded halves: even k low, odd k high.
inline __m512i pair_words(__m512 even, __m512 odd) {
  return _mm512_or_si512(_mm512_srli_epi32(detail::bf16_round16_hi(even), 16), detail::bf16_round16_hi(odd));
}

// Rows [0, rows) of x (x[r][p] at x[r * ldx + p * xks], k columns) as [group][kMR] words of bf16 pairs (low half:
// even k). xks == 1: rows read along k; ldx == 1 (a transposed operand): the tile's rows of each k read at once.
void pack_a_bf16(const float* x, int64_t ldx, int64_t xks, int64_t rows, int64_t k, int64_t groups, uint32_t* dst) {
  if (xks != 1 && ldx == 1) {
    const __mmask16 m = lanes(rows);  // rows <= kMR <= 16
    for (int64_t g = 0; g < groups; ++g) {
      const __m512 even = _mm512_maskz_loadu_ps(m, x + 2 * g * xks);
      const __m512 odd = 2 * g + 1 < k ? _mm512_maskz_loadu_ps(m, x + (2 * g + 1) * xks) : _mm512_setzero_ps();
      _mm512_mask_storeu_epi32(dst + g * kMR, m, pair_words(even, odd));
    }
    return;
  }
  if (xks != 1) {  // any other layout: one element at a time
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t g = 0; g < groups; ++g) {
        const float e = x[r * ldx + 2 * g * xks], o = 2 * g + 1 < k ? x[r * ldx + (2 * g + 1) * xks] : 0.0f;
        dst[g * kMR + r] = static_cast<uint32_t>(_mm_cvtsi128_si32(_mm512_castsi512_si128(
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
      for (int64_t g = 0; g < gn; ++g) dst[(g0 + g) * kMR + r] = pairs[g];
    }
  }
}

// Rows [0, rows) of int8 rows (int16 values, zero past cols; ld a multiple of 64) as [group][kMR] words of
// 4 bytes q + 128.
void pack_a_int8(const int16_t* q, int64_t ld, int64_t rows, int64_t groups, uint32_t* dst) {
  alignas(64) uint32_t words[16];
  for (int64_t r = 0; r < rows; ++r) {
    const int16_t* qr = q + r * ld;
    for (int64_t g0 = 0; g0 < groups; g0 += 16) {  // 64 values -> 16 words
      _mm512_store_si512(words, detail::int8_quads64(qr + 4 * g0));
      const int64_t gn = detail::min64(16, groups - g0);
      for (int64_t g = 0; g < gn; ++g) dst[(g0 + g) * kMR + r] = words[g];
    }
  }
}

struct Bf16Op {
  using Acc = __m512;
  static Acc zero() { return _mm512_setzero_ps(); }
  static Acc dot(Acc acc, __m512i a, __m512i b) {
    return _mm512_dpbf16_ps(acc, reinterpret_cast<__m512bh&>(a), reinterpret_cast<__m512bh&>(b));
  }
};
// The epilogues: one 16-lane half of a c row, lanes masked by m.
struct Bf16Out {
  const float* bias;  // at the panel's first column, or null
  void store(__m512 acc, int64_t /*row*/, int64_t lane0, float* c, __mmask16 m) const {
    if (bias) acc = _mm512_add_ps(acc, _mm512_maskz_loadu_ps(m, bias + lane0));
    _mm512_mask_storeu_ps(c, m, acc);
  }
};
using detail::Int8Out;

// R (<= 7) rows of c by one 32-column panel of the int8 product: per block of kInt8Group k, the exact int32 sums
// (vpdpbusd on q + 128, less 128 Σ w), scaled into float accumulators by fused multiply-adds in block order.
template <int R>
void micro_int8(const uint32_t* __restrict a, const uint32_t* __restrict b, float* c, int64_t ldc,
                const Int8Out& out, __mmask16 m0, __mmask16 m1) {
  constexpr int64_t kWords = kInt8Group / 4;
  __m512 f0[R], f1[R];
#pragma GCC unroll 7
  for (int r = 0; r < R; ++r) f0[r] = f1[r] = _mm512_setzero_ps();
  for (int64_t g = 0; g < out.blocks; ++g) {
    __m512i acc0[R], acc1[R];
#pragma GCC unroll 7
    for (int r = 0; r < R; ++r) acc0[r] = acc1[r] = _mm512_setzero_si512();
#pragma GCC unroll 4
    for (int64_t w = 0; w < kWords; ++w) {
      const __m512i b0 = _mm512_loadu_si512(b);
      const __m512i b1 = _mm512_loadu_si512(b + 16);
#pragma GCC unroll 7
      for (int r = 0; r < R; ++r) {
        const __m512i av = _mm512_set1_epi32(static_cast<int>(a[r]));
        acc0[r] = _mm512_dpbusd_epi32(acc0[r], av, b0);
        acc1[r] = _mm512_dpbusd_epi32(acc1[r], av, b1);
      }
      a += kMR;
      b += kPanel;
    }
    const __m512i c0 = _mm512_slli_epi32(_mm512_loadu_si512(out.colsum + g * kPanel), 7);
    const __m512i c1 = _mm512_slli_epi32(_mm512_loadu_si512(out.colsum + g * kPanel + 16), 7);
#pragma GCC unroll 7
    for (int r = 0; r < R; ++r) {
      const __m512 sa = _mm512_set1_ps(out.row_scale[r * out.blocks + g]);
      f0[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(acc0[r], c0)), sa, f0[r]);
      f1[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(acc1[r], c1)), sa, f1[r]);
    }
  }
  const __m512 sb0 = _mm512_loadu_ps(out.scale), sb1 = _mm512_loadu_ps(out.scale + 16);
#pragma GCC unroll 7
  for (int r = 0; r < R; ++r) {
    __m512 y0 = _mm512_mul_ps(f0[r], sb0), y1 = _mm512_mul_ps(f1[r], sb1);
    if (out.bias) {
      y0 = _mm512_add_ps(y0, _mm512_maskz_loadu_ps(m0, out.bias));
      y1 = _mm512_add_ps(y1, _mm512_maskz_loadu_ps(m1, out.bias + 16));
    }
    _mm512_mask_storeu_ps(c + r * ldc, m0, y0);
    _mm512_mask_storeu_ps(c + r * ldc + 16, m1, y1);
  }
}

// R rows of c by one 32-column panel: acc over every k-group, then the epilogue.
template <class Op, int R, class Out>
void micro(int64_t groups, const uint32_t* __restrict a, const uint32_t* __restrict b, float* c, int64_t ldc,
           const Out& out, __mmask16 m0, __mmask16 m1) {
  typename Op::Acc acc0[R], acc1[R];
#pragma GCC unroll 14
  for (int r = 0; r < R; ++r) {
    acc0[r] = Op::zero();
    acc1[r] = Op::zero();
  }
#pragma GCC unroll 2
  for (int64_t g = 0; g < groups; ++g) {
    const __m512i b0 = _mm512_loadu_si512(b);
    const __m512i b1 = _mm512_loadu_si512(b + 16);
#pragma GCC unroll 14
    for (int r = 0; r < R; ++r) {
      const __m512i av = _mm512_set1_epi32(static_cast<int>(a[r]));
      acc0[r] = Op::dot(acc0[r], av, b0);
      acc1[r] = Op::dot(acc1[r], av, b1);
    }
    a += kMR;
    b += kPanel;
  }
#pragma GCC unroll 14
  for (int r = 0; r < R; ++r) {
    out.store(acc0[r], r, 0, c + r * ldc, m0);
    out.store(acc1[r], r, 16, c + r * ldc + 16, m1);
  }
}

// An int8 tile of up to kMR rows as two of at most 7 (float and int32 accumulators for 14 rows do not fit).
inline void micro_rows(int64_t rows, int64_t /*groups*/, const uint32_t* a, const uint32_t* b, float* c, int64_t ldc,
                       const Int8Out& out, __mmask16 m0, __mmask16 m1) {
  using Fn = void (*)(const uint32_t*, const uint32_t*, float*, int64_t, const Int8Out&, __mmask16, __mmask16);
  static constexpr Fn table[8] = {nullptr,       micro_int8<1>, micro_int8<2>, micro_int8<3>,
                                  micro_int8<4>, micro_int8<5>, micro_int8<6>, micro_int8<7>};
  const int64_t first = detail::min64(rows, 7);
  table[first](a, b, c, ldc, out, m0, m1);
  if (rows > 7) {
    Int8Out rest = out;
    rest.row_scale += 7 * out.blocks;
    table[rows - 7](a + 7, b, c + 7 * ldc, ldc, rest, m0, m1);
  }
}

template <class Op, class Out>
void micro_rows(int64_t rows, int64_t groups, const uint32_t* a, const uint32_t* b, float* c, int64_t ldc,
                const Out& out, __mmask16 m0, __mmask16 m1) {
  using Fn = void (*)(int64_t, const uint32_t*, const uint32_t*, float*, int64_t, const Out&, __mmask16, __mmask16);
  static constexpr Fn table[kMR + 1] = {nullptr,
                                        micro<Op, 1, Out>,
                                        micro<Op, 2, Out>,
                                        micro<Op, 3, Out>,
                                        micro<Op, 4, Out>,
                                        micro<Op, 5, Out>,
                                        micro<Op, 6, Out>,
                                        micro<Op, 7, Out>,
                                        micro<Op, 8, Out>,
                                        micro<Op, 9, Out>,
                                        micro<Op, 10, Out>,
                                        micro<Op, 11, Out>,
                                        micro<Op, 12, Out>,
                                        micro<Op, 13, Out>,
                                        micro<Op, 14, Out>};
  table[rows](groups, a, b, c, ldc, out, m0, m1);
}

// One row of c by P panels side by side (decoding): 2·P independent sums, each panel's pair exactly micro<Bf16Op, 1>'s
// (the same vdpbf16ps chain over the groups, the same epilogue), so the bits of the tile path. a: the packed row
// (word g at a[g·kMR]); b: the first panel; c and bias at its lane 0; the last panel stores lanes [0, last).
template <int P>
void row_panels(int64_t groups, const uint32_t* __restrict a, const uint32_t* __restrict b, int64_t panel_words,
                float* c, const float* bias, int64_t last) {
  __m512 acc[P][2];
#pragma GCC unroll 4
  for (int p = 0; p < P; ++p) acc[p][0] = acc[p][1] = Bf16Op::zero();
  for (int64_t g = 0; g < groups; ++g) {
    const __m512i av = _mm512_set1_epi32(static_cast<int>(a[g * kMR]));
#pragma GCC unroll 4
    for (int p = 0; p < P; ++p) {
      const uint32_t* bp = b + p * panel_words + g * kPanel;
      acc[p][0] = Bf16Op::dot(acc[p][0], av, _mm512_loadu_si512(bp));
      acc[p][1] = Bf16Op::dot(acc[p][1], av, _mm512_loadu_si512(bp + 16));
    }
  }
#pragma GCC unroll 4
  for (int p = 0; p < P; ++p) {
    const int64_t n = p == P - 1 ? last : kPanel;
    const Bf16Out out{bias ? bias + p * kPanel : nullptr};
    out.store(acc[p][0], 0, 0, c + p * kPanel, lanes(n));
    out.store(acc[p][1], 0, 16, c + p * kPanel + 16, lanes(n - 16));
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
    for (int64_t p = 0; p < panels;) {
      const int64_t take = detail::min64(4, panels - p);
      const int64_t last = detail::min64(kPanel, l_end - l_begin - (p + take - 1) * kPanel);
      const float* bp = brow ? brow + p * kPanel : nullptr;
      if (take == 4) row_panels<4>(groups, a, b + p * words, words, row + p * kPanel, bp, last);
      else if (take == 3) row_panels<3>(groups, a, b + p * words, words, row + p * kPanel, bp, last);
      else if (take == 2) row_panels<2>(groups, a, b + p * words, words, row + p * kPanel, bp, last);
      else row_panels<1>(groups, a, b + p * words, words, row + p * kPanel, bp, last);
      p += take;
    }
    return;
  }
  detail::run_packed_block(
      w, bias, c, ldc, m0, m1, n0, n1,
      [](int64_t rows, int64_t groups, const uint32_t* a, const uint32_t* b, float* c, int64_t ldc, const Bf16Out& out,
         int64_t n) { micro_rows<Bf16Op>(rows, groups, a, b, c, ldc, out, lanes(n), lanes(n - 16)); },
      [&](int64_t r0, int64_t rows, uint32_t* dst) { pack_a_bf16(x + r0 * ldx, ldx, xks, rows, w.k, w.groups, dst); },
      [](int64_t, int64_t, const float* b) { return Bf16Out{b}; });
}

void pack_bf16_panels(const float* w, int64_t n, int64_t k, int64_t stride_n, int64_t stride_k, int64_t p0,
                      int64_t p1, uint32_t* data) {
  const int64_t groups = (k + 1) / 2;
  for (int64_t p = p0; p < p1; ++p) {
    uint32_t* panel = data + p * groups * kPanel;
    const int64_t j0 = p * kPanel, cols = detail::min64(kPanel, n - j0);
    if (stride_n == 1) {  // a (k, n) row-major B: each k's 32 columns are adjacent
      const __mmask16 m0 = lanes(cols), m1 = lanes(cols - 16);
      for (int64_t g = 0; g < groups; ++g) {
        const float* e = w + j0 + 2 * g * stride_k;
        const float* o = e + stride_k;
        const bool odd = 2 * g + 1 < k;
        for (int h = 0; h < 2; ++h) {
          const __mmask16 m = h ? m1 : m0;
          const __m512 ev = _mm512_maskz_loadu_ps(m, e + 16 * h);
          const __m512 ov = odd ? _mm512_maskz_loadu_ps(m, o + 16 * h) : _mm512_setzero_ps();
          _mm512_storeu_si512(panel + g * kPanel + 16 * h, pair_words(ev, ov));
        }
      }
    } else {  // each column's k along stride_k: pack_a_bf16's row packing, 32 columns as rows of a kPanel tile
      for (int64_t i = 0; i < groups * kPanel; ++i) panel[i] = 0u;  // lanes past n
      for (int64_t l0 = 0; l0 < cols; l0 += kMR) {
        alignas(64) uint32_t tile[16 * kMR];
        const int64_t rows = detail::min64(kMR, cols - l0);
        for (int64_t g0 = 0; g0 < groups; g0 += 16) {
          const int64_t gn = detail::min64(16, groups - g0);
          pack_a_bf16(w + (j0 + l0) * stride_n + 2 * g0 * stride_k, stride_n, stride_k, rows,
                      detail::min64(k - 2 * g0, 32), gn, tile);
          for (int64_t g = 0; g < gn; ++g)
            for (int64_t r = 0; r < rows; ++r) panel[(g0 + g) * kPanel + l0 + r] = tile[g * kMR + r];
        }
      }
    }
  }
}
}  // namespace avx512bf16

namespace avx512vnni {
void gemm_int8_packed_block(const Int8View& a, const PackedBView& w, const float* bias, float* c, int64_t ldc,
                            int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
  const int64_t blocks = a.groups();
  detail::run_packed_block(
      w, bias, c, ldc, m0, m1, n0, n1,
      [](int64_t rows, int64_t groups, const uint32_t* pa, const uint32_t* b, float* c, int64_t ldc,
         const Int8Out& out, int64_t n) { micro_rows(rows, groups, pa, b, c, ldc, out, lanes(n), lanes(n - 16)); },
      [&](int64_t r0, int64_t rows, uint32_t* dst) { pack_a_int8(a.q + r0 * a.ld, a.ld, rows, w.groups, dst); },
      [&](int64_t p, int64_t r0, const float* b) {
        return Int8Out{b, w.colsum + p * blocks * kPanel, w.scale + p * kPanel, a.scale + r0 * blocks, blocks};
      });
}
}  // namespace avx512vnni

}  // namespace qkv::kernels
