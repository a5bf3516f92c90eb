// nn::check_finite (qkv/nn/serialize.h): its own unit, so the readers that check weights from a file (and their
// fuzzers) do not link Module and the ops behind its precision.
#include <cmath>

#include "qkv/core/error.h"
#include "qkv/nn/serialize.h"

namespace qkv::nn {

void check_finite(const StateDict& state, const std::string& prefix) {
  for (const auto& [name, t] : state) {
    if (!t.defined()) continue;
    const Tensor c = t.contiguous();
    const float* p = c.data();
    for (int64_t i = 0, n = c.numel(); i < n; ++i)
      QKV_CHECK_ARG(std::isfinite(p[i]), prefix, name, " holds a non-finite value (", p[i],
                    ") at flat index ", i, " of shape ", str(t.shape()));
  }
}

}  // namespace qkv::nn
