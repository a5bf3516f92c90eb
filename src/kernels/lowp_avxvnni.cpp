// The packed int8 product (qkv/kernels/lowp.h) with AVX-VNNI: the VEX-encoded vpdpbusd on ymm registers, for CPUs
// with AVX2 but no AVX-512 (Alder Lake and later). The packed layout, the +128 offset activations and the exact
// int32 sums per block of kInt8Group k, scaled into float accumulators by fused multiply-adds in block order, are
// those of the avx512vnni build (lowp_avx512.cpp), so the bits are the same. 16 ymm registers: tiles of 6 rows by
// 16 columns (12 int32 accumulators, 2 weight registers, 1 broadcast); the tile's float sums live in memory and are
// updated once per block. This file alone is compiled with -mavx2 -mfma -mavxvnni (no AVX-512); it holds no inline
// code from the standard library, so nothing built here can stand in for another unit's copy on an older CPU.
#include <immintrin.h>

#include "lowp_packed_impl.h"
#include "qkv/kernels/lowp.h"

namespace qkv::kernels {
namespace {

constexpr int64_t kMR = detail::kPackedRows;  // rows per packed activation tile, as the AVX-512 builds
constexpr int kRows = 6;                      // rows of c per register block
constexpr int64_t kHalf = 16;                 // columns of c per register block: half a panel

// Lane l of 8 set (all ones) when l < count.
inline __m256i lanes8(int64_t count) {
  const int n = count < 0 ? 0 : count > 8 ? 8 : static_cast<int>(count);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

// Rows [0, rows) of int8 rows (int16 values, zero past cols; ld a multiple of 64) as [group][kMR] words of
// 4 bytes q + 128 (the layout of pack_a_int8 in lowp_avx512.cpp).
void pack_a_int8(const int16_t* q, int64_t ld, int64_t rows, int64_t groups, uint32_t* dst) {
  alignas(32) uint32_t words[8];
  const __m256i offset = _mm256_set1_epi8(static_cast<char>(0x80));  // v ^ 0x80 = v + 128 for v in [-128, 127]
  for (int64_t r = 0; r < rows; ++r) {
    const int16_t* qr = q + r * ld;
    for (int64_t g0 = 0; g0 < groups; g0 += 8) {  // 32 values -> 8 words (groups is a multiple of 16)
      const __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qr + 4 * g0));
      const __m256i hi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qr + 4 * g0 + 16));
      // packs works per 128-bit lane: (lo0, hi0, lo1, hi1) -> (lo0, lo1, hi0, hi1); values in [-127, 127] stay.
      const __m256i bytes = _mm256_permute4x64_epi64(_mm256_packs_epi16(lo, hi), 0xd8);
      _mm256_store_si256(reinterpret_cast<__m256i*>(words), _mm256_xor_si256(bytes, offset));
      const int64_t gn = detail::min64(8, groups - g0);
      for (int64_t g = 0; g < gn; ++g) dst[(g0 + g) * kMR + r] = words[g];
    }
  }
}

using detail::Int8Out;  // here also a 16-column half's (inside micro_int8)

// R (<= 6) rows of c by 16 columns of a panel (b, out.colsum, out.scale and out.bias at the first of them): per
// block of kInt8Group k, the exact int32 sums (-128 Σ w, plus vpdpbusd on q + 128), scaled into float sums by
// fused multiply-adds in block order. Lanes are stored where m0 (columns 0..7) and m1 (8..15) are set.
template <int R>
void micro_int8(const uint32_t* __restrict a, const uint32_t* __restrict b, float* c, int64_t ldc,
                const Int8Out& out, __m256i m0, __m256i m1) {
  constexpr int64_t kWords = kInt8Group / 4;
  alignas(32) float f[R][kHalf];  // the float sums, in memory: the 16 registers hold the integer ones
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r) {
    _mm256_store_ps(f[r], _mm256_setzero_ps());
    _mm256_store_ps(f[r] + 8, _mm256_setzero_ps());
  }
  for (int64_t g = 0; g < out.blocks; ++g) {
    // The sums start at -128 Σ w (the offset of the activations), so that the block's epilogue needs no
    // registers of its own: the same exact int32 sums as vpdpbusd first and the subtraction after.
    const int32_t* cs = out.colsum + g * kPanel;
    const __m256i c0 = _mm256_sub_epi32(
        _mm256_setzero_si256(), _mm256_slli_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(cs)), 7));
    const __m256i c1 = _mm256_sub_epi32(
        _mm256_setzero_si256(), _mm256_slli_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(cs + 8)), 7));
    __m256i acc0[R], acc1[R];
