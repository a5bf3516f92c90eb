// Rotary position embedding: rotates feature pairs of (..., T, D) by pos·θ_i, interleaved or half-split pairing.
// Angles follow the float32 reference recipe; cos/sin are tabulated once per (position, frequency).
#include <cmath>
#include <vector>

#include "qkv/core/error.h"
#include "qkv/ops/positional/rope.h"

namespace qkv {
namespace {

Tensor rope_impl(const Tensor& x, const std::vector<int64_t>& positions, float base, RopeVariant variant) {
  const int64_t T = x.size(-2), D = x.size(-1), half = D / 2;
  // cos/sin tables (T, D/2): inv_freq = 1 / base^(2i/D), angle = pos * inv_freq, all float32 like torch.
  std::vector<float> cs(static_cast<size_t>(T * half)), sn(static_cast<size_t>(T * half));
  // Threaded from a few thousand angles or elements on (a prefill's q and k); each value is computed alike either way.
#pragma omp parallel for schedule(static) if (T * half >= 2048)
  for (int64_t i = 0; i < half; ++i) {
    const float expo = static_cast<float>(2 * i) / static_cast<float>(D);
    const float inv_freq = 1.0f / std::pow(base, expo);
    for (int64_t t = 0; t < T; ++t) {
      const float angle = static_cast<float>(positions[t]) * inv_freq;
      cs[t * half + i] = static_cast<float>(std::cos(static_cast<double>(angle)));
      sn[t * half + i] = static_cast<float>(std::sin(static_cast<double>(angle)));
    }
  }
  const Tensor xc = x.contiguous();
  Tensor out = Tensor::empty(x.shape());
  const int64_t rows = x.numel() / std::max<int64_t>(D, 1);
  const float* src = xc.data();
  float* dst = out.data();
#pragma omp parallel for schedule(static) if (rows * D >= (int64_t{1} << 15))
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t t = r % T;
    const float* c = cs.data() + t * half;
    const float* s = sn.data() + t * half;
    const float* a = src + r * D;
    float* o = dst + r * D;
    if (variant == RopeVariant::kInterleaved) {
      for (int64_t i = 0; i < half; ++i) {
        const float x0 = a[2 * i], x1 = a[2 * i + 1];
        o[2 * i] = x0 * c[i] - x1 * s[i];
        o[2 * i + 1] = x0 * s[i] + x1 * c[i];
      }
    } else {
      for (int64_t i = 0; i < half; ++i) {
        const float x0 = a[i], x1 = a[i + half];
        o[i] = x0 * c[i] - x1 * s[i];
        o[i + half] = x0 * s[i] + x1 * c[i];
      }
    }
  }
  return out;
}

void check_rope(const Tensor& x, float base) {
  QKV_CHECK_ARG(x.defined(), "[rope_apply] x is undefined");
  QKV_CHECK_ARG(x.dim() >= 2, "[rope_apply] x ", str(x.shape()), " must be (..., T, D) with rank >= 2");
  QKV_CHECK_ARG(x.size(-1) >= 2 && x.size(-1) % 2 == 0, "[rope_apply] x ", str(x.shape()),
                " must have an even, positive last dimension D");
  QKV_CHECK_ARG(std::isfinite(base) && base > 0.0f, "[rope_apply] base must be finite and > 0, got ", base);
}

}  // namespace

Tensor rope_apply(const Tensor& x, int64_t offset, float base, RopeVariant variant) {
  check_rope(x, base);
  QKV_CHECK_ARG(offset >= 0, "[rope_apply] offset must be >= 0, got ", offset);
  std::vector<int64_t> positions(static_cast<size_t>(x.size(-2)));
  for (size_t t = 0; t < positions.size(); ++t) positions[t] = offset + static_cast<int64_t>(t);
  return rope_impl(x, positions, base, variant);
}

Tensor rope_apply(const Tensor& x, const std::vector<int64_t>& positions, float base, RopeVariant variant) {
  check_rope(x, base);
  QKV_CHECK_ARG(static_cast<int64_t>(positions.size()) == x.size(-2), "[rope_apply] got ", positions.size(),
                " positions for x ", str(x.shape()), " (need one per row T = ", x.size(-2), ")");
  for (int64_t p : positions) QKV_CHECK_ARG(p >= 0, "[rope_apply] positions must be >= 0, got ", p);
  return rope_impl(x, positions, base, variant);
}

}  // namespace qkv
