// Shape helpers: printing, checked element counts, strides and numpy-style broadcasting.
#include "qkv/core/shape.h"

#include <algorithm>

#include "qkv/core/error.h"

namespace qkv {

std::string str(const Shape& shape) {
  std::string s = "(";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  if (shape.size() == 1) s += ",";
  return s + ")";
}

int64_t shape_numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    QKV_CHECK_ARG(d >= 0, "[shape] negative dimension in ", str(shape));
    QKV_CHECK_ARG(!__builtin_mul_overflow(n, d, &n), "[shape] element count of ", str(shape),
                  " overflows int64");
  }
  return n;
}

Shape contiguous_strides(const Shape& shape) {
  Shape strides(shape.size(), 1);
  int64_t s = 1;
  for (int64_t i = static_cast<int64_t>(shape.size()) - 1; i >= 0; --i) {
    strides[i] = s;
    s *= std::max<int64_t>(shape[i], 1);
  }
  return strides;
}

int64_t normalize_axis(int64_t axis, int64_t rank, const char* op) {
  QKV_CHECK_ARG(axis >= -rank && axis < rank, "[", op, "] axis ", axis,
                " is out of range for a tensor of rank ", rank);
  return axis < 0 ? axis + rank : axis;
}

Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op) {
  const size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (size_t i = 0; i < n; ++i) {
    const int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    const int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    QKV_CHECK_ARG(da == db || da == 1 || db == 1, "[", op, "] shapes ", str(a), " and ", str(b),
                  " do not broadcast");
    out[i] = da == 1 ? db : da;
  }
  return out;
}

bool broadcastable_to(const Shape& from, const Shape& to) {
  if (from.size() > to.size()) return false;
  const size_t lead = to.size() - from.size();
  for (size_t i = 0; i < from.size(); ++i)
    if (from[i] != 1 && from[i] != to[lead + i]) return false;
  return true;
}

}  // namespace qkv
