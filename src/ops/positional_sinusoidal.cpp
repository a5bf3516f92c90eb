// Sinusoidal positional encoding: the fixed sin/cos table and its addition to (..., T, E) inputs.
// Angles in double, rounded once to float32, so large positions stay accurate.
#include <cmath>

#include "positional_internal.h"
#include "qkv/core/error.h"
#include "qkv/ops/positional/sinusoidal.h"

namespace qkv {
namespace {

void check_table_args(int64_t T, int64_t E, int64_t offset, float base, const char* op) {
  QKV_CHECK_ARG(T >= 0, "[", op, "] T must be >= 0, got ", T);
  QKV_CHECK_ARG(E >= 1, "[", op, "] E must be >= 1, got ", E);
  QKV_CHECK_ARG(offset >= 0, "[", op, "] offset must be >= 0, got ", offset);
  QKV_CHECK_ARG(std::isfinite(base) && base > 0.0f, "[", op, "] base must be finite and > 0, got ", base);
}

Tensor table_unchecked(int64_t T, int64_t E, int64_t offset, float base) {
  Tensor pe = Tensor::empty({T, E});
  float* p = pe.data();
  const double log_base = std::log(static_cast<double>(base));
  for (int64_t c = 0; c < E; ++c) {
    const int64_t two_i = c - (c % 2);
    const double inv_freq = std::exp(-log_base * static_cast<double>(two_i) / static_cast<double>(E));
    for (int64_t t = 0; t < T; ++t) {
      const double angle = static_cast<double>(offset + t) * inv_freq;
      p[t * E + c] = static_cast<float>(c % 2 == 0 ? std::sin(angle) : std::cos(angle));
    }
  }
  return pe;
}

}  // namespace

Tensor sinusoidal_table(int64_t T, int64_t E, int64_t offset, float base) {
  check_table_args(T, E, offset, base, "sinusoidal_table");
  return table_unchecked(T, E, offset, base);
}

Tensor add_sinusoidal(const Tensor& x, int64_t offset, float base) {
  QKV_CHECK_ARG(x.defined(), "[add_sinusoidal] x is undefined");
  QKV_CHECK_ARG(x.dim() >= 2, "[add_sinusoidal] x ", str(x.shape()), " must be (..., T, E) with rank >= 2");
  QKV_CHECK_ARG(x.size(-1) >= 1, "[add_sinusoidal] x ", str(x.shape()), " must have E >= 1");
  check_table_args(x.size(-2), x.size(-1), offset, base, "add_sinusoidal");
  return detail::add_position_rows(x, table_unchecked(x.size(-2), x.size(-1), offset, base));
}

}  // namespace qkv
