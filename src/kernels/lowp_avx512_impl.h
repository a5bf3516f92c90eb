// Private (not installed): the AVX-512 bfloat16 rounding shared by the packed products (lowp_avx512.cpp) and the
// fused attention's bf16 pairs (attention_flash_avx512bf16.cpp): bf16_round_bits of lowp_impl.h on 16 lanes, the
// same integer steps, so the same bits. Include only from files compiled with the AVX-512 flags.
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "micro.h"  // Lanes512; and GCC 12's false -Wmaybe-uninitialized silenced for every unit that includes this

namespace qkv::kernels::detail {
namespace {

// Rounded bf16 bits of 16 floats in the high halves of 16 words (low halves zero); NaN made quiet, sign kept.
inline __m512i bf16_round16_hi(__m512 x) {
  const __m512i u = _mm512_castps_si512(x);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  const __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), lsb));
  const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
  const __m512i quiet = _mm512_or_si512(u, _mm512_set1_epi32(0x00400000));
  return _mm512_and_si512(_mm512_mask_blend_epi32(nan, r, quiet), _mm512_set1_epi32(static_cast<int>(0xffff0000u)));
}

// 16 pair words from the 32 floats lo (0..15) and hi (16..31) already rounded by bf16_round16_hi: word w holds
// float 2w in its low half and float 2w + 1 in its high half.
inline __m512i bf16_adjacent_pairs(__m512i lo, __m512i hi) {
  const __m512i even = _mm512_permutex2var_epi32(
      lo, _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0), hi);
  const __m512i odd = _mm512_permutex2var_epi32(
      lo, _mm512_set_epi32(31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1), hi);
  return _mm512_or_si512(_mm512_srli_epi32(even, 16), odd);
}

// Lanes [0, count) of 16 (none for count <= 0).
inline __mmask16 lanes(int64_t count) { return Lanes512::tail(count); }

// The 16 pair words of x[0, 32) rounded to bf16 (word w: x[2w] low, x[2w + 1] high); x[count..] read as zero.
inline __m512i bf16_pairs32(const float* x, int64_t count) {
  const __m512i lo = bf16_round16_hi(_mm512_maskz_loadu_ps(lanes(count), x));
  const __m512i hi = bf16_round16_hi(_mm512_maskz_loadu_ps(lanes(count - 16), x + 16));
  return bf16_adjacent_pairs(lo, hi);
}

}  // namespace
}  // namespace qkv::kernels::detail
