// Private (not installed): the packed int8 product on 8 lanes (micro.h's microkernel with u8·s8 quads on ymm), built
// twice: lowp_avxvnni.cpp (vpdpbusd ymm, AVX-VNNI) and lowp_avx2.cpp (the same quads widened to int16 pairs for
// vpmaddwd, AVX2 alone). Include only from those two units, after their own flags: each compiles its own copy.
#pragma once

#include <immintrin.h>

#include "lowp_packed_impl.h"
#include "micro.h"
#include "qkv/kernels/lowp.h"

namespace qkv::kernels::detail {
namespace {

// Rows [0, rows) of int8 rows (int16 values, zero past cols; ld a multiple of 64) as [group][kPackedRows] words of
// 4 bytes q + 128 (the layout of pack_a_int8 in lowp_avx512.cpp).
inline void pack_a_int8_256(const int16_t* q, int64_t ld, int64_t rows, int64_t groups, uint32_t* dst) {
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
      const int64_t gn = min64(8, groups - g0);
      for (int64_t g = 0; g < gn; ++g) dst[(g0 + g) * kPackedRows + r] = words[g];
    }
  }
}

// gemm_int8_packed_block's contract in register blocks of kRows rows by 16 columns (2 ymm: half a panel).
template <int kRows>
void int8_packed_block_256(const Int8View& a, const PackedBView& w, const float* bias, float* c, int64_t ldc,
                           int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
  using Out = Int8Out<Lanes256>;
  const int64_t blocks = a.groups();
  run_packed_block(
      w, bias, c, ldc, m0, m1, n0, n1,
      [](int64_t rows, int64_t groups, const uint32_t* pa, const uint32_t* b, float* c, int64_t ldc, const Out& out,
         int64_t n) { micro_tile<Lanes256, kRows, 2, QuadsU8S8, Int8Out>(rows, groups, pa, kPackedRows, b, c, ldc, out, n); },
      [&](int64_t r0, int64_t rows, uint32_t* dst) { pack_a_int8_256(a.q + r0 * a.ld, a.ld, rows, w.groups, dst); },
      [&](int64_t p, int64_t r0, const float* b) {
        return Out{b, w.colsum + p * blocks * kPanel, w.scale + p * kPanel, a.scale + r0 * blocks, blocks};
      });
}

}  // namespace
}  // namespace qkv::kernels::detail
