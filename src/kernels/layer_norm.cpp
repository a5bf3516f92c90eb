// LayerNorm row kernels: the double-accumulated references (ops layer_norm / layer_norm_backward), the tape's
// float32 forward/backward (vectorised row reductions, per-thread partial sums for the parameter gradients), and
// the portable build + dispatcher of the fused residual + bias + LayerNorm (AVX2 build: layer_norm_avx2.cpp).
#include "qkv/kernels/layer_norm.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "qkv/kernels/cpu.h"

namespace qkv::kernels {
namespace {
constexpr int64_t kReferenceParallelMin = int64_t{1} << 15;  // rows·E: below this the reference stays on one thread
constexpr int64_t kParallelMin = int64_t{1} << 17;           // rows·E: below this the tape kernels stay on one thread
}  // namespace

// --- references ------------------------------------------------------------------------------------------------

void layer_norm_rows_reference(const float* px, const float* pw, const float* pb, float eps, int64_t rows, int64_t e,
                               float* py, float* pm, float* ps) {
#pragma omp parallel for schedule(static) if (rows * e >= kReferenceParallelMin && rows > 1)
  for (int64_t i = 0; i < rows; ++i) {
    const float* xr = px + i * e;
    double sum = 0.0;
    for (int64_t j = 0; j < e; ++j) sum += xr[j];
    const double mean = sum / static_cast<double>(e);
    double var = 0.0;
    for (int64_t j = 0; j < e; ++j) {
      const double d = xr[j] - mean;
      var += d * d;
    }
    var /= static_cast<double>(e);
    const double rsd = 1.0 / std::sqrt(var + static_cast<double>(eps));
    pm[i] = static_cast<float>(mean);
    ps[i] = static_cast<float>(rsd);
    float* yr = py + i * e;
    // Centre in double: a float mean would cost |mean| * 2^-24 absolute on every element.
    for (int64_t j = 0; j < e; ++j) {
      float v = static_cast<float>((xr[j] - mean) * rsd);
      if (pw) v *= pw[j];
      if (pb) v += pb[j];
      yr[j] = v;
    }
  }
}

void layer_norm_rows_backward_reference(const float* px, const float* pw, const float* pm, const float* ps,
                                        const float* pg, int64_t rows, int64_t e, float* pdx, float* pdw,
                                        float* pdb) {
  // dx = rstd * (dnorm - mean(dnorm) - xhat * mean(dnorm * xhat)),  dnorm = dy * weight.
#pragma omp parallel for schedule(static) if (rows * e >= kReferenceParallelMin && rows > 1)
  for (int64_t i = 0; i < rows; ++i) {
    const float* xr = px + i * e;
    const float* gr = pg + i * e;
    const double m = pm[i], rs = ps[i];
    double sum_dn = 0.0, sum_dn_xhat = 0.0;
    for (int64_t j = 0; j < e; ++j) {
      const double dn = pw ? static_cast<double>(gr[j]) * pw[j] : gr[j];
      sum_dn += dn;
      sum_dn_xhat += dn * (xr[j] - m) * rs;
    }
    const double mean_dn = sum_dn / static_cast<double>(e), mean_dn_xhat = sum_dn_xhat / static_cast<double>(e);
    float* dr = pdx + i * e;
    for (int64_t j = 0; j < e; ++j) {
      const double dn = pw ? static_cast<double>(gr[j]) * pw[j] : gr[j];
      dr[j] = static_cast<float>(rs * (dn - mean_dn - (xr[j] - m) * rs * mean_dn_xhat));
    }
  }
  if (!pdw && !pdb) return;
  // Parameter gradients: column sums over rows, in double.
  std::vector<double> dw(static_cast<size_t>(e), 0.0), db(static_cast<size_t>(e), 0.0);
  for (int64_t i = 0; i < rows; ++i) {
    const float* xr = px + i * e;
    const float* gr = pg + i * e;
    const double m = pm[i], rs = ps[i];
    for (int64_t j = 0; j < e; ++j) {
      db[static_cast<size_t>(j)] += gr[j];
      dw[static_cast<size_t>(j)] += static_cast<double>(gr[j]) * (xr[j] - m) * rs;
    }
  }
  for (int64_t j = 0; j < e; ++j) {
    if (pdb) pdb[j] = static_cast<float>(db[static_cast<size_t>(j)]);
    if (pdw) pdw[j] = static_cast<float>(dw[static_cast<size_t>(j)]);
  }
}

// --- the tape's float32 kernels --------------------------------------------------------------------------------

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

// --- fused residual + bias + LayerNorm -------------------------------------------------------------------------

namespace portable {

void add_layer_norm_rows(float* y, const float* x, int64_t x_stride, const float* c, const float* w, const float* b,
                         int64_t rows, int64_t e, float eps) {
  for (int64_t r = 0; r < rows; ++r) {
    float* yr = y + r * e;
    const float* xr = x ? x + r * x_stride : nullptr;
    double sum = 0.0;
    for (int64_t j = 0; j < e; ++j) {
      float v = yr[j];
      if (c) v += c[j];
      if (xr) v = xr[j] + v;
      yr[j] = v;
      sum += v;
    }
    const double mean = sum / static_cast<double>(e);
    double var = 0.0;
    for (int64_t j = 0; j < e; ++j) {
      const double d = yr[j] - mean;
      var += d * d;
    }
    var /= static_cast<double>(e);
    const double rsd = 1.0 / std::sqrt(var + static_cast<double>(eps));
    for (int64_t j = 0; j < e; ++j) {
      float v = static_cast<float>((yr[j] - mean) * rsd);
      if (w) v *= w[j];
      if (b) v += b[j];
      yr[j] = v;
    }
  }
}

}  // namespace portable

void add_layer_norm_rows(float* y, const float* x, int64_t x_stride, const float* c, const float* w, const float* b,
                         int64_t rows, int64_t e, float eps) {
  if (rows <= 0 || e <= 0) return;
  const auto kernel = active_isa() >= Isa::kAvx2 ? avx2::add_layer_norm_rows : portable::add_layer_norm_rows;
  // Blocks of rows (about 16K elements each) spread over the threads.
  const int64_t block = std::max<int64_t>(1, (int64_t{1} << 14) / e);
  const int64_t blocks = (rows + block - 1) / block;
#pragma omp parallel for schedule(static) if (blocks > 1)
  for (int64_t k = 0; k < blocks; ++k) {
    const int64_t r0 = k * block, n = std::min(block, rows - r0);
    kernel(y + r0 * e, x ? x + r0 * x_stride : nullptr, x_stride, c, w, b, n, e, eps);
  }
}

}  // namespace qkv::kernels
