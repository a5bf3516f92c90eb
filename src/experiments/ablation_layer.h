// The experiments' ablation encoder layer: nn::TransformerEncoderLayer's pieces and parameter names, plus the
// switches the article's claims turn on and torch.nn's layer does not have: no LayerNorm, no residual, Shaw
// relative self-attention (the layer owning its tables) and per-head output gates. With the switches at their
// defaults it computes what nn::TransformerEncoderLayer computes.
#pragma once

#include <cstdint>

#include "qkv/core/rng.h"
#include "qkv/core/tensor.h"
#include "qkv/nn/context.h"
#include "qkv/nn/dropout.h"
#include "qkv/nn/feed_forward.h"
#include "qkv/nn/layer_norm.h"
#include "qkv/nn/module.h"
#include "qkv/nn/multihead_attention.h"
#include "qkv/nn/transformer.h"

namespace qkv::experiments {

struct AblationLayerConfig {
  nn::TransformerLayerConfig layer;  // torch's options, rotary and attn_scale
  bool layer_norm = true;  // false: no LayerNorm at all (norm1/norm2 are not registered; norm_first is moot)
  bool residual = true;    // false: x = f(x) in place of x + f(x) around both blocks
  // Shaw relative self-attention: the layer owns "rel_k" and "rel_v" (2·relative_clip+1, head_dim), drawn
  // N(0, 1/head_dim) after every other parameter of the layer. relative_clip >= 0.
  bool relative = false;
  int64_t relative_clip = 16;
};

// Parameters: self_attn.*, linear1.*, linear2.*, norm1.*, norm2.* (with layer_norm), rel_k, rel_v (relative).
// Children built from `rng` in nn::TransformerEncoderLayer's order (self_attn, ff, norm1, norm2, dropout1 / 2 seeds).
class AblationEncoderLayer : public nn::Module {
 public:
  AblationEncoderLayer(const AblationLayerConfig& config, Rng& rng);

  // src: (B, T, E) -> (B, T, E), as nn::TransformerEncoderLayer::forward (post-LN or pre-LN) under the switches.
  // head_mask: (H) multipliers of each head's output (MhaForwardOptions::head_mask), or undefined.
  // weights non-null: the self-attention weights per head (B, H, T, T), recomputed beside the fused kernel.
  ad::Var forward(const nn::Context& c, const ad::Var& src, const nn::AttentionMasks& masks = {},
                  const Tensor& head_mask = {}, Tensor* weights = nullptr) const;
  // Inference; in training() mode dropout draws from dropout1's Rng.
  Tensor forward(const Tensor& src, const nn::AttentionMasks& masks = {}, const Tensor& head_mask = {}) {
    return forward(nn::Context(&dropout1.rng()), src, masks, head_mask).value;
  }

  const AblationLayerConfig& config() const { return config_; }

  nn::MultiheadAttention self_attn;
  nn::FeedForward ff;  // its linear1 / dropout / linear2 are registered directly on this layer
  nn::LayerNorm norm1, norm2;
  nn::Dropout dropout1, dropout2;
  Tensor rel_k, rel_v;  // config.relative: "rel_k", "rel_v" (2·relative_clip+1, head_dim); else undefined

 private:
  AblationLayerConfig config_;
};

}  // namespace qkv::experiments
