// Gradient kernels of the tape: strided in-place accumulation, column sums, and an sgemm wrapper with beta.
// Contiguous same-layout operands take flat OpenMP loops; everything else walks strides.
#include "qkv/kernels/grad.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <climits>
#include <vector>

#include "qkv/core/error.h"
#include "qkv/kernels/sgemm.h"

namespace qkv::kernels {
namespace {
constexpr int64_t kParallelMin = int64_t{1} << 18;  // elements: below this one thread copies faster
}

Tensor sum_of(const Tensor& a, const Tensor& b) {
  QKV_CHECK_ARG(a.shape() == b.shape(), "[autograd] gradient ", str(b.shape()), " does not match ", str(a.shape()));
  Tensor out = Tensor::empty(a.shape());
  const int64_t n = out.numel();
  if (a.is_contiguous() && b.is_contiguous()) {
    float* po = out.data();
    const float* pa = a.data();
    const float* pb = b.data();
#pragma omp parallel for simd schedule(static) if (n >= kParallelMin)
    for (int64_t i = 0; i < n; ++i) po[i] = pa[i] + pb[i];
    return out;
  }
  add_into(out, a, /*overwrite=*/true);
  add_into(out, b);
  return out;
}

Tensor contiguous(const Tensor& x) {
  if (x.is_contiguous()) return x;
  Tensor out = Tensor::empty(x.shape());
  add_into(out, x, /*overwrite=*/true);
  return out;
}

void add_into(Tensor dst, const Tensor& src, bool overwrite) {
  QKV_CHECK_ARG(dst.shape() == src.shape(), "[autograd] gradient ", str(src.shape()), " does not match ",
                str(dst.shape()));
  const int64_t n = dst.numel();
  if (n == 0) return;
  float* pd = dst.data();
  const float* ps = src.data();
  if (dst.is_contiguous() && src.is_contiguous()) {
    if (overwrite) {
      std::copy(ps, ps + n, pd);
      return;
    }
#pragma omp parallel for simd schedule(static) if (n >= kParallelMin)
    for (int64_t i = 0; i < n; ++i) pd[i] += ps[i];
    return;
  }
  // Walk rows (all dims but the last) of both layouts.
  const int64_t rank = dst.dim();
  const int64_t inner = rank ? dst.size(-1) : 1;
  const int64_t sd = rank ? dst.stride(-1) : 0, ss = rank ? src.stride(-1) : 0;
  const Shape outer(dst.shape().begin(), dst.shape().end() - (rank ? 1 : 0));
  const int64_t rows = n / std::max<int64_t>(inner, 1);
  std::vector<int64_t> od(static_cast<size_t>(rows)), os(static_cast<size_t>(rows));
  for_each_offset(outer, Shape(dst.strides().begin(), dst.strides().end() - (rank ? 1 : 0)),
                  [&](int64_t i, int64_t off) { od[static_cast<size_t>(i)] = off; });
  for_each_offset(outer, Shape(src.strides().begin(), src.strides().end() - (rank ? 1 : 0)),
                  [&](int64_t i, int64_t off) { os[static_cast<size_t>(i)] = off; });
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
  for (int64_t r = 0; r < rows; ++r) {
    float* d = pd + od[static_cast<size_t>(r)];
    const float* s = ps + os[static_cast<size_t>(r)];
    if (overwrite && sd == 1 && ss == 1) {
      std::copy(s, s + inner, d);
    } else if (overwrite) {
      for (int64_t j = 0; j < inner; ++j) d[j * sd] = s[j * ss];
    } else if (sd == 1 && ss == 1) {
      for (int64_t j = 0; j < inner; ++j) d[j] += s[j];
    } else {
      for (int64_t j = 0; j < inner; ++j) d[j * sd] += s[j * ss];
    }
  }
}

Tensor sum_to_trailing(const Tensor& g, const Shape& shape) {
  if (g.shape() == shape) return g;
  // Strip shape's leading 1s; what is left must be exactly g's trailing dims.
  size_t lead = 0;
  while (lead < shape.size() && shape[lead] == 1) ++lead;
  const Shape tail(shape.begin() + static_cast<int64_t>(lead), shape.end());
  const bool trailing = tail.size() <= static_cast<size_t>(g.dim()) &&
                        std::equal(tail.begin(), tail.end(), g.shape().end() - static_cast<int64_t>(tail.size()));
  if (!trailing || !g.is_contiguous() || g.numel() == 0) return Tensor();
  const int64_t cols = shape_numel(tail), rows = g.numel() / std::max<int64_t>(cols, 1);
  Tensor out = Tensor::empty(shape);
  column_sums(g.data(), rows, cols, out.data(), true);
  return out;
}

namespace {
constexpr double kSmallBlasWork = 8.0 * 1024 * 1024;  // multiply-adds: ~80 µs on one core
}

SmallBlasGuard::SmallBlasGuard(double multiply_adds) {
  if (multiply_adds < kSmallBlasWork && !omp_in_parallel()) {
    const int n = omp_get_max_threads();
    if (n > 1) {
      saved_ = n;
      omp_set_num_threads(1);
    }
  }
}

SmallBlasGuard::~SmallBlasGuard() {
  if (saved_ > 0) omp_set_num_threads(saved_);
}

void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B,
          int64_t ldb, float beta, float* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  if (K == 0) {
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) C[i * ldc + j] = beta == 0.0f ? 0.0f : beta * C[i * ldc + j];
    return;
  }
  for (int64_t v : {M, N, K, lda, ldb, ldc})
    QKV_CHECK_RUNTIME(v <= INT_MAX, "[autograd] matrix size ", v, " exceeds the BLAS int range");
  const SmallBlasGuard guard(static_cast<double>(M) * static_cast<double>(N) * static_cast<double>(K));
  sgemm(ta, tb, M, N, K, 1.0f, A, lda, B, ldb, beta, C, ldc);
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

Tensor as_rows(const Tensor& x, int64_t& rows, int64_t& ld) {
  const int64_t r = x.dim();
  const int64_t in = r ? x.size(-1) : 1;
  rows = in ? x.numel() / in : shape_numel(Shape(x.shape().begin(), x.shape().end() - 1));
  bool ok = r >= 1 && (in <= 1 || x.stride(-1) == 1);
  int64_t row_stride = in;
  if (ok && r >= 2) {
    // Leading dims (those of size > 1) must form one arithmetic progression of rows.
    int64_t expect = -1;
    for (int64_t d = r - 2; d >= 0 && ok; --d) {
      if (x.size(d) == 1) continue;
      if (expect < 0) {
        row_stride = x.stride(d);
        ok = row_stride >= in;
        expect = row_stride * x.size(d);
      } else {
        ok = x.stride(d) == expect;
        expect *= x.size(d);
      }
    }
  }
  if (ok) {
    ld = rows <= 1 ? std::max<int64_t>(in, 1) : row_stride;
    return x;
  }
  Tensor c = x.contiguous();
  ld = std::max<int64_t>(in, 1);
  return c;
}

}  // namespace qkv::kernels
