// Shape and stride arithmetic shared by Tensor and every op: printing, broadcasting, checked products.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "qkv/core/small_vector.h"

namespace qkv {

// Dims or strides, in elements. Up to 6 dims live inline (no heap allocation); more go to the heap.
using Shape = SmallVector<int64_t, 6>;

// "(2, 10, 64)"; "()" for a scalar.
std::string str(const Shape& shape);

// Product of dims; throws std::invalid_argument on a negative dim or int64 overflow.
int64_t shape_numel(const Shape& shape);

// Row-major strides (in elements) of a contiguous tensor of this shape.
Shape contiguous_strides(const Shape& shape);

// Normalises a possibly negative axis for a tensor of rank `rank`; `op` names the caller in the error.
int64_t normalize_axis(int64_t axis, int64_t rank, const char* op);

// NumPy broadcasting of two shapes; throws "[op] shapes a and b do not broadcast".
Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op);

// True when `from` broadcasts to exactly `to` (numpy rules, `to` unchanged).
bool broadcastable_to(const Shape& from, const Shape& to);

}  // namespace qkv
