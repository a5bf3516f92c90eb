// Fused cross-entropy: per-row log-sum-exp in double, loss terms summed in row order (deterministic for any
// thread count), backward (softmax - smoothed one-hot) · upstream / count without materialising log-probs.
#include "qkv/train/loss.h"

#include <cmath>
#include <memory>
#include <span>

#include "qkv/core/error.h"
#include "qkv/ops/autograd.h"

namespace qkv::train {
using ad::Parameter;
using ad::ParameterSet;
using ad::Tape;
using ad::Var;


int64_t count_targets(const std::vector<int64_t>& targets, int64_t ignore_index) {
  int64_t n = 0;
  for (int64_t t : targets) n += t != ignore_index;
  return n;
}

Var cross_entropy(const Var& logits, const std::vector<int64_t>& targets, const CrossEntropyOptions& o) {
  ad::detail::check_defined(logits, "cross_entropy", "logits");
  QKV_CHECK_ARG(logits.dim() >= 2 && logits.size(-1) > 0, "[cross_entropy] logits ", str(logits.shape()),
                " must be (N, V) or (..., V) with V > 0");
  QKV_CHECK_ARG(o.label_smoothing >= 0.0f && o.label_smoothing <= 1.0f,
                "[cross_entropy] label_smoothing must be in [0, 1], got ", o.label_smoothing);
  const int64_t V = logits.size(-1), N = logits.numel() / V;
  QKV_CHECK_ARG(static_cast<int64_t>(targets.size()) == N, "[cross_entropy] ", targets.size(),
                " targets for logits ", str(logits.shape()), " (N = ", N, ")");
  for (int64_t t : targets)
    QKV_CHECK_ARG(t == o.ignore_index || (t >= 0 && t < V), "[cross_entropy] target ", t,
                  " is outside [0, ", V, ") and is not ignore_index ", o.ignore_index);

  const Tensor x = logits.value.contiguous();
  const float* px = x.data();
  auto lse = std::make_shared<std::vector<double>>(static_cast<size_t>(N));
  std::vector<double> row_loss(static_cast<size_t>(N), 0.0);
  const double eps = o.label_smoothing;
#pragma omp parallel for schedule(static) if (N * V >= (int64_t{1} << 16))
  for (int64_t n = 0; n < N; ++n) {
    const int64_t t = targets[static_cast<size_t>(n)];
    if (t == o.ignore_index) continue;
    const float* row = px + n * V;
    double m = row[0];
    for (int64_t c = 1; c < V; ++c) m = std::max(m, static_cast<double>(row[c]));
    double s = 0.0, total = 0.0;
    for (int64_t c = 0; c < V; ++c) {
      s += std::exp(row[c] - m);
      total += row[c];
    }
    const double l = m + std::log(s);
    (*lse)[static_cast<size_t>(n)] = l;
    const double nll = l - row[t];
    const double smooth = V * l - total;  // -Σ_c log p_c
    row_loss[static_cast<size_t>(n)] = (1.0 - eps) * nll + (eps / V) * smooth;
  }
  const int64_t count = count_targets(targets, o.ignore_index);
  double loss = 0.0;
  for (double v : row_loss) loss += v;  // row order: the same bits for any thread count
  const double divisor = o.reduction == Reduction::kMean ? static_cast<double>(count) : 1.0;
  loss = count == 0 ? 0.0 : loss / divisor;

  auto saved_targets = std::make_shared<const std::vector<int64_t>>(targets);
  return ad::detail::record(Tensor::scalar(static_cast<float>(loss)), {&logits},
                        [logits, x, lse, saved_targets, o, N, V, divisor, count](Tape& t, std::span<const Tensor> d) {
    const double up = d[0].item();
    Tensor g = Tensor::empty({N, V});
    float* pg = g.data();
    const float* px = x.data();
    const double eps = o.label_smoothing;
    const double w = count == 0 ? 0.0 : up / divisor;
#pragma omp parallel for schedule(static) if (N * V >= (int64_t{1} << 16))
    for (int64_t n = 0; n < N; ++n) {
      const int64_t tn = (*saved_targets)[static_cast<size_t>(n)];
      float* gr = pg + n * V;
      if (tn == o.ignore_index || w == 0.0) {
        std::fill(gr, gr + V, 0.0f);
        continue;
      }
      const float* row = px + n * V;
      const double l = (*lse)[static_cast<size_t>(n)];
      for (int64_t c = 0; c < V; ++c) {
        const double p = std::exp(row[c] - l);
        const double target = (c == tn ? 1.0 - eps : 0.0) + eps / V;
        gr[c] = static_cast<float>(w * (p - target));
      }
    }
    t.accumulate_owned(logits, g.view(logits.shape()));
  });
}

}  // namespace qkv::train
