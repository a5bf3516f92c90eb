// nn::MultiheadAttention: torch.nn.MultiheadAttention (batch_first=True) with the same parameter names and packing.
// Heads are split as views (B, T, E) -> (B, T, H, D) -> (B, H, T, D) and handed to the attention core (nn::attend,
// qkv/nn/attention_core.h) without a copy.
#pragma once

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "qkv/core/rng.h"
#include "qkv/core/tensor.h"
#include "qkv/nn/context.h"
#include "qkv/nn/kv_cache.h"
#include "qkv/nn/linear.h"
#include "qkv/nn/module.h"
#include "qkv/ops/attention.h"

namespace qkv::nn {

// Per-call options of MultiheadAttention::forward. Every mask states its kind explicitly; nothing is guessed from
// values. Bool masks are float tensors whose nonzero entries mean "true".
struct MhaForwardOptions {
  // (B, Tk) [(Tk) for unbatched input]. Default kind kBlock: nonzero = that key is padding and is ignored
  // (PyTorch's bool convention). kKeep (nonzero = attend) and kAdditive (added to the scores) are also accepted.
  Tensor key_padding_mask;
  MaskKind key_padding_mask_kind = MaskKind::kBlock;
  // (Tq, Tk) shared by every batch and head, or (B*H, Tq, Tk) [(H, Tq, Tk) unbatched] with row b*H + h.
  // Default kind kBlock: nonzero = the pair is NOT allowed (PyTorch MHA's bool convention); kAdditive for a float
  // mask (-inf blocks); kKeep for SDPA's convention.
  Tensor attn_mask;
  MaskKind attn_mask_kind = MaskKind::kBlock;
  // Extra additive score bias broadcastable to (B, H, Tq, Tk) (T5 relative bias, ALiBi); added after the
  // 1/sqrt(D) scaling, like a float attn_mask. Not a PyTorch MHA argument.
  Tensor attn_bias;
  // Applies a top-left causal mask (query i sees keys j <= i), combined with the masks above. PyTorch treats
  // is_causal only as a hint that attn_mask already is causal; applying it for real gives the same result then.
  bool is_causal = false;
  bool need_weights = true;           // PyTorch's default
  // Where need_weights' weights come from. false (PyTorch's MHA): the op returns them with the output from its
  // reference path. true (a model's output_attentions): the output keeps the fused kernel, as without need_weights,
  // and the weights are recomputed beside it (AttendWeights::kRecomputed), so asking for them leaves the output
  // unchanged. Under active weight dropout the two are the same (see nn::AttendWeights).
  bool recompute_weights = false;
  // The layout the caller's arrays had, for error messages only: false (torch's batch_first=False, the caller
  // transposed (T, B, E) into this call's (B, T, E)) shows query, key and value as the caller passed them.
  bool batch_first = true;
  bool average_attn_weights = true;   // weights (B, Tq, Tk) averaged over heads, else (B, H, Tq, Tk)
  // Incremental decoding (inference only). The new rows' projected keys and values are appended to kv_cache
  // (reset to (B, Hkv, 0, D) on first use) and the queries attend to every position it then holds: key and value
  // are the new rows only, the masks are sized for the cache's new length Tk, and is_causal aligns bottom-right
  // (new query i sits at position Tk - Tq + i). With kv_cache_fixed the cache already holds the keys and values
  // (a fixed memory for cross-attention, see project_kv): key and value are not used and may be undefined.
  KvCache* kv_cache = nullptr;
  bool kv_cache_fixed = false;
  // --- beyond PyTorch's MHA: positions inside attention, the score scale, per-head output gates ---------------
  // Rotary positions (RoPE, ad::rope, half-split pairs) on the projected queries and keys; the new rows sit at
  // positions kv_cache length + i when decoding. Not with kv_cache_fixed.
  bool rotary = false;
  float rotary_base = 10000.0f;
  // Shaw et al. relative attention (qkv::relative_attention) when rel_k is defined: rel_k (2·clip+1, D) and rel_v
  // (2·clip+1, D) or undefined, clip = (rows - 1) / 2. They take gradients when they are parameters on the tape
  // (TransformerEncoderLayer owns them per layer). Not with kv_cache_fixed, weight dropout, a trained attn_bias
  // or grouped-query heads.
  ad::Var rel_k, rel_v;
  // Score multiplier: unset = 1/sqrt(D); 1 = unscaled.
  std::optional<float> scale;
  // (H): each head's output (B, H, Tq, D) is multiplied by head_mask[h] before the heads are merged (head
  // ablation, Hugging Face's head_mask); returned weights are not masked.
  Tensor head_mask;
  // Packed variable-length input: query, key and value are (N, dim), B sequences end to end, sequence b taking rows
  // [cu_seqlens[b], cu_seqlens[b + 1]) (B + 1 offsets from 0 to N). Each sequence attends to its own rows only,
  // through attention_varlen: no padding exists and none is computed. No masks, attn_bias, kv_cache, weights or
  // weight dropout then; is_causal applies within each sequence.
  std::vector<int32_t> cu_seqlens;
  // false: out_proj runs without its bias, which the caller adds in what follows (a fused residual + LayerNorm).
  bool out_proj_bias = true;
  // Sliding window as AttentionOptions' (FlashAttention's window_size = (left, right), -1 = unbounded, aligned
  // bottom-right) and logit soft-capping c > 0 (scores c·tanh(scores / c)), handed to the op. Not under a
  // sequence shard (the ring has no window).
  int64_t window_left = -1;
  int64_t window_right = -1;
  float softcap = 0.0f;
};

// What forward returns: out (on the tape when the Context trains; a constant, read as out.value, in inference) and
// the weights, which are never differentiated.
struct MhaResult {
  ad::Var out;     // (B, Tq, E)  [(Tq, E) unbatched]
  Tensor weights;  // (B, Tq, Tk) or (B, H, Tq, Tk); undefined when !need_weights. After dropout, as PyTorch.
};

// Parameters (exactly torch.nn.MultiheadAttention's when num_kv_heads == num_heads, i.e. Ekv == E):
//   kdim == vdim == E:  "in_proj_weight" (E + 2·Ekv, E), rows [Q; K; V]  "in_proj_bias" (E + 2·Ekv)
//   otherwise:          "q_proj_weight" (E, E), "k_proj_weight" (Ekv, kdim), "v_proj_weight" (Ekv, vdim),
//                       "in_proj_bias" (E + 2·Ekv)
//   always:             "out_proj.weight" (E, E), "out_proj.bias" (E)
//   bias = false drops in_proj_bias and out_proj.bias.
// Grouped-query attention (num_kv_heads < num_heads): the keys and values have Hkv = num_kv_heads heads of the
// same head_dim D, Ekv = Hkv·D features, and query head h reads kv head h / (H / Hkv) in place (nothing is
// repeated); the packed rows are a fused qkv layer's as transformers stores it (q rows first). A KV cache holds Hkv
// heads; masks, head_mask and the weights stay per query head (B, H, Tq, Tk).
// Init as PyTorch: xavier-uniform projection weights, zero biases, out_proj.weight as nn.Linear.
// Not supported: add_bias_kv, add_zero_attn, batch_first=False (the layout is always batch-first).
// Fully masked query rows give output 0 (only the out_proj bias remains) and weights 0; PyTorch gives NaN there.
class MultiheadAttention : public Module {
 public:
  // embed_dim > 0, num_heads > 0 and divides embed_dim; dropout in [0, 1); kdim/vdim 0 mean embed_dim;
  // num_kv_heads >= 1 divides num_heads (unset: num_heads, torch's layer).
  // Attention-weight dropout draws from an Rng seeded from `rng` at construction.
  MultiheadAttention(int64_t embed_dim, int64_t num_heads, Rng& rng, float dropout = 0.0f, bool bias = true,
                     int64_t kdim = 0, int64_t vdim = 0, std::optional<int64_t> num_kv_heads = std::nullopt);

