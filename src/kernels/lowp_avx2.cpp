// The low-precision kernels of lowp_impl.h with AVX2 intrinsics: bfloat16 rounding 8 floats at a time (the same
// integer steps as the scalar rounding, so the same bits), the int8 quantization, and the packed int8 product
// (micro_int8.h: vpdpbusd's u8·s8 quads widened to int16 pairs for vpmaddwd, exact int32 sums per block, never
// the saturating vpmaddubsw; the same bits as every other int8 build).
#include <immintrin.h>

#include <algorithm>
#include <cmath>

#include "lowp_impl.h"
#include "micro_int8.h"

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

void quantize_row_int8(const float* x, int64_t cols, int64_t group, int64_t blocks, int16_t* q, float* scale) {
  // x - x is 0 for a finite x and NaN for ±inf and NaN.
  __m256 bad = _mm256_setzero_ps();
  int64_t j = 0;
  for (; j + 8 <= cols; j += 8) {
    const __m256 v = _mm256_loadu_ps(x + j);
    bad = _mm256_or_ps(bad, _mm256_cmp_ps(_mm256_sub_ps(v, v), _mm256_setzero_ps(), _CMP_NEQ_UQ));
  }
  bool finite = _mm256_movemask_ps(bad) == 0;
  for (; j < cols; ++j) finite = finite && std::isfinite(x[j]);
  if (!finite) {
    for (int64_t g = 0; g < blocks; ++g) scale[g] = std::nanf("");
    return;
  }
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  for (int64_t g = 0; g < blocks; ++g) {
    const int64_t j0 = g * group, j1 = std::min(cols, j0 + group);
    __m256 m = _mm256_setzero_ps();
    j = j0;
    for (; j + 8 <= j1; j += 8) m = _mm256_max_ps(m, _mm256_and_ps(_mm256_loadu_ps(x + j), abs_mask));
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_shuffle_ps(h, h, 1));
    float amax = _mm_cvtss_f32(h);
    for (; j < j1; ++j) amax = std::max(amax, std::fabs(x[j]));
    if (amax == 0.0f) continue;
    const float inv = 127.0f / amax;
    const __m256 vinv = _mm256_set1_ps(inv);
    const __m256i lo = _mm256_set1_epi32(-127), hi = _mm256_set1_epi32(127);
    j = j0;
    for (; j + 16 <= j1; j += 16) {  // cvtps rounds to nearest even, as nearbyint does
      const __m256i a = _mm256_min_epi32(hi, _mm256_max_epi32(lo, _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + j), vinv))));
      const __m256i b =
          _mm256_min_epi32(hi, _mm256_max_epi32(lo, _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + j + 8), vinv))));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + j), _mm256_permute4x64_epi64(_mm256_packs_epi32(a, b), 0xd8));
    }
    for (; j < j1; ++j) q[j] = static_cast<int16_t>(std::clamp(std::nearbyint(x[j] * inv), -127.0f, 127.0f));
    scale[g] = amax / 127.0f;
  }
}

// The packed product: micro_int8.h's blocks of 3 rows by 16 columns (6 int32 sums; the widened operands of
// the emulated quads take the other registers, and 4 rows spill them).
void gemm_int8_packed_block(const Int8View& a, const PackedBView& w, const float* bias, float* c, int64_t ldc,
                            int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
  detail::int8_packed_block<detail::Lanes256, 3>(a, w, bias, c, ldc, m0, m1, n0, n1);
}

}  // namespace qkv::kernels::avx2
