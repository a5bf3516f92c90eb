// Softmax and log-softmax along one axis, and their backward: the max is subtracted first, sums in double.
// The input is read as (outer, n, inner); an all -inf slice gives softmax 0 and log-softmax -inf, never NaN.
#include "qkv/ops/softmax.h"

#include <cmath>
#include <limits>
#include <vector>

#include "qkv/core/error.h"

namespace qkv {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// One slice of n values spaced `stride` apart, written to `y` with the same spacing.
void softmax_slice(const float* x, float* y, int64_t n, int64_t stride, bool log) {
  float mx = kNegInf;
  for (int64_t j = 0; j < n; ++j) mx = std::fmax(mx, x[j * stride]);
  if (mx == kNegInf) {  // every entry -inf: no mass anywhere
    for (int64_t j = 0; j < n; ++j) y[j * stride] = log ? kNegInf : 0.0f;
    return;
  }
  double sum = 0.0;
  if (log) {
    for (int64_t j = 0; j < n; ++j) sum += std::exp(static_cast<double>(x[j * stride] - mx));
    const float lse = static_cast<float>(std::log(sum));
    for (int64_t j = 0; j < n; ++j) y[j * stride] = (x[j * stride] - mx) - lse;
    return;
  }
  for (int64_t j = 0; j < n; ++j) {
    const float e = std::exp(x[j * stride] - mx);
    y[j * stride] = e;
    sum += e;
  }
  const float inv = static_cast<float>(1.0 / sum);
  for (int64_t j = 0; j < n; ++j) y[j * stride] *= inv;
}

// Calls f(base, n, stride) for every 1-D slice along `axis` of a contiguous tensor of `shape`.
template <typename F>
void for_each_slice(const Shape& shape, int64_t axis, F f) {
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < axis; ++d) outer *= shape[d];
  for (int64_t d = axis + 1; d < static_cast<int64_t>(shape.size()); ++d) inner *= shape[d];
  const int64_t n = shape[axis];
  const int64_t slices = outer * inner;
#pragma omp parallel for schedule(static) if (slices * n >= (int64_t{1} << 15) && slices > 1)
  for (int64_t s = 0; s < slices; ++s) {
    const int64_t o = s / inner, i = s % inner;
    f(o * n * inner + i, n, inner);
  }
}

Tensor softmax_impl(const Tensor& x_in, int64_t axis, bool log, const char* op) {
  QKV_CHECK_ARG(x_in.defined(), "[", op, "] undefined input");
  QKV_CHECK_ARG(x_in.dim() >= 1, "[", op, "] input must have rank >= 1, got ", str(x_in.shape()));
  axis = normalize_axis(axis, x_in.dim(), op);
  const Tensor x = x_in.contiguous();
  Tensor out = Tensor::empty(x.shape());
  if (out.numel() == 0) return out;
  const float* px = x.data();
  float* py = out.data();
  for_each_slice(x.shape(), axis, [&](int64_t base, int64_t n, int64_t stride) {
    softmax_slice(px + base, py + base, n, stride, log);
  });
  return out;
}

Tensor softmax_backward_impl(const Tensor& y_in, const Tensor& dy_in, int64_t axis, bool log, const char* op) {
  QKV_CHECK_ARG(y_in.defined() && dy_in.defined(), "[", op, "] undefined input");
  QKV_CHECK_ARG(y_in.dim() >= 1, "[", op, "] y must have rank >= 1, got ", str(y_in.shape()));
  QKV_CHECK_ARG(y_in.shape() == dy_in.shape(), "[", op, "] dy ", str(dy_in.shape()), " must match y ",
                str(y_in.shape()));
  axis = normalize_axis(axis, y_in.dim(), op);
  const Tensor y = y_in.contiguous(), dy = dy_in.contiguous();
  Tensor dx = Tensor::empty(y.shape());
  if (dx.numel() == 0) return dx;
  const float* py = y.data();
  const float* pg = dy.data();
  float* pd = dx.data();
  for_each_slice(y.shape(), axis, [&](int64_t base, int64_t n, int64_t stride) {
    const float* yr = py + base;
    const float* gr = pg + base;
    float* dr = pd + base;
    double s = 0.0;
    if (log) {
      // dx = dy - softmax * sum(dy)
      for (int64_t j = 0; j < n; ++j) s += gr[j * stride];
      const float sf = static_cast<float>(s);
      for (int64_t j = 0; j < n; ++j) dr[j * stride] = gr[j * stride] - std::exp(yr[j * stride]) * sf;
    } else {
      // dx = y * (dy - sum(dy * y)). Entries with y == 0 (masked, or a fully masked row) are skipped and
      // written as 0, so a non-finite dy there cannot turn the row into NaN.
      for (int64_t j = 0; j < n; ++j)
        if (yr[j * stride] != 0.0f) s += static_cast<double>(gr[j * stride]) * yr[j * stride];
      const float sf = static_cast<float>(s);
      for (int64_t j = 0; j < n; ++j) {
        const float yv = yr[j * stride];
        dr[j * stride] = yv == 0.0f ? 0.0f : yv * (gr[j * stride] - sf);
      }
    }
  });
  return dx;
}

}  // namespace

Tensor softmax(const Tensor& x, int64_t axis) { return softmax_impl(x, axis, false, "softmax"); }

Tensor log_softmax(const Tensor& x, int64_t axis) {
  return softmax_impl(x, axis, true, "log_softmax");
}

Tensor softmax_backward(const Tensor& y, const Tensor& dy, int64_t axis) {
  return softmax_backward_impl(y, dy, axis, false, "softmax_backward");
}

Tensor log_softmax_backward(const Tensor& y, const Tensor& dy, int64_t axis) {
  return softmax_backward_impl(y, dy, axis, true, "log_softmax_backward");
}

}  // namespace qkv
