// nn::TransformerDecoderLayer and nn::TransformerDecoder, step for step as torch.nn's (post-LN and pre-LN):
// masked self-attention, cross-attention on the encoder memory, feed-forward; dropout1..3 after each block.
#include <algorithm>
#include <string>

#include "qkv/core/error.h"
#include "qkv/nn/transformer.h"
#include "qkv/ops/elementwise.h"
#include "qkv/ops/functional.h"
#include "transformer_common.h"

namespace qkv::nn {

TransformerDecoderLayer::TransformerDecoderLayer(const TransformerLayerConfig& c, Rng& rng)
    : self_attn(detail::checked_layer_config(c, "TransformerDecoderLayer"), c.nhead, rng, c.dropout, c.bias),
      multihead_attn(c.d_model, c.nhead, rng, c.dropout, c.bias),
      ff(c.d_model, c.dim_feedforward, rng, c.activation, c.dropout, c.bias),
      norm1(c.d_model, c.layer_norm_eps, true, c.bias),
      norm2(c.d_model, c.layer_norm_eps, true, c.bias),
      norm3(c.d_model, c.layer_norm_eps, true, c.bias),
      dropout1(c.dropout, rng.next_u64()),
      dropout2(c.dropout, rng.next_u64()),
      dropout3(c.dropout, rng.next_u64()),
      config_(c) {
  QKV_CHECK_ARG(!c.rotary && !c.attn_scale,
                "[TransformerDecoderLayer] rotary and attn_scale are encoder-layer options; keep their defaults");
  register_module("self_attn", &self_attn);
  register_module("multihead_attn", &multihead_attn);
  register_module("linear1", &ff.linear1);
  register_module("dropout", &ff.dropout);
  register_module("linear2", &ff.linear2);
  register_module("norm1", &norm1);
  register_module("norm2", &norm2);
  register_module("norm3", &norm3);
  register_module("dropout1", &dropout1);
  register_module("dropout2", &dropout2);
  register_module("dropout3", &dropout3);
}

ad::Var TransformerDecoderLayer::forward(const Context& c, const ad::Var& tgt, const ad::Var& memory,
                                         const AttentionMasks& tgt_masks, const AttentionMasks& memory_masks,
                                         KvCache* self_cache, KvCache* memory_cache, Tensor* self_weights,
                                         Tensor* memory_weights) const {
  detail::check_sequence(tgt.value, config_.d_model, "TransformerDecoderLayer", "tgt");
  MhaForwardOptions self_opts = to_mha_options(tgt_masks);
  MhaForwardOptions cross_opts = to_mha_options(memory_masks);
  self_opts.kv_cache = self_cache;
  if (memory_cache == nullptr || !memory_cache->ready()) {
    detail::check_sequence(memory.value, config_.d_model, "TransformerDecoderLayer", "memory");
    QKV_CHECK_ARG(tgt.size(0) == memory.size(0), "[TransformerDecoderLayer] tgt ", str(tgt.shape()), " and memory ",
                  str(memory.shape()), " must have the same batch size");
  }
  if (memory_cache != nullptr) {
    QKV_CHECK_ARG(!c.tape(), "[TransformerDecoderLayer] the memory cache is for inference; the Context records a tape");
    if (!memory_cache->ready()) {  // the memory's keys and values, projected once
      const auto [k, v] = multihead_attn.project_kv(memory.value, memory.value);  // (B, H, Ts, D)
      memory_cache->reset(k.size(0), k.size(1), k.size(3), std::max<int64_t>(k.size(2), 1));
      memory_cache->append(k, v);
    }
    cross_opts.kv_cache = memory_cache;
    cross_opts.kv_cache_fixed = true;
  }
  for (auto [opts, want] : {std::pair{&self_opts, self_weights}, std::pair{&cross_opts, memory_weights}}) {
    if (!want) continue;
    opts->need_weights = true;
    opts->recompute_weights = true;
    opts->average_attn_weights = false;
  }
  auto sa_block = [&](const ad::Var& x) {
    MhaResult r = self_attn.forward(c, x, x, x, self_opts, tgt_masks.trained_bias);
    if (self_weights) *self_weights = r.weights;
    return dropout1.forward(c, r.out);
  };
  auto mha_block = [&](const ad::Var& x) {
    MhaResult r = multihead_attn.forward(c, x, memory, memory, cross_opts, memory_masks.trained_bias);
    if (memory_weights) *memory_weights = r.weights;
    return dropout2.forward(c, r.out);
  };
  auto ff_block = [&](const ad::Var& x) { return dropout3.forward(c, ff.forward(c, x)); };
  ad::Var x = tgt;
  if (config_.norm_first) {
    x = ad::add(x, sa_block(norm1.forward(c, x)));
    x = ad::add(x, mha_block(norm2.forward(c, x)));
    x = ad::add(x, ff_block(norm3.forward(c, x)));
  } else {
    x = norm1.forward(c, ad::add(x, sa_block(x)));
    x = norm2.forward(c, ad::add(x, mha_block(x)));
    x = norm3.forward(c, ad::add(x, ff_block(x)));
  }
  return x;
}

TransformerDecoder::TransformerDecoder(const TransformerLayerConfig& c, int64_t num_layers, bool final_norm,
                                       Rng& rng)
    : d_model_(detail::checked_layer_config(c, "TransformerDecoder")) {
  QKV_CHECK_ARG(num_layers >= 0, "[TransformerDecoder] num_layers must be >= 0, got ", num_layers);
  for (int64_t i = 0; i < num_layers; ++i) {
    layers.push_back(std::make_unique<TransformerDecoderLayer>(c, rng));
    register_module("layers." + std::to_string(i), layers.back().get());
  }
  if (final_norm) {
    norm = std::make_unique<LayerNorm>(c.d_model, c.layer_norm_eps, true, c.bias);
    register_module("norm", norm.get());
  }
}

ad::Var TransformerDecoder::forward(const Context& c, const ad::Var& tgt, const ad::Var& memory,
                                    const AttentionMasks& tgt_masks, const AttentionMasks& memory_masks,
                                    StackRecord* record, DecoderCache* cache) const {
  detail::check_sequence(tgt.value, d_model_, "TransformerDecoder", "tgt");
  if (cache == nullptr || memory.defined())
    detail::check_sequence(memory.value, d_model_, "TransformerDecoder", "memory");
  if (cache != nullptr) {
    QKV_CHECK_ARG(cache->self.size() == layers.size() && cache->memory.size() == layers.size(),
                  "[TransformerDecoder] the cache holds ", cache->self.size(), " self-attention and ",
                  cache->memory.size(), " memory caches for ", layers.size(), " layers (DecoderCache(num_layers))");
    for (const KvCache& k : cache->self)
      QKV_CHECK_ARG(!k.ready() || k.length() == cache->length, "[TransformerDecoder] a layer's cache holds ",
                    k.length(), " positions; the cache's length is ", cache->length);
  }
  ad::Var x = tgt;
  detail::Recorder rec(record, layers.size(), "TransformerDecoder", true);
  rec.hidden(x);
  for (size_t i = 0; i < layers.size(); ++i) {
    KvCache* self_cache = cache ? &cache->self[i] : nullptr;
    KvCache* memory_cache = cache ? &cache->memory[i] : nullptr;
    x = layers[i]->forward(c, x, memory, tgt_masks, memory_masks, self_cache, memory_cache, rec.attention(i),
                           rec.cross_attention(i));
    rec.hidden(x);
  }
  if (cache) cache->length += tgt.size(1);
  if (norm) {
    x = norm->forward(c, x);
    rec.replace_last_hidden(x);
  }
  return x;
}

}  // namespace qkv::nn
