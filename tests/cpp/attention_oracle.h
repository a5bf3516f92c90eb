// A float64 scaled-dot-product attention written the slow, obvious way: the oracle of the attention tests.
// Plain loops over broadcast indices; shares no code with the library kernels.
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "qkv/core/shape.h"
#include "qkv/core/tensor.h"
#include "qkv/ops/attention.h"

namespace qkv::testing {

// A row-major float64 array.
struct DTensor {
  Shape shape;
  std::vector<double> data;
};

inline DTensor to_dtensor(const Tensor& t) {
  const std::vector<float> v = t.to_vector();
  return {t.shape(), std::vector<double>(v.begin(), v.end())};
}

// Flat index of element (batch_idx..., r, c) of a row-major array of `shape`, which broadcasts (numpy rules,
// right-aligned; any rank, even 0) to (batch..., R, C).
inline size_t bcast_index(const Shape& shape, const Shape& batch_idx, int64_t r, int64_t c) {
  Shape full = batch_idx;
  full.push_back(r);
  full.push_back(c);
  const size_t lead = full.size() - shape.size();
  size_t off = 0;
  for (size_t d = 0; d < shape.size(); ++d)
    off = off * static_cast<size_t>(shape[d]) + static_cast<size_t>(shape[d] == 1 ? 0 : full[lead + d]);
  return off;
}

inline Shape lead_of(const Shape& s) { return Shape(s.begin(), s.end() - 2); }

struct OracleResult {
  Shape batch;
  std::vector<double> out;      // (batch..., Tq, Dv)
  std::vector<double> weights;  // (batch..., Tq, Tk)
  std::vector<double> lse;      // (batch..., Tq)
};

inline bool oracle_causal_allows(Causal causal, int64_t i, int64_t j, int64_t tq, int64_t tk) {
  switch (causal) {
    case Causal::kNone: return true;
    case Causal::kTopLeft: return j <= i;
    case Causal::kBottomRight: return j <= i + tk - tq;
  }
  return true;
}

// mask: nullptr for none; a mask whose shape broadcasts to (batch..., Tq, Tk). scale: the effective scale.
inline OracleResult attention_oracle(const DTensor& q, const DTensor& k, const DTensor& v, const DTensor* mask,
                                     MaskKind kind, Causal causal, double scale) {
  const double inf = std::numeric_limits<double>::infinity();
  OracleResult r;
  r.batch = broadcast_shapes(broadcast_shapes(lead_of(q.shape), lead_of(k.shape), "oracle"), lead_of(v.shape),
                             "oracle");
  const int64_t tq = q.shape[q.shape.size() - 2], dk = q.shape.back();
  const int64_t tk = k.shape[k.shape.size() - 2], dv = v.shape.back();
  const int64_t nb = shape_numel(r.batch);
  r.out.assign(static_cast<size_t>(nb * tq * dv), 0.0);
  r.weights.assign(static_cast<size_t>(nb * tq * tk), 0.0);
  r.lse.assign(static_cast<size_t>(nb * tq), -inf);
  Shape idx(r.batch.size(), 0);
  std::vector<double> s(static_cast<size_t>(tk));
  for (int64_t b = 0; b < nb; ++b) {
    // batch multi-index of flat b
    int64_t rem = b;
    for (int64_t d = static_cast<int64_t>(r.batch.size()) - 1; d >= 0; --d) {
      idx[d] = rem % r.batch[d];
      rem /= r.batch[d];
    }
    for (int64_t i = 0; i < tq; ++i) {
      double mx = -inf;
      for (int64_t j = 0; j < tk; ++j) {
        double dot = 0.0;
        for (int64_t c = 0; c < dk; ++c)
          dot += q.data[bcast_index(q.shape, idx, i, c)] * k.data[bcast_index(k.shape, idx, j, c)];
        double sj = scale * dot;
        if (!oracle_causal_allows(causal, i, j, tq, tk)) sj = -inf;
        if (mask) {
          const double m = mask->data[bcast_index(mask->shape, idx, i, j)];
          if (kind == MaskKind::kKeep && m == 0.0) sj = -inf;
          if (kind == MaskKind::kBlock && m != 0.0) sj = -inf;
          if (kind == MaskKind::kAdditive) sj += m;
        }
        s[j] = sj;
        mx = std::max(mx, sj);
      }
      if (mx == -inf) continue;  // fully masked: out 0, weights 0, lse -inf
      double sum = 0.0;
      for (int64_t j = 0; j < tk; ++j) sum += std::exp(s[j] - mx);
      const size_t row = static_cast<size_t>(b * tq + i);
      r.lse[row] = mx + std::log(sum);
      for (int64_t j = 0; j < tk; ++j) {
        const double w = std::exp(s[j] - mx) / sum;
        r.weights[row * tk + j] = w;
        for (int64_t c = 0; c < dv; ++c) r.out[row * dv + c] += w * v.data[bcast_index(v.shape, idx, j, c)];
      }
    }
  }
  return r;
}

inline OracleResult attention_oracle(const Tensor& q, const Tensor& k, const Tensor& v,
                                     const AttentionOptions& o) {
  const DTensor dm = o.mask.defined() ? to_dtensor(o.mask) : DTensor{};
  const double scale = o.scale ? static_cast<double>(*o.scale) : 1.0 / std::sqrt(static_cast<double>(q.size(-1)));
  return attention_oracle(to_dtensor(q), to_dtensor(k), to_dtensor(v), o.mask.defined() ? &dm : nullptr,
                          o.mask_kind, o.causal, scale);
}

}  // namespace qkv::testing
