// Attention in 40 lines: the article's formula (2), Attention(Q, K, V) = softmax(Q·Kᵀ / √d_k)·V, one query row at
// a time, in float64, with no BLAS, no threads and no intrinsics. For query i and key j:
//   s_ij = scale · Σ_c q_ic·k_jc                  the score (scale = 1/√d_k unless options.scale says otherwise)
//   s_ij = -∞ where a mask, causality or the window forbids the pair; + m_ij for an additive mask
//   w_ij = exp(s_ij - max_j s_ij) / Σ_j exp(...)  softmax over the keys (minus the max: exp never overflows)
//   out_i = Σ_j w_ij · v_j
// A row where every key is forbidden gives out 0 and weights 0 (never NaN). The fast paths: kernels/attention_*.
#include "qkv/ops/attention_plain.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "qkv/ops/attention.h"

namespace qkv {
namespace {

// The flat index of element (idx..., r, c) of a row-major array of `shape` that broadcasts (NumPy rules, right
// aligned) to (batch..., R, C): a dim of size 1 is read at index 0.
size_t at(const Shape& shape, const Shape& idx, int64_t r, int64_t c) {
  size_t off = 0;
  for (size_t d = 0, lead = idx.size() + 2 - shape.size(); d < shape.size(); ++d) {
    const size_t e = lead + d;  // the dim of (idx..., r, c) that dim d of `shape` lines up with
    const int64_t i = e < idx.size() ? idx[e] : e == idx.size() ? r : c;
    off = off * static_cast<size_t>(shape[d]) + static_cast<size_t>(shape[d] == 1 ? 0 : i);
  }
  return off;
}

// Query i may see key j: causal (top-left or bottom-right) and the sliding window, centred bottom-right.
bool allowed(const AttentionOptions& o, int64_t i, int64_t j, int64_t tq, int64_t tk) {
  if (o.causal == Causal::kTopLeft && j > i) return false;
  if (o.causal == Causal::kBottomRight && j > i + tk - tq) return false;
  if (o.window_left >= 0 && j < i + tk - tq - o.window_left) return false;
  return !(o.window_right >= 0 && j > i + tk - tq + o.window_right);
}

// A float32 tensor of `shape` that owns one element: what attention_check needs to check shapes without data.
Tensor shaped(const Shape& shape) { return Tensor::zeros({1}).reshape(Shape(shape.size(), 1)).expand(shape); }

}  // namespace

PlainAttention attention_plain(const Array64& q, const Array64& k, const Array64& v, const Array64* mask,
                               const AttentionOptions& options) {
  AttentionOptions checked = options;
  checked.mask = mask ? shaped(mask->shape) : Tensor();
  const Shape batch = attention_check(shaped(q.shape), shaped(k.shape), shaped(v.shape), checked, "attention_plain");
  const AttentionOptions& o = options;
  const int64_t tq = q.shape.end()[-2], dk = q.shape.back(), tk = k.shape.end()[-2], dv = v.shape.back();
  const int64_t nb = shape_numel(batch), group = o.enable_gqa ? batch.back() / k.shape.end()[-3] : 1;
  const double scale = o.scale ? double{*o.scale} : 1.0 / std::sqrt(static_cast<double>(dk));
  const double inf = std::numeric_limits<double>::infinity();
  PlainAttention r{batch, std::vector<double>(nb * tq * dv), std::vector<double>(nb * tq * tk),
                   std::vector<double>(nb * tq, -inf)};
  Shape idx(batch.size()), kv_idx;  // the batch multi-index; for k and v (GQA: query head h reads kv head h / group)
  std::vector<double> s(tk);
  for (int64_t b = 0; b < nb; ++b) {
    for (int64_t d = static_cast<int64_t>(batch.size()) - 1, rem = b; d >= 0; rem /= batch[d], --d)
      idx[d] = rem % batch[d];
    kv_idx = idx;
    if (group > 1) kv_idx.back() /= group;
    for (int64_t i = 0; i < tq; ++i) {
      const double* qi = &q.data[at(q.shape, idx, i, 0)];  // query row i
      double mx = -inf;
      for (int64_t j = 0; j < tk; ++j) {
        const double* kj = &k.data[at(k.shape, kv_idx, j, 0)];  // key row j
        double dot = 0.0;
        for (int64_t c = 0; c < dk; ++c) dot += qi[c] * kj[c];
        s[j] = scale * dot;
        if (o.softcap > 0.0f) s[j] = o.softcap * std::tanh(s[j] / o.softcap);  // Gemma 2's soft cap
        if (!allowed(o, i, j, tq, tk)) s[j] = -inf;
        if (mask) {
          const double m = mask->data[at(mask->shape, idx, i, j)];
          if (o.mask_kind == MaskKind::kKeep ? m == 0.0 : o.mask_kind == MaskKind::kBlock && m != 0.0) s[j] = -inf;
          if (o.mask_kind == MaskKind::kAdditive) s[j] += m;
        }
        mx = std::max(mx, s[j]);
      }
      if (mx == -inf) continue;  // every key forbidden: out 0, weights 0, lse -inf
      double sum = 0.0;
      for (int64_t j = 0; j < tk; ++j) sum += std::exp(s[j] - mx);
      const int64_t row = b * tq + i;
      r.lse[row] = mx + std::log(sum);
      for (int64_t j = 0; j < tk; ++j) {
        const double w = std::exp(s[j] - mx) / sum, *vj = &v.data[at(v.shape, kv_idx, j, 0)];  // value row j
        r.weights[row * tk + j] = w;
        for (int64_t c = 0; c < dv; ++c) r.out[row * dv + c] += w * vj[c];
      }
    }
  }
  return r;
}

Array64 to_array64(const Tensor& t) {
  const std::vector<float> x = t.to_vector();
  return {t.shape(), std::vector<double>(x.begin(), x.end())};
}

PlainAttention attention_plain(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& options) {
  const Array64 m = options.mask.defined() ? to_array64(options.mask) : Array64{};
  return attention_plain(to_array64(q), to_array64(k), to_array64(v), options.mask.defined() ? &m : nullptr,
                         options);
}

}  // namespace qkv
