// Row kernels of the inference-only fused residual + bias + LayerNorm (ops add_layer_norm_): a portable loop and
// an AVX2+FMA build (layer_norm_avx2.cpp), both with layer_norm's arithmetic (double statistics, float affine).
#pragma once

#include <cstdint>

namespace qkv::layer_norm_rows {

// For each of `rows` rows of length e (row r at y + r*e, x + r*x_stride):
//   s = x + (y + c);  y = float((s - mean(s)) * rstd(s)) * w + b
// x, c, w, b may be null (then that term is left out). x may equal y's row (the row is read before written).
void portable(float* y, const float* x, int64_t x_stride, const float* c, const float* w, const float* b,
              int64_t rows, int64_t e, float eps);
void avx2(float* y, const float* x, int64_t x_stride, const float* c, const float* w, const float* b,
          int64_t rows, int64_t e, float eps);

}  // namespace qkv::layer_norm_rows
