// Reference attention kernels: scores -> mask -> softmax -> weights·v with BLAS, materialising the weights.
// The plain twin of the fused kernel and the oracle for it; inputs are validated by qkv::attention_check first.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "qkv/core/attention_types.h"

namespace qkv::kernels {

// Exclusive end of the keys query row i may see under `causal` (keys [0, end)); Tk when causal is kNone.
// kTopLeft: j <= i.  kBottomRight: j <= i + Tk - Tq.  The result is clamped to [0, Tk]; 0 = fully masked row.
inline int64_t causal_key_end(Causal causal, int64_t i, int64_t tq, int64_t tk) {
  int64_t end = tk;
  if (causal == Causal::kTopLeft) end = i + 1;
  if (causal == Causal::kBottomRight) end = i + 1 + (tk - tq);
  return std::clamp<int64_t>(end, 0, tk);
}

// Keys [begin, end) query row i may see under causal and the sliding window of `o` (begin == end: none).
// Both bounds are non-decreasing in i.
struct KeyRange {
  int64_t begin, end;
};
inline KeyRange visible_keys(const AttentionOptions& o, int64_t i, int64_t tq, int64_t tk) {
  int64_t end = causal_key_end(o.causal, i, tq, tk), begin = 0;
  const int64_t diag = i + tk - tq;  // the window is centred on the bottom-right diagonal
  // A side wider than tq + tk is unbounded; capping it keeps the sums below from overflowing.
  if (o.window_right >= 0) end = std::min(end, std::clamp<int64_t>(diag + std::min(o.window_right, tq + tk) + 1, 0, tk));
  if (o.window_left >= 0) begin = std::clamp<int64_t>(diag - std::min(o.window_left, tq + tk), 0, tk);
  return {begin, std::max(begin, end)};
}

// Query heads per kv head: Hq / Hkv under options.enable_gqa (batch's last dim is Hq), else 1.
inline int64_t gqa_group(const AttentionOptions& o, const Tensor& kv, const Shape& batch) {
  return o.enable_gqa ? batch.back() / kv.size(-3) : 1;
}

// Per flat index of `batch`, the storage offset of t's trailing (R, C) matrix. t's leading dims broadcast to
// `batch`, except that with group > 1 (GQA) t's head dim (-3) is batch.back() / group and batch head h reads
// t's head h / group.
inline std::vector<int64_t> matrix_offsets(const Tensor& t, const Shape& batch, int64_t group) {
  Shape tb = batch;
  if (group > 1) tb.back() /= group;
  Shape full = tb;
  full.push_back(t.size(-2));
  full.push_back(t.size(-1));
  const Tensor e = t.expand(full);
  const Shape strides(e.strides().begin(), e.strides().begin() + static_cast<int64_t>(tb.size()));
  std::vector<int64_t> offs(static_cast<size_t>(shape_numel(tb)));
  for_each_offset(tb, strides, [&](int64_t i, int64_t off) { offs[static_cast<size_t>(i)] = off; });
  if (group == 1) return offs;
  const int64_t hq = batch.back(), hkv = tb.back();
  std::vector<int64_t> mapped(static_cast<size_t>(shape_numel(batch)));
  for (size_t i = 0; i < mapped.size(); ++i) {
    const int64_t b = static_cast<int64_t>(i);
    mapped[i] = offs[static_cast<size_t>((b / hq) * hkv + (b % hq) / group)];
  }
  return mapped;
}

// q: (..., Tq, Dk)  k: (..., Tk, Dk)  v: (..., Tk, Dv)  ->  out: (batch..., Tq, Dv)
// weights (batch..., Tq, Tk) when options.return_weights, lse (batch..., Tq) when options.return_lse.
// `batch` is attention_check's broadcast batch shape, `scale` the effective scale. Any strides.
AttentionResult attention_reference_forward(const Tensor& q, const Tensor& k, const Tensor& v,
                                            const AttentionOptions& options, const Shape& batch,
                                            float scale);

// q, k, v as above; out, d_out: (batch..., Tq, Dv); lse: (batch..., Tq).
// out and lse may be undefined: they are then recomputed. -> dq, dk, dv with the shapes of q, k, v
// (summed over the batch axes each one was broadcast along).
AttentionGrads attention_reference_backward(const Tensor& q, const Tensor& k, const Tensor& v,
                                            const Tensor& out, const Tensor& lse, const Tensor& d_out,
                                            const AttentionOptions& options, const Shape& batch,
                                            float scale);

}  // namespace qkv::kernels
