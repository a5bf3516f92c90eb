// Cross-entropy over logits as torch.nn.functional.cross_entropy: class-index targets, ignore_index (padding) and
// label smoothing, mean over the non-ignored targets. One fused tape node (log-softmax, loss and its gradient).
#pragma once

#include <cstdint>
#include <vector>

#include "qkv/ops/autograd.h"

namespace qkv::train {

enum class Reduction {
  kMean,  // sum over non-ignored targets / their count (PyTorch's default)
  kSum,
};

struct CrossEntropyOptions {
  int64_t ignore_index = -100;   // targets equal to this contribute nothing (PyTorch's default -100)
  float label_smoothing = 0.0f;  // ε in [0, 1]: target distribution (1 - ε)·onehot + ε/V
  Reduction reduction = Reduction::kMean;
};

// logits: (N, V), or (..., V) read as (N, V) with N the product of the leading dims; targets: N class ids, each in
// [0, V) or equal to ignore_index  ->  scalar loss, shape ().
//   loss_n = (1 - ε)·(-log p_n[t_n]) + (ε / V)·Σ_c (-log p_n[c])     p_n = softmax(logits_n)
// With kMean the sum over non-ignored n is divided by their count. When every target is ignored the mean is 0 with
// zero gradient (PyTorch returns NaN there). Accumulates in double; the gradient is (p - target distribution) / count.
ad::Var cross_entropy(const ad::Var& logits, const std::vector<int64_t>& targets, const CrossEntropyOptions& options = {});

// Number of targets that are not ignore_index (the divisor of kMean).
int64_t count_targets(const std::vector<int64_t>& targets, int64_t ignore_index = -100);

}  // namespace qkv::train
