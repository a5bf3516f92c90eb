// Ring attention (context parallelism): the N ranks of a communicator each hold T/N of one sequence; K/V blocks
// travel around the ring (rank r sends to r+1, receives from r-1) with non-blocking messages that overlap the
// local fused-attention block, and the partial (out, lse) are merged exactly. The backward re-runs the fused
// backward per block against the merged (out, lse), and the dK/dV of each block travel on around the ring back to
// the rank that owns it. Exact against one process's attention up to float rounding (the merge's and the kernels').
//
// Layout of the sequence axis (ring_shard): contiguous blocks [r·T/N, (r+1)·T/N) when not causal. Causal uses the
// zigzag layout: T is cut into 2N equal chunks and rank r holds chunks r and 2N-1-r, so every rank attends to the
// same number of (query, key) pairs (no rank idles on a fully masked block).
#pragma once

#include <cstdint>
#include <vector>

#include "qkv/core/attention_types.h"
#include "qkv/core/tensor.h"
#include "qkv/parallel/comm.h"
#include "qkv/ops/autograd.h"

namespace qkv::parallel {

// The rows of x along `axis` (global length T, divisible by `size`, and by 2·size when causal) that rank `rank`
// holds, as a contiguous copy in the layout above.
Tensor ring_shard(const Tensor& x, int64_t axis, int rank, int size, Causal causal);
// Global positions of those rows, in order.
std::vector<int64_t> ring_positions(int64_t t, int rank, int size, Causal causal);

// Local shards on every rank: q: (..., Tq, Dk)  k: (..., Tk, Dk)  v: (..., Tk, Dv)  (the same shapes on every
// rank; leading dims broadcast as in attention())  ->  out: (batch..., Tq, Dv), lse: (batch..., Tq) (always
// returned: the backward needs it). options:
//   causal: kNone, or either alignment (equal global lengths: Tq == Tk, even, in the zigzag layout);
//   mask: a per-key mask of this rank's keys, broadcastable to (batch..., 1, Tk) with its dim -2 equal to 1
//         (key padding, a per-key additive bias), any MaskKind; it travels with its keys. A (Tq, Tk) mask
//         does not shard along both axes and is refused;
//   scale, softcap and enable_gqa (k, v with Hkv heads dividing q's Hq; never copied) as in attention();
//   return_weights must be false, and a sliding window (window_left / window_right) is refused.
AttentionResult ring_attention(const Tensor& q, const Tensor& k, const Tensor& v, Communicator& comm,
                               const AttentionOptions& options = {});

// The backward of ring_attention: q, k, v, options as there; out, lse its results; d_out: (batch..., Tq, Dv).
//   ->  dq, dk, dv of this rank's shards (shapes of q, k, v).
AttentionGrads ring_attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                                       const Tensor& lse, const Tensor& d_out, Communicator& comm,
                                       const AttentionOptions& options = {});

// The differentiable form: one node on the tape of q, k, v (a constant when none needs a gradient) whose backward
// is ring_attention_backward. Both directions are collective: every rank must record the same graph, so that the
// tape runs the rings of its backward in the same order on every rank.
ad::Var ring_attention(const ad::Var& q, const ad::Var& k, const ad::Var& v, Communicator& comm,
                       const AttentionOptions& options = {});

}  // namespace qkv::parallel
