// Transformer layers and stacks with torch.nn's names: TransformerEncoderLayer / DecoderLayer ("self_attn",
// "multihead_attn", "linear1", "linear2", "norm1..3"), TransformerEncoder / Decoder ("layers.N.*", "norm") and Transformer.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "qkv/core/rng.h"
#include "qkv/core/tensor.h"
#include "qkv/nn/dropout.h"
#include "qkv/nn/feed_forward.h"
#include "qkv/nn/kv_cache.h"
#include "qkv/nn/layer_norm.h"
#include "qkv/nn/linear.h"
#include "qkv/nn/module.h"
#include "qkv/nn/multihead_attention.h"

namespace qkv::nn {

// Hyper-parameters shared by encoder and decoder layers, PyTorch's defaults. Always batch-first.
struct TransformerLayerConfig {
  int64_t d_model = 512;
  int64_t nhead = 8;
  int64_t dim_feedforward = 2048;
  float dropout = 0.1f;
  Activation activation = Activation::kRelu;
  float layer_norm_eps = 1e-5f;
  bool norm_first = false;  // false: post-LN x = norm(x + f(x)); true: pre-LN x = x + f(norm(x))
  bool bias = true;         // biases of every Linear, MultiheadAttention and LayerNorm
  // --- beyond torch.nn's layers (encoder layer's self-attention; see MhaForwardOptions) -----------------------
  // The experiments' ablation switches (no LayerNorm, no residual, Shaw relative keys, head gates) are in
  // src/experiments/ablation_layer.h, not here.
  bool rotary = false;      // RoPE on the self-attention's queries and keys
  std::optional<float> attn_scale;  // unset: 1/sqrt(head_dim); 1 = unscaled
};

// The masks of one attention block (self-attention or cross-attention); fields as in MhaForwardOptions.
//   mask: (Tq, Tk) or (B*H, Tq, Tk)      key_padding_mask: (B, Tk)      attn_bias: broadcastable to (B, H, Tq, Tk)
struct AttentionMasks {
  Tensor mask;
  MaskKind mask_kind = MaskKind::kBlock;  // nonzero = NOT allowed (PyTorch's bool convention); kAdditive for floats
  Tensor key_padding_mask;
  MaskKind key_padding_mask_kind = MaskKind::kBlock;  // nonzero = padding, ignored
  Tensor attn_bias;
  bool is_causal = false;  // applies a top-left causal mask (combined with `mask`)
  // An additive bias broadcastable to (B, H, Tq, Tk) on the tape (T5's learned table through ad::t5_bias): its
  // gradient flows back. Added to attn_bias.
  ad::Var trained_bias;
  // Packed variable-length input (encoder layers): src is (N, E), B sequences end to end with these B + 1 offsets;
  // each attends to itself only (MhaForwardOptions::cu_seqlens), the other masks must be empty.
  std::vector<int32_t> cu_seqlens;
};

// Incremental decoding state of a TransformerDecoder (inference only; transformers' EncoderDecoderCache): one
// KvCache per layer in each list. self: the self-attention's keys and values of every target position so far (the
// layers append the new ones). memory: the cross-attention's keys and values of the memory, projected from it by the
// first call that finds them empty and fixed after (MhaForwardOptions::kv_cache_fixed). Rows are reordered with
// KvCache::reorder (beam forks, finished rows dropped); a memory row needs it only when its source changes.
struct DecoderCache {
  explicit DecoderCache(size_t num_layers = 0) : self(num_layers), memory(num_layers) {}
  std::vector<KvCache> self;
  std::vector<KvCache> memory;
  int64_t length = 0;  // target positions the caches hold: the next call's first position (forward advances it)
};

// What a stack (TransformerEncoder, TransformerDecoder) records beside its output for a model's
// output_attentions / output_hidden_states (constants, never differentiated).
struct StackRecord {
  // In: per layer, whether to record its attention weights (empty: none); whether to record the hidden states.
  std::vector<bool> attention_layers;
  bool output_hidden_states = false;
  // Out, when asked (else left empty). attentions: one entry per layer, (B, H, Tq, Tk) per head, undefined for the
  // layers not asked; cross_attentions: the same for a decoder's cross-attention. hidden_states: L + 1 entries, the
  // stack's input, then each layer's output, the last one after the final norm when the stack has one.
  std::vector<Tensor> attentions;
  std::vector<Tensor> cross_attentions;
  std::vector<Tensor> hidden_states;
};

// The MHA options for these masks (need_weights false, as the layers ask PyTorch's MHA).
MhaForwardOptions to_mha_options(const AttentionMasks& masks);

// PyTorch's nn.Transformer.generate_square_subsequent_mask: (T, T) float, 0 on and below the diagonal, -inf above.
// Use with MaskKind::kAdditive. T >= 0.
Tensor generate_square_subsequent_mask(int64_t T);

// Parameters: self_attn.{in_proj_weight,in_proj_bias,out_proj.weight,out_proj.bias}, linear1.{weight,bias},
// linear2.{weight,bias}, norm1.{weight,bias}, norm2.{weight,bias}. Dropout children: dropout (inside FF),
// dropout1 (after attention), dropout2 (after FF); eval() turns all of them off.
class TransformerEncoderLayer : public Module {
 public:
  TransformerEncoderLayer(const TransformerLayerConfig& config, Rng& rng);