  // query: (B, Tq, E)  key: (B, Tk, kdim)  value: (B, Tk, vdim)  ->  out (B, Tq, E), weights (see MhaResult).
  // Unbatched (Tq, E), (Tk, kdim), (Tk, vdim) are accepted too, as PyTorch.
  // When query, key and value are the same tensor and the weights are packed, one (3E, E) projection is used.
  // attn_bias: an extra additive bias broadcastable to (B, H, Tq, Tk) that may take a gradient (T5's table
  // through ad::t5_bias), added to options.attn_bias. Without weight dropout the attention is one fused node.
  // On a tape, need_weights returns the pre-dropout weights as a constant.
  MhaResult forward(const Context& c, const ad::Var& query, const ad::Var& key, const ad::Var& value,
                    const MhaForwardOptions& options = {}, const ad::Var& attn_bias = {}) const;
  // key: (B, Tk, kdim)  value: (B, Tk, vdim)  ->  their projections as heads (B, Hkv, Tk, D), what forward
  // attends to (a fixed memory for kv_cache_fixed).
  std::pair<Tensor, Tensor> project_kv(const Tensor& key, const Tensor& value) const;
  // Inference (or dropout from this module's own Rng in training mode).
  MhaResult forward(const Tensor& query, const Tensor& key, const Tensor& value,
                    const MhaForwardOptions& options = {});

  int64_t embed_dim() const { return embed_dim_; }
  int64_t num_heads() const { return num_heads_; }
  int64_t num_kv_heads() const { return num_kv_heads_; }
  int64_t head_dim() const { return head_dim_; }
  int64_t kdim() const { return kdim_; }
  int64_t vdim() const { return vdim_; }
  float dropout() const { return dropout_; }
  bool packed() const { return packed_; }  // true when kdim == vdim == embed_dim (in_proj_weight)

  Tensor in_proj_weight;  // (E + 2·Ekv, E) when packed, else undefined
  Tensor q_proj_weight;   // (E, E) when !packed
  Tensor k_proj_weight;   // (Ekv, kdim) when !packed
  Tensor v_proj_weight;   // (Ekv, vdim) when !packed
  Tensor in_proj_bias;    // (E + 2·Ekv) or undefined (bias = false)
  Linear out_proj;        // "out_proj.weight" (E, E), "out_proj.bias" (E)

 private:
  int64_t row_of(int64_t which) const;  // the first in_proj row of q, k, v (which 0, 1, 2); 3: the row count
  ad::Var project(const Context& c, const ad::Var& x, int64_t which, int64_t n) const;
  std::vector<ad::Var> split_heads(const ad::Var& p, int64_t which, int64_t n) const;
  MhaResult forward_packed(const Context& c, const ad::Var& query, const ad::Var& key, const ad::Var& value,
                           const MhaForwardOptions& o, bool self) const;
  int64_t embed_dim_, num_heads_, num_kv_heads_, head_dim_, kdim_, vdim_;
  float dropout_;
  bool packed_;
  Rng dropout_rng_;
};

}  // namespace qkv::nn
