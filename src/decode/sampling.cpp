// Token sampling: temperature, top-k, top-p, seeded.
#include "qkv/decode/sampling.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "qkv/core/error.h"

namespace qkv::decode {

void check_sampling(const SamplingOptions& o) {
  QKV_CHECK_ARG(o.temperature >= 0.0f && std::isfinite(o.temperature),
                "[sampling] temperature must be finite and >= 0, got ", o.temperature);
  QKV_CHECK_ARG(o.top_k >= 0, "[sampling] top_k must be >= 0, got ", o.top_k);
  QKV_CHECK_ARG(o.top_p > 0.0f && o.top_p <= 1.0f, "[sampling] top_p must be in (0, 1], got ", o.top_p);
}

int64_t sample_token(const float* logits, int64_t vocab, const SamplingOptions& o, Rng& rng) {
  check_sampling(o);
  QKV_CHECK_ARG(vocab >= 1, "[sampling] vocab must be >= 1, got ", vocab);
  for (int64_t i = 0; i < vocab; ++i)
    QKV_CHECK_ARG(!std::isnan(logits[i]), "[sampling] logit ", i, " is NaN");
  if (o.temperature == 0.0f) return std::max_element(logits, logits + vocab) - logits;
  // Candidates by decreasing logit (lower id first on ties), cut to top_k.
  std::vector<int64_t> order(static_cast<size_t>(vocab));
  std::iota(order.begin(), order.end(), int64_t{0});
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return logits[a] > logits[b]; });
  if (o.top_k > 0 && o.top_k < vocab) order.resize(static_cast<size_t>(o.top_k));
  // Softmax of logits / temperature over the candidates, in double.
  const double top = static_cast<double>(logits[order[0]]) / o.temperature;
  std::vector<double> p(order.size());
  double total = 0.0;
  for (size_t i = 0; i < order.size(); ++i) total += p[i] = std::exp(static_cast<double>(logits[order[i]]) / o.temperature - top);
  for (double& x : p) x /= total;
  // Nucleus: the shortest prefix whose mass reaches top_p (at least one token).
  size_t keep = p.size();
  if (o.top_p < 1.0f) {
    double mass = 0.0;
    for (size_t i = 0; i < p.size(); ++i) {
      mass += p[i];
      if (mass >= o.top_p) {
        keep = i + 1;
        break;
      }
    }
  }
  double kept = 0.0;
  for (size_t i = 0; i < keep; ++i) kept += p[i];
  const double u = static_cast<double>(rng.uniform()) * kept;
  double acc = 0.0;
  for (size_t i = 0; i < keep; ++i) {
    acc += p[i];
    if (u < acc) return order[i];
  }
  return order[keep - 1];
}

}  // namespace qkv::decode