#pragma GCC unroll 6
    for (int r = 0; r < R; ++r) {
      acc0[r] = c0;
      acc1[r] = c1;
    }
    // Unrolled whole: as a loop, GCC 12 stores every sum to the stack on each step (they live past it).
#pragma GCC unroll 16
    for (int64_t w = 0; w < kWords; ++w) {
      const __m256i b0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b));
      const __m256i b1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 8));
#pragma GCC unroll 6
      for (int r = 0; r < R; ++r) {
        const __m256i av = _mm256_set1_epi32(static_cast<int>(a[r]));
        acc0[r] = _mm256_dpbusd_avx_epi32(acc0[r], av, b0);
        acc1[r] = _mm256_dpbusd_avx_epi32(acc1[r], av, b1);
      }
      a += kMR;
      b += kPanel;
    }
#pragma GCC unroll 6
    for (int r = 0; r < R; ++r) {
      const __m256 sa = _mm256_set1_ps(out.row_scale[r * out.blocks + g]);
      _mm256_store_ps(f[r], _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc0[r]), sa, _mm256_load_ps(f[r])));
      _mm256_store_ps(f[r] + 8, _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc1[r]), sa, _mm256_load_ps(f[r] + 8)));
    }
  }
  const __m256 sb0 = _mm256_loadu_ps(out.scale), sb1 = _mm256_loadu_ps(out.scale + 8);
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r) {
    __m256 y0 = _mm256_mul_ps(_mm256_load_ps(f[r]), sb0), y1 = _mm256_mul_ps(_mm256_load_ps(f[r] + 8), sb1);
    if (out.bias) {
      y0 = _mm256_add_ps(y0, _mm256_maskload_ps(out.bias, m0));
      y1 = _mm256_add_ps(y1, _mm256_maskload_ps(out.bias + 8, m1));
    }
    _mm256_maskstore_ps(c + r * ldc, m0, y0);
    _mm256_maskstore_ps(c + r * ldc + 8, m1, y1);
  }
}

// A tile of up to kMR rows by one 32-column panel, lanes [0, n) stored: register blocks of kRows rows by each
// 16-column half that holds a stored lane.
void tile_int8(int64_t rows, const uint32_t* a, const uint32_t* b, float* c, int64_t ldc, const Int8Out& out,
               int64_t n) {
  using Fn = void (*)(const uint32_t*, const uint32_t*, float*, int64_t, const Int8Out&, __m256i, __m256i);
  static constexpr Fn table[kRows + 1] = {nullptr,       micro_int8<1>, micro_int8<2>, micro_int8<3>,
                                          micro_int8<4>, micro_int8<5>, micro_int8<6>};
  for (int64_t r0 = 0; r0 < rows; r0 += kRows) {
    const int64_t rb = detail::min64(kRows, rows - r0);
    for (int64_t h = 0; h * kHalf < n; ++h) {
      const int64_t l0 = h * kHalf;
      const Int8Out part{out.bias ? out.bias + l0 : nullptr, out.colsum + l0, out.scale + l0,
                         out.row_scale + r0 * out.blocks, out.blocks};
      table[rb](a + r0, b + l0, c + r0 * ldc + l0, ldc, part, lanes8(n - l0), lanes8(n - l0 - 8));
    }
  }
}

}  // namespace

namespace avxvnni {
void gemm_int8_packed_block(const Int8View& a, const PackedBView& w, const float* bias, float* c, int64_t ldc,
                            int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
  const int64_t blocks = a.group > 0 ? a.ld / a.group : 0;
  detail::run_packed_block(
      w, bias, c, ldc, m0, m1, n0, n1,
      [](int64_t rows, int64_t /*groups*/, const uint32_t* pa, const uint32_t* b, float* c, int64_t ldc,
         const Int8Out& out, int64_t n) { tile_int8(rows, pa, b, c, ldc, out, n); },
      [&](int64_t r0, int64_t rows, uint32_t* dst) { pack_a_int8(a.q + r0 * a.ld, a.ld, rows, w.groups, dst); },
      [&](int64_t p, int64_t r0, const float* b) {
        return Int8Out{b, w.colsum + p * blocks * kPanel, w.scale + p * kPanel, a.scale + r0 * blocks, blocks};
      });
}
}  // namespace avxvnni

}  // namespace qkv::kernels
