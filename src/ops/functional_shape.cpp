// Differentiable views and copies of shape: the backward of a view is the inverse view of the gradient; a slice or
// select adds its gradient into the matching slice of the input's gradient buffer; concat's backward is split.
#include <numeric>
#include <stdexcept>
#include <span>

#include "functional_internal.h"
#include "qkv/kernels/grad.h"
#include "qkv/core/error.h"
#include "qkv/ops/shape_ops.h"
#include "qkv/ops/functional.h"

namespace qkv::ad {

using detail::record;
using Douts = std::span<const Tensor>;

Var reshape(const Var& x, const Shape& shape) {
  detail::check_defined(x, "reshape", "x");
  // A view when the strides allow (as Tensor::reshape); else a row-wise copy (merging heads after attention).
  Tensor y;
  try {
    y = x.value.view(shape);
  } catch (const std::invalid_argument&) {
    y = kernels::contiguous(x.value).view(shape);
  }
  return record(y, {&x}, [&] { return [x](Tape& t, Douts d) { t.accumulate(x, d[0].reshape(x.shape())); }; });
}

Var transpose(const Var& x, int64_t a, int64_t b) {
  detail::check_defined(x, "transpose", "x");
  return record(x.value.transpose(a, b), {&x}, [&] { return [x, a, b](Tape& t, Douts d) {
    t.accumulate(x, d[0].transpose(a, b));
  }; });
}

Var permute(const Var& x, const Shape& dims) {
  detail::check_defined(x, "permute", "x");
  const Tensor y = x.value.permute(dims);
  return record(y, {&x}, [&] {
    Shape inverse(dims.size());
    for (size_t i = 0; i < dims.size(); ++i)
      inverse[static_cast<size_t>(normalize_axis(dims[i], x.dim(), "permute"))] = static_cast<int64_t>(i);
    return [x, inverse](Tape& t, Douts d) { t.accumulate(x, d[0].permute(inverse)); };
  });
}

Var select(const Var& x, int64_t axis, int64_t index) {
  detail::check_defined(x, "select", "x");
  return record(x.value.select(axis, index), {&x}, [&] { return [x, axis, index](Tape& t, Douts d) {
    kernels::add_into(t.accumulator_zeroed(x).select(axis, index), d[0]);
  }; });
}

Var slice(const Var& x, int64_t axis, int64_t start, int64_t end, int64_t step) {
  detail::check_defined(x, "slice", "x");
  const Tensor y = x.value.slice(axis, start, end, step);
  return record(y, {&x}, [&] { return [x, axis, start, end, step](Tape& t, Douts d) {
    kernels::add_into(t.accumulator_zeroed(x).slice(axis, start, end, step), d[0]);
  }; });
}

Var unsqueeze(const Var& x, int64_t axis) {
  detail::check_defined(x, "unsqueeze", "x");
  const int64_t ax = normalize_axis(axis, x.dim() + 1, "unsqueeze");
  return record(x.value.unsqueeze(ax), {&x}, [&] {
    return [x, ax](Tape& t, Douts d) { t.accumulate(x, d[0].squeeze(ax)); };
  });
}

Var squeeze(const Var& x, int64_t axis) {
  detail::check_defined(x, "squeeze", "x");
  const int64_t ax = normalize_axis(axis, x.dim(), "squeeze");
  return record(x.value.squeeze(ax), {&x}, [&] {
    return [x, ax](Tape& t, Douts d) { t.accumulate(x, d[0].unsqueeze(ax)); };
  });
}

Var expand(const Var& x, const Shape& shape) {
  detail::check_defined(x, "expand", "x");
  return record(x.value.expand(shape), {&x}, [&] {
    return [x](Tape& t, Douts d) { t.accumulate(x, detail::sum_to(d[0], x.shape())); };
  });
}

Var contiguous(const Var& x) {
  detail::check_defined(x, "contiguous", "x");
  if (x.value.is_contiguous()) return x;
  return record(x.value.contiguous(), {&x}, [&] { return [x](Tape& t, Douts d) { t.accumulate(x, d[0]); }; });
}

Var concat(const std::vector<Var>& xs, int64_t axis) {
  QKV_CHECK_ARG(!xs.empty(), "[concat] needs at least one input");
  std::vector<Tensor> values;
  values.reserve(xs.size());
  Tape* tape = nullptr;
  for (const Var& v : xs) {
    detail::check_defined(v, "concat", "an input");
    values.push_back(v.value);
    if (!tape && v.slot >= 0) tape = v.tape;
  }
  const Tensor out = qkv::concat(values, axis);
  if (!tape) return Var(out);
  const int64_t ax = normalize_axis(axis, out.dim(), "concat");
  std::vector<int64_t> sizes;
  for (const Var& v : xs) sizes.push_back(v.size(ax));
  std::vector<const Var*> ins;
  for (const Var& v : xs) ins.push_back(&v);
  return tape->record({out}, ins, [xs, sizes, ax](Tape& t, Douts d) {
    const std::vector<Tensor> parts = qkv::split(d[0], sizes, ax);
    for (size_t i = 0; i < xs.size(); ++i) t.accumulate(xs[i], parts[i]);
  })[0];
}

Var stack(const std::vector<Var>& xs, int64_t axis) {
  QKV_CHECK_ARG(!xs.empty(), "[stack] needs at least one input");
  std::vector<Var> expanded;
  expanded.reserve(xs.size());
  const int64_t ax = normalize_axis(axis, xs[0].dim() + 1, "stack");
  for (const Var& v : xs) {
    detail::check_defined(v, "stack", "an input");
    QKV_CHECK_ARG(v.shape() == xs[0].shape(), "[stack] inputs ", str(xs[0].shape()), " and ", str(v.shape()),
                  " differ in shape");
    expanded.push_back(unsqueeze(v, ax));
  }
  return concat(expanded, ax);
}

std::vector<Var> split(const Var& x, const std::vector<int64_t>& sizes, int64_t axis) {
  detail::check_defined(x, "split", "x");
  const std::vector<Tensor> parts = qkv::split(x.value, sizes, axis);
  if (!x.requires_grad()) return std::vector<Var>(parts.begin(), parts.end());
  const int64_t ax = normalize_axis(axis, x.dim(), "split");
  return x.tape->record(parts, {&x}, [x, sizes, ax](Tape& t, Douts d) {
    bool all = true;
    for (const Tensor& g : d) all = all && g.defined();
    bool fresh = false;
    Tensor acc = all ? t.accumulator(x, fresh) : t.accumulator_zeroed(x);
    int64_t start = 0;
    for (size_t i = 0; i < sizes.size(); ++i) {
      if (d[i].defined()) kernels::add_into(acc.slice(ax, start, start + sizes[i]), d[i], fresh);
      start += sizes[i];
    }
  });
}

}  // namespace qkv::ad
