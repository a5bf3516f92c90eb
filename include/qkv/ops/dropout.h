// Dropout (inverted scaling). Forward returns the keep-mask its backward needs; eval mode is the identity.
#pragma once

#include "qkv/core/rng.h"
#include "qkv/core/tensor.h"

namespace qkv {

struct DropoutResult {
  Tensor y;     // x * mask / (1 - p)
  Tensor mask;  // 1 kept / 0 dropped, same shape as x; undefined when not training or p == 0
};

// p in [0, 1). When !training or p == 0, returns x itself (shared). Draws only from `rng`.
DropoutResult dropout(const Tensor& x, float p, bool training, Rng& rng);

// dy: x's shape, mask and p from the forward  ->  dx = dy * mask / (1 - p); dy itself when mask is undefined.
Tensor dropout_backward(const Tensor& dy, const Tensor& mask, float p);

}  // namespace qkv
