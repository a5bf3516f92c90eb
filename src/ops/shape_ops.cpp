// concat and stack: copy inputs into one contiguous result, block by block along the axis.
// Each input is read as (outer, n_i * inner) and lands at column offset_i * inner of (outer, total * inner).
#include "qkv/ops/shape_ops.h"

#include <cstring>

#include "qkv/core/error.h"

namespace qkv {

Tensor concat(const std::vector<Tensor>& xs, int64_t axis) {
  QKV_CHECK_ARG(!xs.empty(), "[concat] needs at least one tensor");
  for (const Tensor& t : xs) QKV_CHECK_ARG(t.defined(), "[concat] undefined input");
  const Shape& first = xs[0].shape();
  const int64_t rank = xs[0].dim();
  QKV_CHECK_ARG(rank >= 1, "[concat] inputs must have rank >= 1, got ", str(first));
  axis = normalize_axis(axis, rank, "concat");
  Shape out_shape = first;
  out_shape[axis] = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    const Shape& s = xs[i].shape();
    bool same = xs[i].dim() == rank;
    for (int64_t d = 0; same && d < rank; ++d) same = d == axis || s[d] == first[d];
    QKV_CHECK_ARG(same, "[concat] input ", i, " has shape ", str(s), " but input 0 has ", str(first),
                  "; all dims but axis ", axis, " must match");
    out_shape[axis] += s[axis];
  }
  Tensor out = Tensor::empty(out_shape);
  if (out.numel() == 0) return out;
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < axis; ++d) outer *= out_shape[d];
  for (int64_t d = axis + 1; d < rank; ++d) inner *= out_shape[d];
  const int64_t row = out_shape[axis] * inner;
  float* po = out.data();
  int64_t at = 0;
  for (const Tensor& t : xs) {
    const int64_t block = t.shape()[axis] * inner;
    if (block > 0) {
      const Tensor c = t.contiguous();
      const float* pc = c.data();
      for (int64_t o = 0; o < outer; ++o)
        std::memcpy(po + o * row + at, pc + o * block, static_cast<size_t>(block) * sizeof(float));
    }
    at += block;
  }
  return out;
}

Tensor stack(const std::vector<Tensor>& xs, int64_t axis) {
  QKV_CHECK_ARG(!xs.empty(), "[stack] needs at least one tensor");
  for (const Tensor& t : xs) QKV_CHECK_ARG(t.defined(), "[stack] undefined input");
  const Shape& first = xs[0].shape();
  axis = normalize_axis(axis, xs[0].dim() + 1, "stack");
  std::vector<Tensor> us;
  us.reserve(xs.size());
  for (size_t i = 0; i < xs.size(); ++i) {
    QKV_CHECK_ARG(xs[i].shape() == first, "[stack] input ", i, " has shape ", str(xs[i].shape()),
                  " but input 0 has ", str(first), "; all must match");
    us.push_back(xs[i].unsqueeze(axis));
  }
  return concat(us, axis);
}

std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t axis) {
  QKV_CHECK_ARG(x.defined(), "[split] undefined input");
  QKV_CHECK_ARG(x.dim() >= 1, "[split] input must have rank >= 1, got ", str(x.shape()));
  axis = normalize_axis(axis, x.dim(), "split");
  int64_t total = 0;
  for (int64_t s : sizes) {
    QKV_CHECK_ARG(s >= 0, "[split] negative size ", s);
    total += s;
  }
  QKV_CHECK_ARG(total == x.size(axis), "[split] sizes add up to ", total, " but axis ", axis, " of ",
                str(x.shape()), " has ", x.size(axis));
  std::vector<Tensor> out;
  out.reserve(sizes.size());
  int64_t at = 0;
  for (int64_t s : sizes) {
    out.push_back(x.slice(axis, at, at + s));
    at += s;
  }
  return out;
}

}  // namespace qkv
