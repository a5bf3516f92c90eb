// Tensor storage, views and copies. Views share storage; copies are explicit (contiguous, clone, copy_from).
#include "qkv/core/tensor.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <utility>
#include <vector>

#include "qkv/core/error.h"
#include "qkv/core/parallel_for.h"
#include "qkv/core/storage_pool.h"

namespace qkv {
namespace {

// Storage comes from the caching pool (src/core/storage_pool.cpp): big buffers freed by one step serve the next.
std::shared_ptr<float> allocate(int64_t n) { return storage_pool::allocate(n); }

// dst = src element by element over `shape`, both strided, not overlapping: rows of the last dim, their starts
// walked once; large copies split the rows over the threads. For clone and copy_from (a KV cache's append).
void copy_strided(const Shape& shape, float* dst, const Shape& dst_strides, const float* src, const Shape& src_strides) {
  const int64_t n = shape_numel(shape);
  if (n == 0) return;
  if (shape.empty()) {
    *dst = *src;
    return;
  }
  const int64_t cols = shape.back(), rows = n / cols, ds = dst_strides.back(), ss = src_strides.back();
  // Row starts: inline for the few rows of a KV cache's append, on the heap for big copies.
  SmallVector<int64_t, 16> dst_starts(static_cast<size_t>(rows)), src_starts(static_cast<size_t>(rows));
  const Shape outer(shape.begin(), shape.end() - 1);
  for_each_offset(outer, Shape(dst_strides.begin(), dst_strides.end() - 1),
                  [&](int64_t i, int64_t off) { dst_starts[static_cast<size_t>(i)] = off; });
  for_each_offset(outer, Shape(src_strides.begin(), src_strides.end() - 1),
                  [&](int64_t i, int64_t off) { src_starts[static_cast<size_t>(i)] = off; });
  // A destination that repeats an element (stride 0: an expanded view) keeps one writer, as before.
  bool repeats = false;
  for (size_t d = 0; d < shape.size(); ++d) repeats |= shape[d] > 1 && dst_strides[d] == 0;
  parallel_for(n >= (int64_t{1} << 18) && !repeats, rows, [&](int64_t r) {
    const float* s = src + src_starts[static_cast<size_t>(r)];
    float* d = dst + dst_starts[static_cast<size_t>(r)];
    if (ds == 1 && ss == 1) std::memcpy(d, s, static_cast<size_t>(cols) * sizeof(float));
    else
      for (int64_t j = 0; j < cols; ++j) d[j * ds] = s[j * ss];
  });
}

}  // namespace

Tensor Tensor::empty(const Shape& shape) {
  Tensor t;
  const int64_t n = shape_numel(shape);
  t.storage_ = allocate(n);
  t.shape_ = shape;
  t.strides_ = contiguous_strides(shape);
  return t;
}

Tensor Tensor::zeros(const Shape& shape) { return full(shape, 0.0f); }
Tensor Tensor::ones(const Shape& shape) { return full(shape, 1.0f); }

Tensor Tensor::full(const Shape& shape, float value) {
  Tensor t = empty(shape);
  std::fill_n(t.data(), t.numel(), value);
  return t;
}

Tensor Tensor::from_vector(const Shape& shape, const std::vector<float>& values) {
  Tensor t = empty(shape);
  QKV_CHECK_ARG(static_cast<int64_t>(values.size()) == t.numel(), "[tensor] from_vector got ",
                values.size(), " values for shape ", str(shape));
  std::copy(values.begin(), values.end(), t.data());
  return t;
}

Tensor Tensor::scalar(float value) { return full({}, value); }

Tensor Tensor::from_blob(float* data, const Shape& shape, const Shape& strides,
                         std::shared_ptr<void> owner) {
  QKV_CHECK_ARG(data != nullptr, "[tensor] from_blob got a null pointer for shape ", str(shape));
  shape_numel(shape);
  QKV_CHECK_ARG(strides.empty() || strides.size() == shape.size(), "[tensor] from_blob strides ",
                str(strides), " do not match shape ", str(shape));
  for (int64_t s : strides) QKV_CHECK_ARG(s >= 0, "[tensor] from_blob negative stride in ", str(strides));
  Tensor t;
  t.storage_ = std::shared_ptr<float>(std::move(owner), data);
  if (!t.storage_) t.storage_ = std::shared_ptr<float>(data, [](float*) {});
  t.shape_ = shape;
  t.strides_ = strides.empty() ? contiguous_strides(shape) : strides;
  return t;
}

int64_t Tensor::size(int64_t axis) const { return shape_[normalize_axis(axis, dim(), "tensor.size")]; }
int64_t Tensor::stride(int64_t axis) const {
  return strides_[normalize_axis(axis, dim(), "tensor.stride")];
}

int64_t Tensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape_) n *= d;
  return n;
}

bool Tensor::is_contiguous() const {
  int64_t expected = 1;
  for (int64_t i = dim() - 1; i >= 0; --i) {
    if (shape_[i] == 1) continue;
    if (strides_[i] != expected) return false;
    expected *= shape_[i];
  }
  return true;
}

