// The low-precision kernels of lowp_impl.h with AVX2 intrinsics: bfloat16 rounding 8 floats at a time (the same
// integer steps as the scalar rounding, so the same bits) and the int8 product as int16 pairs through vpmaddwd into
// exact int32 sums (never the saturating vpmaddubsw), 2 rows of a by 4 rows of b per register block.
#include <immintrin.h>

#include "lowp_impl.h"

namespace qkv::kernels::avx2 {
namespace {

// Rounded bits of 8 floats, low 16 bits cleared; NaN made quiet.
inline __m256i round8(__m256 x) {
  const __m256i u = _mm256_castps_si256(x);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  const __m256i r = _mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), lsb));
  const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q));
  const __m256i quiet = _mm256_or_si256(u, _mm256_set1_epi32(0x00400000));
  return _mm256_and_si256(_mm256_blendv_epi8(r, quiet, nan), _mm256_set1_epi32(static_cast<int>(0xffff0000u)));
}

inline int32_t hsum(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
  return _mm_cvtsi128_si32(s);
}

}  // namespace

void bf16_round_range(const float* x, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + i), round8(_mm256_loadu_ps(x + i)));
  for (; i < n; ++i) y[i] = detail::bf16_round_one(x[i]);
}

void float_to_bf16_range(const float* x, uint16_t* y, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i lo = _mm256_srli_epi32(round8(_mm256_loadu_ps(x + i)), 16);
    const __m256i hi = _mm256_srli_epi32(round8(_mm256_loadu_ps(x + i + 8)), 16);
    // packus interleaves the 128-bit lanes: (lo0, hi0, lo1, hi1) -> (lo0, lo1, hi0, hi1).
    const __m256i p = _mm256_permute4x64_epi64(_mm256_packus_epi32(lo, hi), 0xd8);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + i), p);
  }
  for (; i < n; ++i) y[i] = static_cast<uint16_t>(detail::bf16_round_bits(x[i]) >> 16);
}

void bf16_to_float_range(const uint16_t* x, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x + i)));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + i), _mm256_slli_epi32(w, 16));
  }
  for (; i < n; ++i) {
    const uint32_t u = uint32_t{x[i]} << 16;
    std::memcpy(y + i, &u, sizeof u);
  }
}

void gemm_int8_block(const Int8View& a, const Int8View& b, const float* bias, float* c, int64_t ldc, int64_t m0,
                     int64_t m1, int64_t n0, int64_t n1) {
  const int64_t ld = a.ld;  // a multiple of 16: whole vectors, zero padded
  int64_t i = m0;
  for (; i + 2 <= m1; i += 2) {
    const int16_t* a0 = &a.q[i * ld];
    const int16_t* a1 = a0 + ld;
    int64_t j = n0;
    for (; j + 4 <= n1; j += 4) {
      const int16_t* b0 = &b.q[j * ld];
      __m256i acc[2][4];
      for (auto& row : acc)
        for (auto& v : row) v = _mm256_setzero_si256();
      for (int64_t k = 0; k < ld; k += 16) {
        const __m256i x0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a0 + k));
        const __m256i x1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a1 + k));
        for (int t = 0; t < 4; ++t) {
          const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b0 + t * ld + k));
          acc[0][t] = _mm256_add_epi32(acc[0][t], _mm256_madd_epi16(x0, w));
          acc[1][t] = _mm256_add_epi32(acc[1][t], _mm256_madd_epi16(x1, w));
        }
      }
      for (int r = 0; r < 2; ++r)
        for (int t = 0; t < 4; ++t)
          c[(i + r) * ldc + j + t] = detail::int8_dequant(hsum(acc[r][t]), a.scale[i + r], b.scale[j + t], bias, j + t);
    }
    for (; j < n1; ++j)
      for (int r = 0; r < 2; ++r)
        c[(i + r) * ldc + j] = detail::int8_dequant(detail::int8_dot(&a.q[(i + r) * ld], &b.q[j * ld], ld),
                                                    a.scale[i + r], b.scale[j], bias, j);
  }
  for (; i < m1; ++i) {
    for (int64_t j = n0; j < n1; ++j) {
      const int16_t* ar = &a.q[i * ld];
      const int16_t* br = &b.q[j * ld];
      __m256i acc = _mm256_setzero_si256();
      for (int64_t k = 0; k < ld; k += 16)
        acc = _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(ar + k)),
                                                      _mm256_loadu_si256(reinterpret_cast<const __m256i*>(br + k))));
      c[i * ldc + j] = detail::int8_dequant(hsum(acc), a.scale[i], b.scale[j], bias, j);
    }
  }
}

}  // namespace qkv::kernels::avx2
