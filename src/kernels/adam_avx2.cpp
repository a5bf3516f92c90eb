// The Adam element update of adam_impl.h with AVX2+FMA intrinsics, 8 floats at a time: the same operations in
// the same order (FMA, sqrt and division are exactly rounded), so the bits equal the scalar loop's.
#include <immintrin.h>

#include "adam_impl.h"

namespace qkv::kernels::avx2 {

void adam_update_range(const AdamScalars& c, int64_t begin, int64_t end, float* p, const float* g, float* m,
                       float* v) {
  const bool lerp_low = c.w1 < 0.5f;
  const __m256 decay = _mm256_set1_ps(c.decay), wd = _mm256_set1_ps(c.wd), w1 = _mm256_set1_ps(c.w1);
  const __m256 one_minus_w1 = _mm256_set1_ps(1.0f - c.w1), b2 = _mm256_set1_ps(c.b2), w2 = _mm256_set1_ps(c.w2);
  const __m256 eps = _mm256_set1_ps(c.eps), step = _mm256_set1_ps(c.neg_step_size);
  const __m256 bc2_sqrt = _mm256_set1_ps(c.bc2_sqrt);
  int64_t j = begin;
  for (; j + 8 <= end; j += 8) {
    __m256 gj = _mm256_loadu_ps(g + j);
    __m256 pj = _mm256_loadu_ps(p + j);
    if (c.decay_on) {
      if (c.decoupled) pj = _mm256_mul_ps(pj, decay);
      else gj = _mm256_fmadd_ps(pj, wd, gj);
    }
    const __m256 mo = _mm256_loadu_ps(m + j);
    const __m256 diff = _mm256_sub_ps(gj, mo);
    // fma(w1, g - m, m), or fma(-(g - m), 1 - w1, g) = fnmadd(g - m, 1 - w1, g)
    const __m256 mj = lerp_low ? _mm256_fmadd_ps(w1, diff, mo) : _mm256_fnmadd_ps(diff, one_minus_w1, gj);
    const __m256 vj = _mm256_fmadd_ps(_mm256_mul_ps(w2, gj), gj, _mm256_mul_ps(_mm256_loadu_ps(v + j), b2));
    _mm256_storeu_ps(m + j, mj);
    _mm256_storeu_ps(v + j, vj);
    const __m256 denom = _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(vj), bc2_sqrt), eps);
    _mm256_storeu_ps(p + j, _mm256_add_ps(pj, _mm256_div_ps(_mm256_mul_ps(step, mj), denom)));
  }
  detail::adam_update_loop(c, j, end, p, g, m, v);  // the tail, scalar (FMA instructions here too)
}

}  // namespace qkv::kernels::avx2
