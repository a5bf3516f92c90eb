// Gradient kernels of the tape: in-place accumulation into strided views, column sums (bias gradients) as one
// sgemv, a row-major sgemm wrapper with beta that keeps small products on one thread, and a row view helper.
#pragma once

#include <cstdint>

#include "qkv/core/tensor.h"

namespace qkv::kernels {

// dst += src elementwise (same shape; any strides on both, dst not an expanded view). When `overwrite`, dst = src.
void add_into(Tensor dst, const Tensor& src, bool overwrite = false);

// A fresh contiguous a + b (same shape, any strides): one pass when both are contiguous.
Tensor sum_of(const Tensor& a, const Tensor& b);

// x.contiguous(), with the copy done row by row (memcpy-like when the last dim is contiguous, threaded when large)
// instead of element by element.
Tensor contiguous(const Tensor& x);

// out[j] (+)= Σ_r g[r, j] for a contiguous (rows, cols) g, as one sgemv (written when `overwrite`, else added).
void column_sums(const float* g, int64_t rows, int64_t cols, float* out, bool overwrite);

// The fast case of sum_to(g, shape): when shape is g's trailing dims (with or without leading 1s) and g is
// contiguous, the column sums as a fresh tensor of `shape`; g itself when the shapes are equal; otherwise an
// undefined Tensor (the caller then runs the general ops sum_to).
Tensor sum_to_trailing(const Tensor& g, const Shape& shape);

// The multiply-adds a product is charged for each weight element it reads, when choosing its threads: few-row
// (decoding) products are memory-bound, and reading a weight costs about 16 multiply-adds of a compute-bound product
// at fp32, bf16 and int8 alike (bf16 and int8 read 2 and 1 bytes where their multiply-adds run 2 and 4 times faster).
inline constexpr double kWeightReadWork = 16.0;

// The work a (m, k)·(k, n) product is charged with when choosing its threads: its multiply-adds, and at least
// kWeightReadWork per element of the (k, n) operand it reads. kernels::sgemm applies it to every product it hands
// to OpenBLAS (and ad::linear to its whole call), so a linear layer of one shape runs on the same number of OpenBLAS
// threads whether its weight is prepared or not: OpenBLAS's bits may depend on its thread count (they do for a
// 74 x 64 x 192 product under OPENBLAS_CORETYPE=Haswell on AMD Zen 4 and Zen 5).
inline double blas_work(int64_t m, int64_t n, int64_t k) {
  const double nk = static_cast<double>(n) * static_cast<double>(k);
  return nk * (static_cast<double>(m) > kWeightReadWork ? static_cast<double>(m) : kWeightReadWork);
}

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

}  // namespace qkv::kernels