float* Tensor::data() {
  QKV_CHECK_ARG(defined(), "[tensor] data() of an undefined tensor");
  return storage_.get() + offset_;
}
const float* Tensor::data() const {
  QKV_CHECK_ARG(defined(), "[tensor] data() of an undefined tensor");
  return storage_.get() + offset_;
}

float& Tensor::at(std::initializer_list<int64_t> index) {
  QKV_CHECK_ARG(static_cast<int64_t>(index.size()) == dim(), "[tensor.at] ", index.size(),
                " indices for shape ", str(shape_));
  int64_t off = 0, d = 0;
  for (int64_t i : index) {
    QKV_CHECK_ARG(i >= 0 && i < shape_[d], "[tensor.at] index ", i, " out of range for dim ", d,
                  " of shape ", str(shape_));
    off += i * strides_[d++];
  }
  return data()[off];
}

float Tensor::at(std::initializer_list<int64_t> index) const {
  return const_cast<Tensor*>(this)->at(index);
}

float Tensor::item() const {
  QKV_CHECK_ARG(numel() == 1, "[tensor.item] needs one element, shape is ", str(shape_));
  return data()[0];
}

std::vector<float> Tensor::to_vector() const {
  std::vector<float> out(static_cast<size_t>(numel()));
  const float* p = data();
  for_each_offset(shape_, strides_, [&](int64_t i, int64_t off) { out[i] = p[off]; });
  return out;
}

Tensor Tensor::view(const Shape& shape_in) const {
  QKV_CHECK_ARG(defined(), "[view] undefined tensor");
  Shape shape = shape_in;
  int64_t infer = -1, known = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      QKV_CHECK_ARG(infer < 0, "[view] more than one -1 in ", str(shape_in));
      infer = static_cast<int64_t>(i);
    } else {
      QKV_CHECK_ARG(shape[i] >= 0, "[view] negative dimension in ", str(shape_in));
      known *= shape[i];
    }
  }
  const int64_t n = numel();
  if (infer >= 0) {
    QKV_CHECK_ARG(known != 0 && n % known == 0, "[view] cannot view ", str(shape_), " as ",
                  str(shape_in));
    shape[infer] = n / known;
  }
  QKV_CHECK_ARG(shape_numel(shape) == n, "[view] cannot view ", str(shape_), " (", n,
                " elements) as ", str(shape_in));
  // Stride computation as in torch's computeStride: walk chunks of contiguous old dims.
  Shape strides(shape.size(), 1);
  if (n == 0 || dim() == 0) {  // empty, or a scalar: any shape of numel 1 is contiguous
    strides = contiguous_strides(shape);
  } else {
    int64_t view_d = static_cast<int64_t>(shape.size()) - 1;
    int64_t chunk_base_stride = strides_.empty() ? 1 : strides_.back();
    int64_t tensor_numel = 1, view_numel = 1;
    for (int64_t d = dim() - 1; d >= 0; --d) {
      tensor_numel *= shape_[d];
      if (d == 0 || (shape_[d - 1] != 1 && strides_[d - 1] != tensor_numel * chunk_base_stride)) {
        while (view_d >= 0 && (view_numel < tensor_numel || shape[view_d] == 1)) {
          strides[view_d] = view_numel * chunk_base_stride;
          view_numel *= shape[view_d];
          --view_d;
        }
        QKV_CHECK_ARG(view_numel == tensor_numel, "[view] shape ", str(shape_), " with strides ",
                      str(strides_), " cannot be viewed as ", str(shape_in),
                      "; call contiguous() or reshape()");
        if (d > 0) {
          chunk_base_stride = strides_[d - 1];
          tensor_numel = 1;
          view_numel = 1;
        }
      }
    }
    QKV_CHECK_ARG(view_d == -1, "[view] cannot view ", str(shape_), " as ", str(shape_in));
  }
  Tensor t = *this;
  t.shape_ = shape;
  t.strides_ = strides;
  return t;
}

Tensor Tensor::reshape(const Shape& shape) const {
  try {
    return view(shape);
  } catch (const std::invalid_argument&) {
    return contiguous().view(shape);
  }
}

Tensor Tensor::transpose(int64_t a, int64_t b) const {
  a = normalize_axis(a, dim(), "transpose");
  b = normalize_axis(b, dim(), "transpose");
  Tensor t = *this;
  std::swap(t.shape_[a], t.shape_[b]);
  std::swap(t.strides_[a], t.strides_[b]);
  return t;
}

Tensor Tensor::permute(const Shape& dims) const {
  QKV_CHECK_ARG(static_cast<int64_t>(dims.size()) == dim(), "[permute] dims ", str(dims),
                " do not match rank of ", str(shape_));
  SmallVector<bool, 8> seen(dims.size(), false);
  Tensor t = *this;
  for (size_t i = 0; i < dims.size(); ++i) {
    const int64_t d = normalize_axis(dims[i], dim(), "permute");
    QKV_CHECK_ARG(!seen[d], "[permute] repeated axis in ", str(dims));
    seen[d] = true;
    t.shape_[i] = shape_[d];
    t.strides_[i] = strides_[d];
  }
  return t;
}

