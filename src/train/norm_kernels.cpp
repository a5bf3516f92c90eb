// LayerNorm forward/backward for the tape in float32 (vectorised row reductions, rows over OpenMP threads, per-thread
// partial sums for the parameter gradients), and bias-gradient column sums as one sgemv against a ones vector.
#include "norm_kernels.h"

#include "grad_kernels.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "qkv/core/error.h"

namespace qkv::train::detail {
namespace {
constexpr int64_t kParallelMin = int64_t{1} << 17;  // rows·E: below this the rows stay on one thread
}

void layer_norm_rows(const float* x, const float* w, const float* b, float eps, int64_t rows, int64_t e, float* y,
                     float* mean, float* rstd) {
  const float inv_e = 1.0f / static_cast<float>(e);
#pragma omp parallel for schedule(static) if (rows * e >= kParallelMin && rows > 1)
  for (int64_t i = 0; i < rows; ++i) {
    const float* xr = x + i * e;
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int64_t j = 0; j < e; ++j) s += xr[j];
    const float m = s * inv_e;
    float v = 0.0f;
#pragma omp simd reduction(+ : v)
    for (int64_t j = 0; j < e; ++j) v += (xr[j] - m) * (xr[j] - m);
    const float rs = 1.0f / std::sqrt(v * inv_e + eps);
    mean[i] = m;
    rstd[i] = rs;
    float* yr = y + i * e;
    if (w && b) {
#pragma omp simd
      for (int64_t j = 0; j < e; ++j) yr[j] = (xr[j] - m) * rs * w[j] + b[j];
    } else {
#pragma omp simd
      for (int64_t j = 0; j < e; ++j) {
        float t = (xr[j] - m) * rs;
        if (w) t *= w[j];
        if (b) t += b[j];
        yr[j] = t;
      }
    }
  }
}

void layer_norm_rows_backward(const float* x, const float* w, const float* mean, const float* rstd, const float* dy,
                              int64_t rows, int64_t e, float* dx, const float* dx_in, float* dw, float* db) {
  const float inv_e = 1.0f / static_cast<float>(e);
  const bool par = rows * e >= kParallelMin && rows > 1;
  const int nt = par ? omp_get_max_threads() : 1;
  // Per-thread partial column sums for dweight / dbias, reduced in thread order (deterministic per thread count).
  std::vector<float> partial(static_cast<size_t>(nt) * 2 * static_cast<size_t>(e), 0.0f);
#pragma omp parallel num_threads(nt) if (par)
  {
    float* pw = partial.data() + static_cast<size_t>(omp_get_thread_num()) * 2 * static_cast<size_t>(e);
    float* pb = pw + e;
#pragma omp for schedule(static)
    for (int64_t i = 0; i < rows; ++i) {
      const float* xr = x + i * e;
      const float* gr = dy + i * e;
      const float m = mean[i], rs = rstd[i];
      float sdn = 0.0f, sdnx = 0.0f;
#pragma omp simd reduction(+ : sdn, sdnx)
      for (int64_t j = 0; j < e; ++j) {
        const float xh = (xr[j] - m) * rs;
        const float dn = w ? gr[j] * w[j] : gr[j];
        sdn += dn;
        sdnx += dn * xh;
        pw[j] += gr[j] * xh;
        pb[j] += gr[j];
      }
      const float mdn = sdn * inv_e, mdnx = sdnx * inv_e;
      float* dr = dx + i * e;
      if (dx_in) {
        const float* ir = dx_in + i * e;
#pragma omp simd
        for (int64_t j = 0; j < e; ++j) {
          const float dn = w ? gr[j] * w[j] : gr[j];
          dr[j] = ir[j] + rs * (dn - mdn - (xr[j] - m) * rs * mdnx);
        }
      } else {
#pragma omp simd
        for (int64_t j = 0; j < e; ++j) {
          const float dn = w ? gr[j] * w[j] : gr[j];
          dr[j] = rs * (dn - mdn - (xr[j] - m) * rs * mdnx);
        }
      }
    }
  }
  for (int64_t j = 0; j < e; ++j) {
    float sw = 0.0f, sb = 0.0f;
    for (int t = 0; t < nt; ++t) {
      sw += partial[static_cast<size_t>(t) * 2 * e + j];
      sb += partial[static_cast<size_t>(t) * 2 * e + e + j];
    }
    if (dw) dw[j] = sw;
    if (db) db[j] = sb;
  }
}

void column_sums(const float* g, int64_t rows, int64_t cols, float* out, bool overwrite) {
  if (cols == 0) return;
  if (rows == 0) {
    if (overwrite) std::fill(out, out + cols, 0.0f);
    return;
  }
  QKV_CHECK_RUNTIME(rows <= INT32_MAX && cols <= INT32_MAX, "[autograd] column sums of ", rows, " x ", cols,
                    " exceed the BLAS int range");
  thread_local std::vector<float> ones;
  if (static_cast<int64_t>(ones.size()) < rows) ones.assign(static_cast<size_t>(rows), 1.0f);
  // out = gᵀ·1 (+ out): one pass over g in BLAS's blocked order.
  const SmallBlasGuard guard(static_cast<double>(rows) * static_cast<double>(cols) / 4.0);  // memory-bound
  cblas_sgemv(CblasRowMajor, CblasTrans, static_cast<int>(rows), static_cast<int>(cols), 1.0f, g,
              static_cast<int>(cols), ones.data(), 1, overwrite ? 0.0f : 1.0f, out, 1);
}

}  // namespace qkv::train::detail
