// Embedding lookup: rows of a table picked by integer ids.
#pragma once

#include <cstdint>
#include <vector>

#include "qkv/core/ids.h"
#include "qkv/core/tensor.h"

namespace qkv {


// weight: (V, E)  ids: shape S with values in [0, V)  ->  S + (E)
Tensor embedding(const Tensor& weight, const Ids& ids);

// Accumulates: dweight[ids[i]] += dy[i] (repeated ids add up). dweight: (V, E), any strides but not expanded;
// dy: ids.shape + (E). The caller zeroes dweight once per step.
void embedding_backward(Tensor& dweight, const Ids& ids, const Tensor& dy);

}  // namespace qkv