Tensor Tensor::slice(int64_t axis, int64_t start, int64_t end, int64_t step) const {
  axis = normalize_axis(axis, dim(), "slice");
  QKV_CHECK_ARG(step > 0, "[slice] step must be positive, got ", step);
  const int64_t n = shape_[axis];
  if (start < 0) start += n;
  if (end < 0) end += n;
  start = std::clamp<int64_t>(start, 0, n);
  end = std::clamp<int64_t>(end, start, n);
  Tensor t = *this;
  t.offset_ += start * strides_[axis];
  t.shape_[axis] = (end - start + step - 1) / step;
  t.strides_[axis] *= step;
  return t;
}

Tensor Tensor::select(int64_t axis, int64_t index) const {
  axis = normalize_axis(axis, dim(), "select");
  const int64_t n = shape_[axis];
  QKV_CHECK_ARG(index >= -n && index < n, "[select] index ", index, " out of range for axis ",
                axis, " of ", str(shape_));
  if (index < 0) index += n;
  Tensor t = *this;
  t.offset_ += index * strides_[axis];
  t.shape_.erase(t.shape_.begin() + axis);
  t.strides_.erase(t.strides_.begin() + axis);
  return t;
}

Tensor Tensor::unsqueeze(int64_t axis) const {
  axis = normalize_axis(axis, dim() + 1, "unsqueeze");
  Tensor t = *this;
  const int64_t s = axis < dim() ? strides_[axis] * shape_[axis] : 1;
  t.shape_.insert(t.shape_.begin() + axis, 1);
  t.strides_.insert(t.strides_.begin() + axis, s);
  return t;
}

Tensor Tensor::squeeze(int64_t axis) const {
  axis = normalize_axis(axis, dim(), "squeeze");
  QKV_CHECK_ARG(shape_[axis] == 1, "[squeeze] axis ", axis, " of ", str(shape_), " is not 1");
  Tensor t = *this;
  t.shape_.erase(t.shape_.begin() + axis);
  t.strides_.erase(t.strides_.begin() + axis);
  return t;
}

Tensor Tensor::expand(const Shape& shape) const {
  QKV_CHECK_ARG(broadcastable_to(shape_, shape), "[expand] ", str(shape_), " cannot broadcast to ",
                str(shape));
  for (int64_t d : shape) QKV_CHECK_ARG(d >= 0, "[expand] negative dimension in ", str(shape));
  shape_numel(shape);  // throws on int64 overflow
  Tensor t = *this;
  const size_t lead = shape.size() - shape_.size();
  t.shape_ = shape;
  t.strides_.assign(shape.size(), 0);
  for (size_t i = 0; i < shape_.size(); ++i)
    t.strides_[lead + i] = (shape_[i] == 1 && shape[lead + i] != 1) ? 0 : strides_[i];
  return t;
}

Tensor Tensor::contiguous() const {
  QKV_CHECK_ARG(defined(), "[contiguous] undefined tensor");
  if (is_contiguous()) return *this;
  return clone();
}

Tensor Tensor::clone() const {
  QKV_CHECK_ARG(defined(), "[clone] undefined tensor");
  Tensor t = empty(shape_);
  float* dst = t.data();
  const float* src = data();
  const int64_t n = numel();
  if (n == 0) return t;
  if (is_contiguous()) {
    std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
    return t;
  }
  copy_strided(shape_, dst, t.strides(), src, strides_);
  return t;
}

void Tensor::copy_from(const Tensor& src) {
  QKV_CHECK_ARG(defined() && src.defined(), "[copy_from] undefined tensor");
  if (src.shape() == shape_ && is_contiguous() && src.is_contiguous()) {  // one block (memmove: overlap-safe)
    std::memmove(data(), src.data(), static_cast<size_t>(numel()) * sizeof(float));
    return;
  }
  Tensor s = src.expand(shape_);
  if (numel() == 0) return;
  // Where the memory the two layouts span intersects (one storage, or two wrappers of the same buffer), the
  // source is materialised first.
  const auto span = [](const Tensor& t) {
    int64_t last = 0;
    for (size_t d = 0; d < t.shape().size(); ++d) last += (t.shape()[d] - 1) * t.strides()[d];
    return std::pair<const float*, const float*>(t.data(), t.data() + last);
  };
  const auto [d0, d1] = span(*this);
  const auto [s0, s1] = span(s);
  if (!(d1 < s0 || s1 < d0)) s = s.clone();
  copy_strided(shape_, data(), strides_, s.data(), s.strides());
}

void Tensor::fill(float value) {
  float* dst = data();
  for_each_offset(shape_, strides_, [&](int64_t, int64_t off) { dst[off] = value; });
}

}  // namespace qkv
