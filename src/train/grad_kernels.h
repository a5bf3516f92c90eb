// Private helpers of the autograd ops (not installed): in-place gradient accumulation into strided views,
// a thin row-major sgemm wrapper with beta, and a row view helper (column sums live in norm_kernels.h).
#pragma once

#include <cstdint>

#include "norm_kernels.h"
#include "qkv/core/tensor.h"

namespace qkv::train::detail {

// dst += src elementwise (same shape; any strides on both, dst not an expanded view). When `overwrite`, dst = src.
void add_into(Tensor dst, const Tensor& src, bool overwrite = false);

// A fresh contiguous a + b (same shape, any strides): one pass when both are contiguous.
Tensor sum_of(const Tensor& a, const Tensor& b);

// x.contiguous(), with the copy done row by row (memcpy-like when the last dim is contiguous, threaded when large)
// instead of element by element.
Tensor contiguous(const Tensor& x);

// qkv::sum_to(g, shape), with the common case (shape = g's trailing dims, or those with leading 1s) done as one
// sgemv over contiguous rows. Returns g itself when the shapes are equal.
Tensor sum_to(const Tensor& g, const Shape& shape);

// Keeps BLAS on the calling thread for products below ~8M multiply-adds (OpenBLAS shares our OpenMP pool and would
// otherwise open a parallel region per small GEMM: hundreds per step of an RNN, each a stall when the machine is
// busy). Sets the OpenMP thread count to 1 for its scope when `multiply_adds` is small, and restores it.
class SmallBlasGuard {
 public:
  explicit SmallBlasGuard(double multiply_adds);
  ~SmallBlasGuard();
  SmallBlasGuard(const SmallBlasGuard&) = delete;
  SmallBlasGuard& operator=(const SmallBlasGuard&) = delete;

 private:
  int saved_ = 0;  // 0: nothing changed
};

// C (M, N), row stride ldc  =  op(A) · op(B) + beta·C, row-major. ta/tb: A is stored (K, M) / B is stored (N, K).
// Small products run single-threaded (SmallBlasGuard).
void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B,
          int64_t ldb, float beta, float* C, int64_t ldc);

// A tensor with x's values whose last dim is contiguous and whose leading dims collapse into rows with one
// stride: x itself when possible, else a contiguous copy. Returns the row stride in `ld`.
Tensor as_rows(const Tensor& x, int64_t& rows, int64_t& ld);

}  // namespace qkv::train::detail
