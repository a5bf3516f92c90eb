// Private helpers of the differentiable ops (not installed): id checks and the fast sum_to of their backwards.
#pragma once

#include <initializer_list>
#include <utility>

#include "qkv/core/error.h"
#include "qkv/kernels/grad.h"
#include "qkv/ops/elementwise.h"
#include "qkv/ops/embedding.h"
#include "qkv/ops/autograd.h"

namespace qkv::ad::detail {


// tape_of, record and check_defined: qkv/ops/autograd.h (op authors of other layers use them too).

// Token ids of a batch: a non-empty (B, T) whose data holds B·T values.
inline void check_ids(const Ids& ids, const char* op, const char* name) {
  QKV_CHECK_ARG(ids.shape.size() == 2 && ids.shape[0] > 0 && ids.shape[1] > 0, "[", op, "] ", name, " ids ",
                str(ids.shape), " must be a non-empty (B, T)");
  QKV_CHECK_ARG(static_cast<int64_t>(ids.data.size()) == ids.shape[0] * ids.shape[1], "[", op, "] ", name,
                " ids hold ", ids.data.size(), " values for shape ", str(ids.shape));
}

// qkv::sum_to(g, shape), with the common case (shape = g's trailing dims, or those with leading 1s) done as one
// sgemv over contiguous rows (kernels::sum_to_trailing). Returns g itself when the shapes are equal.
inline Tensor sum_to(const Tensor& g, const Shape& shape) {
  Tensor fast = kernels::sum_to_trailing(g, shape);
  return fast.defined() ? fast : qkv::sum_to(g, shape);
}

}  // namespace qkv::ad::detail
