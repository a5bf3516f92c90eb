// Sinusoidal positional encoding (Vaswani et al. 2017): a fixed table of sines and cosines added to the input.
// PE[pos, 2i] = sin(pos / base^(2i/E)), PE[pos, 2i+1] = cos(pos / base^(2i/E)); an odd E ends on a sine column.
#pragma once

#include <cstdint>

#include "qkv/core/tensor.h"

namespace qkv {

// -> (T, E): row t is position offset + t. T >= 0, E >= 1, offset >= 0, base > 0 and finite.
// Angles are computed in double and rounded once to float32.
Tensor sinusoidal_table(int64_t T, int64_t E, int64_t offset = 0, float base = 10000.0f);

// x: (..., T, E)  ->  x + PE[offset : offset + T]   (a new contiguous tensor; x may be strided)
// Pass offset = number of tokens already decoded when feeding one step at a time.
Tensor add_sinusoidal(const Tensor& x, int64_t offset = 0, float base = 10000.0f);

}  // namespace qkv
