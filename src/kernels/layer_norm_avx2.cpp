// AVX2+FMA build of the fused residual + bias + LayerNorm rows (compiled with -mavx2 -mfma; called only when the
// CPU has both; the portable twin and the dispatcher are in layer_norm.cpp). Statistics in double, 4 lanes at a
// time, as the scalar layer_norm; the affine step in float.
#include <immintrin.h>

#include <cmath>

#include "qkv/kernels/layer_norm.h"

namespace qkv::kernels::avx2 {
namespace {

double hsum(__m256d v) {
  const __m128d s = _mm_add_pd(_mm256_castpd256_pd128(v), _mm256_extractf128_pd(v, 1));
  return _mm_cvtsd_f64(_mm_add_sd(s, _mm_unpackhi_pd(s, s)));
}

}  // namespace

void add_layer_norm_rows(float* y, const float* x, int64_t x_stride, const float* c, const float* w, const float* b,
                         int64_t rows, int64_t e, float eps) {
  const int64_t e8 = e - e % 8;
  for (int64_t r = 0; r < rows; ++r) {
    float* yr = y + r * e;
    const float* xr = x ? x + r * x_stride : nullptr;
    // Pass 1: s = x + (y + c), stored over y; sum in double.
    __m256d s0 = _mm256_setzero_pd(), s1 = _mm256_setzero_pd();
    int64_t j = 0;
    for (; j < e8; j += 8) {
      __m256 v = _mm256_loadu_ps(yr + j);
      if (c) v = _mm256_add_ps(v, _mm256_loadu_ps(c + j));
      if (xr) v = _mm256_add_ps(_mm256_loadu_ps(xr + j), v);
      _mm256_storeu_ps(yr + j, v);
      s0 = _mm256_add_pd(s0, _mm256_cvtps_pd(_mm256_castps256_ps128(v)));
      s1 = _mm256_add_pd(s1, _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)));
    }
    double sum = hsum(_mm256_add_pd(s0, s1));
    for (; j < e; ++j) {
      float v = yr[j];
      if (c) v += c[j];
      if (xr) v = xr[j] + v;
      yr[j] = v;
      sum += v;
    }
    const double mean = sum / static_cast<double>(e);
    // Pass 2: biased variance around the double mean.
    const __m256d m = _mm256_set1_pd(mean);
    __m256d q0 = _mm256_setzero_pd(), q1 = _mm256_setzero_pd();
    for (j = 0; j < e8; j += 8) {
      const __m256 v = _mm256_loadu_ps(yr + j);
      const __m256d d0 = _mm256_sub_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(v)), m);
      const __m256d d1 = _mm256_sub_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)), m);
      q0 = _mm256_fmadd_pd(d0, d0, q0);
      q1 = _mm256_fmadd_pd(d1, d1, q1);
    }
    double var = hsum(_mm256_add_pd(q0, q1));
    for (; j < e; ++j) {
      const double d = yr[j] - mean;
      var += d * d;
    }
    var /= static_cast<double>(e);
    const double rsd = 1.0 / std::sqrt(var + static_cast<double>(eps));
    // Pass 3: centre and scale in double, round to float, then the affine step in float.
    const __m256d rs = _mm256_set1_pd(rsd);
    for (j = 0; j < e8; j += 8) {
      const __m256 v = _mm256_loadu_ps(yr + j);
      const __m256d d0 = _mm256_sub_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(v)), m);
      const __m256d d1 = _mm256_sub_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)), m);
      const __m128 lo = _mm256_cvtpd_ps(_mm256_mul_pd(d0, rs));
      const __m128 hi = _mm256_cvtpd_ps(_mm256_mul_pd(d1, rs));
      __m256 o = _mm256_insertf128_ps(_mm256_castps128_ps256(lo), hi, 1);
      if (w) o = _mm256_mul_ps(o, _mm256_loadu_ps(w + j));
      if (b) o = _mm256_add_ps(o, _mm256_loadu_ps(b + j));
      _mm256_storeu_ps(yr + j, o);
    }
    for (; j < e; ++j) {
      float v = static_cast<float>((yr[j] - mean) * rsd);
      if (w) v *= w[j];
      if (b) v += b[j];
      yr[j] = v;
    }
  }
}

}  // namespace qkv::kernels::avx2
