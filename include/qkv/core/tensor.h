// Tensor: an N-d float32 array as shape + strides + offset over shared storage.
// Views (reshape of contiguous data, transpose, permute, slice, select, expand) share storage; nothing copies silently.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <vector>

#include "qkv/core/shape.h"

namespace qkv {

class Tensor {
 public:
  // An undefined tensor (defined() == false). Used for "absent" optional inputs.
  Tensor() = default;

  // --- construction ---------------------------------------------------------
  static Tensor empty(const Shape& shape);  // uninitialised, 64-byte aligned, contiguous
  static Tensor zeros(const Shape& shape);
  static Tensor ones(const Shape& shape);
  static Tensor full(const Shape& shape, float value);
  // Copies `values` (row-major); values.size() must equal numel(shape).
  static Tensor from_vector(const Shape& shape, const std::vector<float>& values);
  static Tensor scalar(float value);
  // Wraps memory owned elsewhere without copying; `owner` keeps it alive (numpy array, mmap, ...).
  // strides in elements; pass {} for contiguous.
  static Tensor from_blob(float* data, const Shape& shape, const Shape& strides,
                          std::shared_ptr<void> owner);

  // --- metadata ---------------------------------------------------------------
  bool defined() const { return static_cast<bool>(storage_); }
  const Shape& shape() const { return shape_; }
  const Shape& strides() const { return strides_; }
  int64_t offset() const { return offset_; }
  int64_t dim() const { return static_cast<int64_t>(shape_.size()); }
  int64_t size(int64_t axis) const;    // negative axes count from the end
  int64_t stride(int64_t axis) const;
  int64_t numel() const;
  bool is_contiguous() const;
  bool shares_storage(const Tensor& other) const { return storage_ && storage_ == other.storage_; }

  // --- element access -----------------------------------------------------------
  // Pointer to element (0, ..., 0). Index with strides() for non-contiguous tensors.
  float* data();
  const float* data() const;
  // Bounds-checked element access; throws std::invalid_argument on a bad index.
  float& at(std::initializer_list<int64_t> index);
  float at(std::initializer_list<int64_t> index) const;
  float item() const;  // numel() must be 1
  std::vector<float> to_vector() const;  // row-major copy

  // --- views (share storage) ----------------------------------------------------------
  // Reshape to a shape with the same numel; one dim may be -1. View when strides allow, else throws:
  Tensor view(const Shape& shape) const;
  // Like view, but copies when the data is not viewable (as torch.reshape).
  Tensor reshape(const Shape& shape) const;
  Tensor transpose(int64_t a, int64_t b) const;
  Tensor permute(const Shape& dims) const;
  // Elements [start, end) step `step` along `axis`; negative start/end count from the end, clamped like Python.
  Tensor slice(int64_t axis, int64_t start, int64_t end, int64_t step = 1) const;
  Tensor select(int64_t axis, int64_t index) const;  // drops `axis`
  Tensor unsqueeze(int64_t axis) const;
  Tensor squeeze(int64_t axis) const;  // that dim must be 1
  // Broadcast view (stride 0 on expanded dims); `shape` follows numpy broadcasting from this shape.
  Tensor expand(const Shape& shape) const;

  // --- copies ------------------------------------------------------------------------------
  Tensor contiguous() const;  // returns *this (shared) when already contiguous
  Tensor clone() const;       // always a fresh contiguous copy
  // Copies src (broadcast to this shape) into this tensor's elements.
  void copy_from(const Tensor& src);
  void fill(float value);

 private:
  std::shared_ptr<float> storage_;  // base of the allocation
  Shape shape_;
  Shape strides_;
  int64_t offset_ = 0;
};

// Calls f(linear_index, offset_in_storage_units) for every element of a strided layout, row-major order.
// Helper for ops that walk arbitrary strides; kernels should use contiguous fast paths.
template <typename F>
void for_each_offset(const Shape& shape, const Shape& strides, F&& f) {
  const int64_t rank = static_cast<int64_t>(shape.size());
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  if (n == 0) return;
  Shape idx(static_cast<size_t>(rank), 0);
  int64_t off = 0;
  for (int64_t i = 0; i < n; ++i) {
    f(i, off);
    for (int64_t d = rank - 1; d >= 0; --d) {
      if (++idx[d] < shape[d]) { off += strides[d]; break; }
      off -= strides[d] * (shape[d] - 1);
      idx[d] = 0;
    }
  }
}

}  // namespace qkv
