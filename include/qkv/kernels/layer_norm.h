// LayerNorm row kernels over contiguous (rows, e) arrays: the float32 forward/backward the tape runs, the fused
// in-place residual + bias + LayerNorm of inference (portable and AVX2+FMA), and their plain double-accumulated
// references (the arithmetic of ops layer_norm / layer_norm_backward). weight / bias may be null (no affine part).
#pragma once

#include <cstdint>

namespace qkv::kernels {

// --- reference: double statistics, biased variance as PyTorch ---------------------------------------------------

// x, y: (rows, e)  w, b: (e) or null  ->  y, mean (rows), rstd (rows) = 1/sqrt(var + eps). The centring is done in
// double (a float mean would cost |mean|·2^-24 on every element). OpenMP over rows when rows·e >= 2^15.
void layer_norm_rows_reference(const float* x, const float* w, const float* b, float eps, int64_t rows, int64_t e,
                               float* y, float* mean, float* rstd);

// dx = rstd·(dn - mean(dn) - x̂·mean(dn·x̂)), dn = dy·w  (written);  dw = Σ_rows dy·x̂, db = Σ_rows dy in double
// (written; either may be null).
void layer_norm_rows_backward_reference(const float* x, const float* w, const float* mean, const float* rstd,
                                        const float* dy, int64_t rows, int64_t e, float* dx, float* dw, float* db);

// --- the tape's float32 kernels (vectorised row reductions, rows over OpenMP threads) ---------------------------

// Same contract as layer_norm_rows_reference, statistics in float (~1e-7 relative to it).
void layer_norm_rows(const float* x, const float* w, const float* b, float eps, int64_t rows, int64_t e, float* y,
                     float* mean, float* rstd);

// dx = (dx_in, or 0 when dx_in is null) + rstd·(dn - mean(dn) - x̂·mean(dn·x̂)), dn = dy·w  (dx_in may be dx
// itself: accumulate in place);  dw = Σ_rows dy·x̂, db = Σ_rows dy (written, not accumulated; either may be null).
// Per-thread partial column sums reduced in thread order: deterministic for a given thread count.
void layer_norm_rows_backward(const float* x, const float* w, const float* mean, const float* rstd, const float* dy,
                              int64_t rows, int64_t e, float* dx, const float* dx_in, float* dw, float* db);

// --- fused residual + bias + LayerNorm, in place (inference) ----------------------------------------------------

// For each of `rows` rows of length e (row r at y + r*e, x + r*x_stride):
//   s = x + (y + c);  y = float((s - mean(s)) * rstd(s)) * w + b
// x, c, w, b may be null (then that term is left out). x may equal y's row (the row is read before written), but
// must not overlap other rows of y. Statistics in double (layer_norm_rows_reference's arithmetic), the affine step
// in float. Dispatched on active_isa() (qkv/kernels/cpu.h); blocks of about 16K elements over OpenMP threads.
void add_layer_norm_rows(float* y, const float* x, int64_t x_stride, const float* c, const float* w, const float* b,
                         int64_t rows, int64_t e, float eps);

// The per-ISA builds, single-threaded (call avx2:: only when cpu_supports(Isa::kAvx2)).
namespace portable {
void add_layer_norm_rows(float* y, const float* x, int64_t x_stride, const float* c, const float* w, const float* b,
                         int64_t rows, int64_t e, float eps);
}  // namespace portable
namespace avx2 {
void add_layer_norm_rows(float* y, const float* x, int64_t x_stride, const float* c, const float* w, const float* b,
                         int64_t rows, int64_t e, float eps);
}  // namespace avx2

}  // namespace qkv::kernels
