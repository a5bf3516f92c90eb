// The packed int8 product (qkv/kernels/lowp.h) with AVX-VNNI: micro.h's microkernel on 8 lanes with u8·s8 quads
// (the VEX-encoded vpdpbusd ymm), for CPUs with AVX2 but no AVX-512 (Alder Lake and later). The packed layout, the
// +128 offset activations and the exact int32 sums per block of kInt8Group k, scaled into float sums by fused
// multiply-adds in block order, are those of the avx512vnni build (lowp_avx512.cpp), so the bits are the same.
// 16 ymm registers: tiles of 6 rows by 16 columns (12 int32 sums, 2 weight registers, 1 broadcast; the float sums
// go to the stack, touched once per block). This file alone is compiled with -mavx2 -mfma -mavxvnni (no AVX-512);
// it holds no inline code from the standard library, so nothing built here can stand in for another unit's copy on
// an older CPU.
#include <immintrin.h>

#include "lowp_packed_impl.h"
#include "micro.h"
#include "qkv/kernels/lowp.h"

namespace qkv::kernels {
namespace {

constexpr int64_t kMR = detail::kPackedRows;  // rows per packed activation tile, as the AVX-512 builds
constexpr int kRows = 6;  // rows of c per register block, by 16 columns (2 ymm): half a panel
using L = detail::Lanes256;
using Int8Out = detail::Int8Out<L>;

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

}  // namespace

namespace avxvnni {
void gemm_int8_packed_block(const Int8View& a, const PackedBView& w, const float* bias, float* c, int64_t ldc,
                            int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
  const int64_t blocks = a.group > 0 ? a.ld / a.group : 0;
  detail::run_packed_block(
      w, bias, c, ldc, m0, m1, n0, n1,
      [](int64_t rows, int64_t groups, const uint32_t* pa, const uint32_t* b, float* c, int64_t ldc,
         const Int8Out& out, int64_t n) {
        detail::micro_tile<L, kRows, 2, detail::QuadsU8S8, detail::Int8Out>(rows, groups, pa, kMR, b, c, ldc, out, n);
      },
      [&](int64_t r0, int64_t rows, uint32_t* dst) { pack_a_int8(a.q + r0 * a.ld, a.ld, rows, w.groups, dst); },
      [&](int64_t p, int64_t r0, const float* b) {
        return Int8Out{b, w.colsum + p * blocks * kPanel, w.scale + p * kPanel, a.scale + r0 * blocks, blocks};
      });
}
}  // namespace avxvnni

}  // namespace qkv::kernels