  // src: (B, T, E) -> (B, T, E), or packed (N, E) -> (N, E) with src_masks.cu_seqlens.
  //   post-LN: x = norm1(x + sa(x)); x = norm2(x + ff(x)), each residual + bias + LayerNorm one fused step
  //            (ad::add_layer_norm; the block's last bias joins it unless the block's dropout is active)
  //   pre-LN:  x = x + sa(norm1(x)); x = x + ff(norm2(x))
  // cache: incremental decoding (src holds the new positions only; masks are sized for the cache's new length; a
  // causal mask aligns bottom-right). weights non-null: also the self-attention weights per head, (B, H, Tq, Tk),
  // recomputed beside the fused kernel (MhaForwardOptions::recompute_weights: the output is the same with or without
  // them); never differentiated.
  ad::Var forward(const Context& c, const ad::Var& src, const AttentionMasks& src_masks = {},
                  KvCache* cache = nullptr, Tensor* weights = nullptr) const;
  // Inference; in training() mode dropout draws from dropout1's Rng.
  Tensor forward(const Tensor& src, const AttentionMasks& src_masks = {}, Tensor* weights = nullptr) {
    return forward(Context(&dropout1.rng()), src, src_masks, nullptr, weights).value;
  }

  const TransformerLayerConfig& config() const { return config_; }

  MultiheadAttention self_attn;
  FeedForward ff;  // its linear1 / dropout / linear2 are registered directly on this layer, as in PyTorch
  LayerNorm norm1, norm2;
  Dropout dropout1, dropout2;

 private:
  TransformerLayerConfig config_;
};

// Parameters: self_attn.*, multihead_attn.*, linear1.*, linear2.*, norm1.*, norm2.*, norm3.*.
// Dropout: dropout1 (after self-attention), dropout2 (after cross-attention), dropout (inside FF), dropout3 (after FF).
class TransformerDecoderLayer : public Module {
 public:
  TransformerDecoderLayer(const TransformerLayerConfig& config, Rng& rng);

  // tgt: (B, Tt, E)  memory: (B, Ts, E)  ->  (B, Tt, E)
  // tgt_masks apply to self-attention (Tq = Tk = Tt); memory_masks to cross-attention (Tq = Tt, Tk = Ts).
  //   post-LN: x = norm1(x + sa(x)); x = norm2(x + mha(x, mem)); x = norm3(x + ff(x))
  //   pre-LN:  x = x + sa(norm1(x)); x = x + mha(norm2(x), mem); x = x + ff(norm3(x))
  // Incremental decoding (inference only; see DecoderCache). self_cache: tgt holds the new positions only, the
  // tgt masks are sized for the cache's new length and a causal one aligns bottom-right. memory_cache: the
  // cross-attention's keys and values; when it is empty they are projected from `memory` into it, else `memory` is
  // not used (it may be undefined).
  // self_weights / memory_weights non-null: the per-head weights (B, H, Tq, Tk) of the self- and cross-attention,
  // recomputed beside the fused kernel as the encoder layer's.
  ad::Var forward(const Context& c, const ad::Var& tgt, const ad::Var& memory, const AttentionMasks& tgt_masks = {},
                  const AttentionMasks& memory_masks = {}, KvCache* self_cache = nullptr,
                  KvCache* memory_cache = nullptr, Tensor* self_weights = nullptr,
                  Tensor* memory_weights = nullptr) const;
  Tensor forward(const Tensor& tgt, const Tensor& memory, const AttentionMasks& tgt_masks = {},
                 const AttentionMasks& memory_masks = {}) {
    return forward(Context(&dropout1.rng()), tgt, memory, tgt_masks, memory_masks).value;
  }

  const TransformerLayerConfig& config() const { return config_; }

  MultiheadAttention self_attn;
  MultiheadAttention multihead_attn;
  FeedForward ff;
  LayerNorm norm1, norm2, norm3;
  Dropout dropout1, dropout2, dropout3;

