// Sinusoidal positional encoding (Vaswani et al. 2017): a fixed table of sines and cosines added to the input.
// PE[pos, 2i] = sin(pos / base^(2i/E)), PE[pos, 2i+1] = cos(pos / base^(2i/E)); an odd E ends on a sine column.
#pragma once

#include <cstdint>

#include "qkv/core/tensor.h"
#include "qkv/nn/module.h"
#include "qkv/ops/positional/sinusoidal.h"

namespace qkv::nn {

// No parameters; the module form of add_sinusoidal for a fixed width E.
class SinusoidalPositionalEncoding : public Module {
 public:
  explicit SinusoidalPositionalEncoding(int64_t E, float base = 10000.0f);

  // x: (..., T, E)  ->  x + PE[offset : offset + T]
  Tensor forward(const Tensor& x, int64_t offset = 0) const;

  int64_t embed_dim() const { return embed_dim_; }

 private:
  int64_t embed_dim_;
  float base_;
};

}  // namespace qkv::nn
