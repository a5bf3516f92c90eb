// Inverted dropout: keep each element with probability 1 - p and scale kept ones by 1 / (1 - p).
// One uniform draw per element, in row-major order, so the same seed gives the same mask.
#include "qkv/ops/dropout.h"

#include <cmath>

#include "qkv/core/error.h"

namespace qkv {

DropoutResult dropout(const Tensor& x, float p, bool training, Rng& rng) {
  QKV_CHECK_ARG(x.defined(), "[dropout] undefined input");
  QKV_CHECK_ARG(p >= 0.0f && p < 1.0f, "[dropout] p must be in [0, 1), got ", p, " for x ",
                str(x.shape()));
  if (!training || p == 0.0f) return {x, Tensor()};
  const Tensor xc = x.contiguous();
  DropoutResult r{Tensor::empty(x.shape()), Tensor::empty(x.shape())};
  const int64_t n = xc.numel();
  const float keep_scale = 1.0f / (1.0f - p);
  const float* px = xc.data();
  float* py = r.y.data();
  float* pm = r.mask.data();
  for (int64_t i = 0; i < n; ++i) {
    const bool keep = rng.uniform() >= p;
    pm[i] = keep ? 1.0f : 0.0f;
    py[i] = keep ? px[i] * keep_scale : 0.0f;
  }
  return r;
}

Tensor dropout_backward(const Tensor& dy, const Tensor& mask, float p) {
  QKV_CHECK_ARG(dy.defined(), "[dropout_backward] undefined dy");
  QKV_CHECK_ARG(p >= 0.0f && p < 1.0f, "[dropout_backward] p must be in [0, 1), got ", p);
  if (!mask.defined()) return dy;  // eval mode or p == 0: the forward was the identity
  QKV_CHECK_ARG(mask.shape() == dy.shape(), "[dropout_backward] mask ", str(mask.shape()), " must match dy ",
                str(dy.shape()));
  const Tensor g = dy.contiguous(), m = mask.contiguous();
  Tensor dx = Tensor::empty(dy.shape());
  const float keep_scale = 1.0f / (1.0f - p);
  const float* pg = g.data();
  const float* pm = m.data();
  float* pd = dx.data();
  for (int64_t i = 0; i < dx.numel(); ++i) pd[i] = pm[i] != 0.0f ? pg[i] * keep_scale : 0.0f;
  return dx;
}

}  // namespace qkv
