// 256-bit helpers of the quantized product's SIMD builds: a block's 32 integer values as int8 lanes, and 8 fp16
// scales to float32 exactly. Included by quant_gemm_avx2.cpp and quant_gemm_avx512.cpp only, each compiling its own
// copy (internal linkage) with its own flags.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "quant_gemm_impl.h"

namespace qkv::kernels::quant_detail {
namespace {

// The 16 nibble bytes as 32 lanes: low nibbles are elements 0..15, high nibbles 16..31.
inline __m256i nibbles(const uint8_t* qs) {
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m128i m = _mm_set1_epi8(0x0F);
  return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), m), _mm_and_si128(v, m));
}

// Bit j of the u32 at qh as 0x10 (set) or 0 in lane j.
inline __m256i fifth_bits(const uint8_t* qh) {
  uint32_t bits;
  std::memcpy(&bits, qh, 4);
  const __m256i spread = _mm256_shuffle_epi8(
      _mm256_set1_epi32(static_cast<int>(bits)),
      _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0x0000000000000000));
  const __m256i m = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201ull));
  return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(spread, m), m), _mm256_set1_epi8(0x10));
}

// A block's 32 values as the unsigned operand of the u8 x s8 products, lanes 0..31: the integer value
// (quant_gemm_impl.h block_value) plus kOffset[kind] = 8, 0, 16, 0 for Q4_0, Q4_1, Q5_0, Q5_1 (the nibbles, with the
// fifth bit), and for Q8_0 (kind 4) the int8 values themselves (signed; offset 0 here).
inline constexpr int kOffset[5] = {8, 0, 16, 0, 0};
template <int kKind>
inline __m256i block_operand(const uint8_t* blk) {
  if constexpr (kKind == 0) return nibbles(blk + 2);
  if constexpr (kKind == 1) return nibbles(blk + 4);
  if constexpr (kKind == 2) return _mm256_or_si256(nibbles(blk + 6), fifth_bits(blk + 2));
  if constexpr (kKind == 3) return _mm256_or_si256(nibbles(blk + 8), fifth_bits(blk + 4));
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 2));
}

// fp16 bit patterns in the low 16 bits of 8 int32 lanes to float32, exactly as qkv::fp16_to_float (subnormals,
// ±inf, NaN payloads) and with no float32 subnormal on the way (the same under FTZ/DAZ): a normal half is its bits
// moved into float32's place with the exponent rebiased (an integer add), a subnormal half its mantissa converted
// and scaled by 2^-24 (exact), exponent 31 rebuilt as inf / NaN.
inline __m256 fp16_lanes_to_float(__m256i v) {
  const __m256i sign = _mm256_slli_epi32(_mm256_and_si256(v, _mm256_set1_epi32(0x8000)), 16);
  const __m256i em = _mm256_and_si256(v, _mm256_set1_epi32(0x7FFF));
  const __m256i mant = _mm256_and_si256(em, _mm256_set1_epi32(0x3FF));
  const __m256i normal = _mm256_add_epi32(_mm256_slli_epi32(em, 13), _mm256_set1_epi32(112 << 23));
  const __m256i subnormal =
      _mm256_castps_si256(_mm256_mul_ps(_mm256_cvtepi32_ps(mant), _mm256_set1_ps(0x1p-24f)));
  const __m256i special = _mm256_or_si256(_mm256_set1_epi32(0x7F800000), _mm256_slli_epi32(mant, 13));
  __m256i bits = _mm256_blendv_epi8(normal, subnormal, _mm256_cmpgt_epi32(_mm256_set1_epi32(0x400), em));
  bits = _mm256_blendv_epi8(bits, special, _mm256_cmpgt_epi32(em, _mm256_set1_epi32(0x7BFF)));
  return _mm256_castsi256_ps(_mm256_or_si256(bits, sign));
}

}  // namespace
}  // namespace qkv::kernels::quant_detail
