// Differentiable twins of qkv's ops on a Tape: each records one node whose backward calls the op's backward half.
// Fused ops (attention, layer_norm, GRU/LSTM cell step, cross-entropy) are single nodes; views stay views.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "qkv/core/rng.h"
#include "qkv/ops/positional/rope.h"
#include "qkv/ops/attention.h"
#include "qkv/ops/elementwise.h"
#include "qkv/ops/embedding.h"
#include "qkv/ops/autograd.h"
#include "qkv/core/precision.h"

namespace qkv::ad {

// Every function takes Vars (a Tensor converts to a constant Var) and returns a Var on the tape of its inputs;
// when no input needs a gradient nothing is recorded and the result is a constant. Shapes and errors are those
// of the underlying qkv op ("[matmul] ...").

// --- products ------------------------------------------------------------------------------------------------
// a: (..., M, K)  b: (..., K, N)  ->  (..., M, N); leading dims broadcast.
Var matmul(const Var& a, const Var& b);
// x: (..., in)  weight: (out, in)  bias: (out) or undefined  ->  (..., out). One sgemm forward; backward is one
// sgemm for dx and one accumulating straight into weight's gradient (beta = 1), plus column sums for the bias.
Var linear(const Var& x, const Var& weight, const Var& bias = {});
// The same at `precision`: kFloat32 is linear(x, weight, bias); kBFloat16 rounds x and the live weight to bf16 per
// call (the packed AVX512-BF16 product where the CPU has it, else the float32 product of the rounded operands;
// float32 accumulation and bias), and its backward runs at bf16 too: dx = bf16(dy)·bf16(W) and
// dW = bf16(dy)ᵀ·bf16(x) with float32 accumulation, the bias gradient float32 (as autocast's bf16 linear). kInt8
// is for inference (qkv::linear with a LinearWeight) and throws here.
Var linear(const Var& x, const Var& weight, const Var& bias, Precision precision);
// x rounded to bfloat16 (qkv::round_to_bf16); the gradient passes through unchanged, as autocast's casts do.
Var round_to_bf16(const Var& x);

// --- elementwise (numpy broadcasting; gradients summed back to each operand's shape) --------------------------
Var add(const Var& a, const Var& b);
Var sub(const Var& a, const Var& b);
Var mul(const Var& a, const Var& b);
Var scale(const Var& x, float s);  // x * s
Var relu(const Var& x);
Var gelu(const Var& x, GeluApprox approx = GeluApprox::kNone);
Var tanh(const Var& x);
Var sigmoid(const Var& x);
Var silu(const Var& x);  // x·sigmoid(x)

// --- reductions -----------------------------------------------------------------------------------------------
Var sum(const Var& x);   // -> scalar shape ()
Var mean(const Var& x);  // -> scalar shape (); numel must be > 0

// --- softmax and normalisation --------------------------------------------------------------------------------
Var softmax(const Var& x, int64_t axis = -1);
Var log_softmax(const Var& x, int64_t axis = -1);
// x: (..., E)  weight, bias: (E) or undefined  ->  (..., E). One node (saves mean and rstd).
Var layer_norm(const Var& x, const Var& weight, const Var& bias, float eps = 1e-5f);
// The post-LN epilogue, one node: layer_norm(x + (y + y_bias), weight, bias, eps), as qkv::add_layer_norm_.
// y: (..., E)  x: y's shape or undefined  y_bias, weight, bias: (E) or undefined. y is consumed: when nothing is
// recorded and y is contiguous, the result is written into y's buffer (qkv::add_layer_norm_, no new tensor), so
// pass a value nothing else reads (a fresh linear output). On a tape it saves the sum, mean and rstd; the
// backward is layer_norm's, the sum's gradient going to x, y and (summed over rows) y_bias.
Var add_layer_norm(Var&& y, const Var& x, const Var& y_bias, const Var& weight, const Var& bias, float eps = 1e-5f);
// The bias + GELU after a bias-less linear, one node: gelu(x + bias), the bias (F) broadcast over the rows of
// x (..., F); bias may be undefined. x is consumed as y above (qkv::add_bias_gelu_ in place when nothing is
// recorded). On a tape it saves x + bias; the backward is gelu's, summed over rows for the bias.
Var add_bias_gelu(Var&& x, const Var& bias, GeluApprox approx = GeluApprox::kNone);
// x: (..., E)  weight: (E) or undefined  ->  (..., E): qkv::rms_norm (gain 1 + weight when unit_offset, Gemma's).
// One node (saves rstd).
Var rms_norm(const Var& x, const Var& weight, float eps = 1e-6f, bool unit_offset = false);

// --- lookup and dropout ---------------------------------------------------------------------------------------
// weight: (V, E)  ids: shape S  ->  S + (E). Repeated ids add up in the gradient. Positions whose id equals
// padding_idx (in [-V, V), negative counts from the end) add nothing to the gradient, as torch.nn.Embedding.
Var embedding(const Var& weight, const Ids& ids, std::optional<int64_t> padding_idx = std::nullopt);
// Inverted dropout drawing from `rng`; identity (no node) when !training or p == 0. p in [0, 1).
Var dropout(const Var& x, float p, bool training, Rng& rng);

// --- attention ------------------------------------------------------------------------------------------------
// Extra differentiable inputs of attention() beyond AttentionOptions (whose mask, of any kind, and causal are
// constants that take no gradient).
struct AttentionExtras {
  Var bias;                   // additive score bias broadcastable to (batch..., Tq, Tk), added after the scaling
                              // (T5 relative bias); receives a gradient when it is not a constant
};
// q: (..., Tq, Dk)  k: (..., Tk, Dk)  v: (..., Tk, Dv)  ->  (batch..., Tq, Dv), as qkv::attention.
// Without dropout and without a differentiable bias it is one node over the fused kernel: the forward keeps
// the log-sum-exp and the backward is qkv::attention_backward (O(T) memory, never forms Tq x Tk).
// Otherwise (options.dropout_p > 0, or a bias that takes a gradient) it is composed on the tape:
// scores = q·kᵀ·scale (+ bias) (+ mask) -> softmax -> dropout (options.dropout_rng) -> ·v. The arguments are
// checked once (attention_check); the backward runs unchecked. Empty sequences follow options.allow_empty.
// A fully masked row gives 0 and zero gradient. options.return_weights / return_lse are ignored.
Var attention(const Var& q, const Var& k, const Var& v, const AttentionOptions& options = {},
              const AttentionExtras& extras = {});

// Packed variable-length attention, as qkv::attention_varlen (qkv/ops/attention_varlen.h): q (total_q, Hq, Dk),
// k (total_k, Hkv, Dk), v (total_k, Hkv, Dv) with B sequences along dim 0 (cu_seqlens_*: B + 1 offsets)
// -> (total_q, Hq, Dv). One node; the backward is attention_varlen_backward (no padded position computed).
Var attention_varlen(const Var& q, const Var& k, const Var& v, std::span<const int32_t> cu_seqlens_q,
                     std::span<const int32_t> cu_seqlens_k, int64_t max_seqlen_q, int64_t max_seqlen_k,
                     const AttentionOptions& options = {});

// Shaw et al. relative attention, as qkv::relative_attention (include/qkv/nn/positional/relative.h), with
// gradients for q, k, v and both tables. q: (..., Tq, D)  k: (..., Tk, D)  v: (..., Tk, Dv)
// rel_k: (2·clip+1, D)  rel_v: (2·clip+1, Dv) or undefined  ->  (..., Tq, Dv). Composed on the tape.
Var relative_attention(const Var& q, const Var& k, const Var& v, const Var& rel_k, const Var& rel_v, int64_t clip,
                       const AttentionOptions& options = {}, int64_t query_offset = 0);

// --- positional encodings -------------------------------------------------------------------------------------
// x: (..., T, E)  table: (max_len, E)  ->  x + table[offset : offset + T]   (learned absolute positions)
Var add_learned_positions(const Var& x, const Var& table, int64_t offset = 0);
// x: (..., T, E)  ->  x + PE[offset : offset + T] (sinusoidal, no parameters).
Var add_sinusoidal(const Var& x, int64_t offset = 0, float base = 10000.0f);
// x: (..., T, D)  ->  rope_apply(x, ...). Backward is the inverse rotation (same angles).
Var rope(const Var& x, int64_t offset = 0, float base = 10000.0f, RopeVariant variant = RopeVariant::kHalfSplit);
// Same, row t at positions[t] (T entries, each >= 0): the global positions of a shard under context parallelism.
Var rope(const Var& x, const std::vector<int64_t>& positions, float base = 10000.0f,
         RopeVariant variant = RopeVariant::kHalfSplit);
// Same, with the angles of a table (rope_table; T == table->rows, D == table->dim), kept for the backward: one
// table rotates the queries and keys of every layer of a forward.
Var rope(const Var& x, std::shared_ptr<const RopeTable> table, RopeVariant variant = RopeVariant::kHalfSplit);
// table: (num_buckets, H)  ->  (1, H, Tq, Tk) as qkv::t5_relative_bias; the gradient scatter-adds into table.
Var t5_bias(const Var& table, int64_t Tq, int64_t Tk, bool bidirectional, int64_t max_distance = 128,
            int64_t query_offset = 0);

// --- shapes (views; the backward is the inverse view, a slice's backward adds into a slice of the gradient) ---
Var reshape(const Var& x, const Shape& shape);  // view when possible, else a copy (torch.reshape)
Var transpose(const Var& x, int64_t a, int64_t b);
Var permute(const Var& x, const Shape& dims);
Var select(const Var& x, int64_t axis, int64_t index);
Var slice(const Var& x, int64_t axis, int64_t start, int64_t end, int64_t step = 1);
Var unsqueeze(const Var& x, int64_t axis);
Var squeeze(const Var& x, int64_t axis);
Var expand(const Var& x, const Shape& shape);
Var contiguous(const Var& x);
Var concat(const std::vector<Var>& xs, int64_t axis);
Var stack(const std::vector<Var>& xs, int64_t axis);
std::vector<Var> split(const Var& x, const std::vector<int64_t>& sizes, int64_t axis);
// The same value as a constant: no gradient flows back through it.
inline Var detach(const Var& x) { return Var(x.value); }

}  // namespace qkv::ad