 private:
  TransformerLayerConfig config_;
};

// A stack of num_layers encoder layers ("layers.0.*" ...) and an optional final LayerNorm ("norm.*").
// Unlike PyTorch's deep copies, each layer gets its own random init from `rng`.
class TransformerEncoder : public Module {
 public:
  // num_layers >= 0.
  TransformerEncoder(const TransformerLayerConfig& config, int64_t num_layers, bool final_norm, Rng& rng);

  // src: (B, T, E) -> (B, T, E), or packed (N, E) with src_masks.cu_seqlens (see the layer). record non-null:
  // the asked layers' weights (see the layer) and the hidden states go there (StackRecord).
  ad::Var forward(const Context& c, const ad::Var& src, const AttentionMasks& src_masks = {},
                  StackRecord* record = nullptr) const;
  // Inference; in training() mode dropout draws from the first layer's Rng.
  Tensor forward(const Tensor& src, const AttentionMasks& src_masks = {}, StackRecord* record = nullptr) {
    return forward(Context(layers.empty() ? nullptr : &layers[0]->dropout1.rng()), src, src_masks, record).value;
  }

  int64_t num_layers() const { return static_cast<int64_t>(layers.size()); }

  std::vector<std::unique_ptr<TransformerEncoderLayer>> layers;
  std::unique_ptr<LayerNorm> norm;  // null without final_norm

 private:
  int64_t d_model_;
};

class TransformerDecoder : public Module {
 public:
  TransformerDecoder(const TransformerLayerConfig& config, int64_t num_layers, bool final_norm, Rng& rng);

  // tgt: (B, Tt, E)  memory: (B, Ts, E)  ->  (B, Tt, E). record non-null: the asked layers' self- and
  // cross-attention weights and the hidden states go there (StackRecord).
  // cache non-null: incremental decoding (inference only), one entry per layer in each of its lists: tgt holds the
  // Tt positions after the cache->length ones it holds (the tgt masks sized for the new length), the memory is
  // projected into the memory caches by the first call (later calls may pass it undefined), and length grows by Tt.
  ad::Var forward(const Context& c, const ad::Var& tgt, const ad::Var& memory, const AttentionMasks& tgt_masks = {},
                  const AttentionMasks& memory_masks = {}, StackRecord* record = nullptr,
                  DecoderCache* cache = nullptr) const;
  Tensor forward(const Tensor& tgt, const Tensor& memory, const AttentionMasks& tgt_masks = {},
                 const AttentionMasks& memory_masks = {}) {
    return forward(Context(layers.empty() ? nullptr : &layers[0]->dropout1.rng()), tgt, memory, tgt_masks,
                   memory_masks).value;
  }

  int64_t num_layers() const { return static_cast<int64_t>(layers.size()); }

  std::vector<std::unique_ptr<TransformerDecoderLayer>> layers;
  std::unique_ptr<LayerNorm> norm;  // null without final_norm

 private:
  int64_t d_model_;
};

struct TransformerConfig {
  TransformerLayerConfig layer;  // d_model, nhead, dim_feedforward, dropout, activation, eps, norm_first, bias
  int64_t num_encoder_layers = 6;
  int64_t num_decoder_layers = 6;
};

// torch.nn.Transformer (batch_first=True): "encoder.layers.N.*", "encoder.norm.*", "decoder.layers.N.*",
// "decoder.norm.*" (both final norms always present, as PyTorch). Every parameter with rank > 1 is re-drawn
// xavier-uniform after construction, as nn.Transformer._reset_parameters does.
class Transformer : public Module {
 public:
  Transformer(const TransformerConfig& config, Rng& rng);

  // src: (B, Ts, E)  tgt: (B, Tt, E)  ->  (B, Tt, E)
  // src_masks: encoder self-attention; tgt_masks: decoder self-attention; memory_masks: cross-attention.
  ad::Var forward(const Context& c, const ad::Var& src, const ad::Var& tgt, const AttentionMasks& src_masks = {},
                  const AttentionMasks& tgt_masks = {}, const AttentionMasks& memory_masks = {}) const;
  // Inference; in training() mode dropout draws from the first encoder layer's Rng.
  Tensor forward(const Tensor& src, const Tensor& tgt, const AttentionMasks& src_masks = {},
                 const AttentionMasks& tgt_masks = {}, const AttentionMasks& memory_masks = {});

  const TransformerConfig& config() const { return config_; }

  TransformerEncoder encoder;
  TransformerDecoder decoder;

 private:
  TransformerConfig config_;
};

// Re-draws every registered parameter of rank > 1 from xavier-uniform(fan_in = size(1), fan_out = size(0)).
void xavier_uniform_reset(Module& module, Rng& rng);

}  // namespace qkv::nn
