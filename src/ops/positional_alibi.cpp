// ALiBi: per-head slopes (the official recipe, non-powers of two included) and the (1, H, Tq, Tk) distance bias.
// Slopes are computed as exact powers of two in double, then rounded to float32.
#include <cmath>
#include <cstdlib>
#include <limits>

#include "qkv/core/error.h"
#include "qkv/ops/positional/alibi.h"

namespace qkv {
namespace {

// slope_h of a power-of-two head count n: start^(h+1) with start = 2^(-8/n).
double pow2_slope(int64_t n, int64_t h) { return std::exp2(-8.0 * static_cast<double>(h + 1) / static_cast<double>(n)); }

}  // namespace

Tensor alibi_slopes(int64_t H) {
  QKV_CHECK_ARG(H >= 1, "[alibi_slopes] H must be >= 1, got ", H);
  Tensor out = Tensor::empty({H});
  float* s = out.data();
  int64_t c = 1;  // largest power of two <= H
  while (c * 2 <= H) c *= 2;
  for (int64_t h = 0; h < c; ++h) s[h] = static_cast<float>(pow2_slope(c, h));
  // The rest: slopes 0, 2, 4, ... of head count 2c (2c is a power of two, so no further recursion).
  for (int64_t e = 0; e < H - c; ++e) s[c + e] = static_cast<float>(pow2_slope(2 * c, 2 * e));
  return out;
}

Tensor alibi_bias(int64_t H, int64_t Tq, int64_t Tk, AlibiMode mode, int64_t query_offset) {
  QKV_CHECK_ARG(H >= 1, "[alibi_bias] H must be >= 1, got ", H);
  QKV_CHECK_ARG(Tq >= 0 && Tk >= 0, "[alibi_bias] Tq (", Tq, ") and Tk (", Tk, ") must be >= 0");
  const Tensor slopes = alibi_slopes(H);
  Tensor out = Tensor::empty({1, H, Tq, Tk});
  float* o = out.data();
  const float* s = slopes.data();
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  for (int64_t h = 0; h < H; ++h)
    for (int64_t i = 0; i < Tq; ++i) {
      const int64_t p = i + query_offset;
      for (int64_t j = 0; j < Tk; ++j) {
        const int64_t dist = p - j;
        float v;
        if (mode == AlibiMode::kCausal) v = dist < 0 ? kNegInf : -s[h] * static_cast<float>(dist);
        else v = -s[h] * static_cast<float>(dist < 0 ? -dist : dist);
        o[(h * Tq + i) * Tk + j] = v;
      }
    }
  return out;
}

}  // namespace qkv
