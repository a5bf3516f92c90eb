// Private (not installed): float32 LayerNorm kernels for the tape and bias-gradient column sums.
// All arrays contiguous row-major; weight / bias may be null (no affine part).
#pragma once

#include <cstdint>

namespace qkv::train::detail {

// x, y: (rows, e)  w, b: (e) or null  ->  y, mean (rows), rstd (rows) = 1/sqrt(biased var + eps)
void layer_norm_rows(const float* x, const float* w, const float* b, float eps, int64_t rows, int64_t e, float* y,
                     float* mean, float* rstd);

// dx = (dx_in, or 0 when dx_in is null) + rstd·(dn - mean(dn) - x̂·mean(dn·x̂)), dn = dy·w  (dx_in may be dx
// itself: accumulate in place);  dw = Σ_rows dy·x̂, db = Σ_rows dy (written, not accumulated; either may be null).
void layer_norm_rows_backward(const float* x, const float* w, const float* mean, const float* rstd, const float* dy,
                              int64_t rows, int64_t e, float* dx, const float* dx_in, float* dw, float* db);

// out[j] (+)= Σ_r g[r, j] for a contiguous (rows, cols) g, as one sgemv.
void column_sums(const float* g, int64_t rows, int64_t cols, float* out, bool overwrite);

}  // namespace qkv::train::detail
