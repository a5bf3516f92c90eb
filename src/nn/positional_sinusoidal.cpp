// Sinusoidal positional encoding: the fixed sin/cos table and its addition to (..., T, E) inputs.
// Angles in double, rounded once to float32, so large positions stay accurate.
#include <cmath>

#include "qkv/core/error.h"
#include "qkv/nn/positional/sinusoidal.h"

namespace qkv::nn {

SinusoidalPositionalEncoding::SinusoidalPositionalEncoding(int64_t E, float base) : embed_dim_(E), base_(base) {
  QKV_CHECK_ARG(E >= 1, "[SinusoidalPositionalEncoding] E must be >= 1, got ", E);
  QKV_CHECK_ARG(std::isfinite(base) && base > 0.0f,
                "[SinusoidalPositionalEncoding] base must be finite and > 0, got ", base);
}

Tensor SinusoidalPositionalEncoding::forward(const Tensor& x, int64_t offset) const {
  QKV_CHECK_ARG(x.defined(), "[SinusoidalPositionalEncoding] x is undefined");
  QKV_CHECK_ARG(x.dim() >= 2 && x.size(-1) == embed_dim_, "[SinusoidalPositionalEncoding] x ", str(x.shape()),
                " must be (..., T, ", embed_dim_, ")");
  QKV_CHECK_ARG(offset >= 0, "[SinusoidalPositionalEncoding] offset must be >= 0, got ", offset);
  return add_sinusoidal(x, offset, base_);
}

}  // namespace qkv::nn
