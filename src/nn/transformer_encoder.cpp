// nn::TransformerEncoderLayer and nn::TransformerEncoder, step for step as torch.nn's (post-LN and pre-LN).
// Each layer of the stack gets its own random init; the optional final LayerNorm is "norm".
#include <cmath>
#include <string>

#include "qkv/core/error.h"
#include "qkv/nn/init.h"
#include "qkv/nn/transformer.h"
#include "qkv/ops/elementwise.h"
#include "qkv/ops/functional.h"
#include "transformer_common.h"

namespace qkv::nn {
TransformerEncoderLayer::TransformerEncoderLayer(const TransformerLayerConfig& c, Rng& rng)
    : self_attn(detail::checked_layer_config(c, "TransformerEncoderLayer"), c.nhead, rng, c.dropout, c.bias),
      ff(c.d_model, c.dim_feedforward, rng, c.activation, c.dropout, c.bias),
      norm1(c.d_model, c.layer_norm_eps, true, c.bias),
      norm2(c.d_model, c.layer_norm_eps, true, c.bias),
      dropout1(c.dropout, detail::draw_seed(rng)),
      dropout2(c.dropout, detail::draw_seed(rng)),
      config_(c) {
  register_module("self_attn", &self_attn);
  register_module("linear1", &ff.linear1);
  register_module("dropout", &ff.dropout);
  register_module("linear2", &ff.linear2);
  if (c.layer_norm) {
    register_module("norm1", &norm1);
    register_module("norm2", &norm2);
  }
  register_module("dropout1", &dropout1);
  register_module("dropout2", &dropout2);
  if (c.relative) {
    const int64_t rows = 2 * c.relative_clip + 1, D = c.d_model / c.nhead;
    const float std = 1.0f / std::sqrt(static_cast<float>(D));
    rel_k = init_normal(rng, {rows, D}, 0.0f, std);
    rel_v = init_normal(rng, {rows, D}, 0.0f, std);
    register_parameter("rel_k", &rel_k);
    register_parameter("rel_v", &rel_v);
  }
}

ad::Var TransformerEncoderLayer::forward(const Context& c, const ad::Var& src, const AttentionMasks& masks,
                                         KvCache* cache, Tensor* weights) const {
  detail::check_sequence(src.value, config_.d_model, "TransformerEncoderLayer", "src", !masks.cu_seqlens.empty());
  MhaForwardOptions mo = to_mha_options(masks);
  mo.rotary = config_.rotary;
  mo.scale = config_.attn_scale;
  if (config_.relative) {
    mo.rel_k = c.param(rel_k);
    mo.rel_v = c.param(rel_v);
  }
  mo.kv_cache = cache;
  if (weights) {
    mo.need_weights = true;
    mo.recompute_weights = true;
    mo.average_attn_weights = false;
  }
  // Post-LN: a block's last bias (out_proj's, linear2's) joins the fused residual + bias + LayerNorm after it,
  // unless the block's dropout is active (the bias is inside the dropout then).
  const bool post = !config_.norm_first && config_.layer_norm;
  const bool fold1 = post && !(dropout1.training() && dropout1.p() > 0.0f);
  const bool fold2 = post && !(dropout2.training() && dropout2.p() > 0.0f);
  mo.out_proj_bias = !fold1;
  // Each block's result is a fresh value that nothing else reads: add_layer_norm may write into it.
  auto sa_block = [&](const ad::Var& x) {
    MhaResult r = self_attn.forward(c, x, x, x, mo, masks.trained_bias);
    if (weights) *weights = r.weights;
    return dropout1.forward(c, r.out);
  };
  auto ff_block = [&](const ad::Var& x) { return dropout2.forward(c, ff.forward(c, x, !fold2)); };
  // Without layer_norm the norms are the identity; without residual the sum is the block's output alone.
  auto n1 = [&](const ad::Var& x) { return config_.layer_norm ? norm1.forward(c, x) : x; };
  auto n2 = [&](const ad::Var& x) { return config_.layer_norm ? norm2.forward(c, x) : x; };
  auto res = [&](const ad::Var& x, const ad::Var& f) { return config_.residual ? ad::add(x, f) : f; };
  ad::Var x = src;
  if (config_.norm_first) {
    x = res(x, sa_block(n1(x)));
    x = res(x, ff_block(n2(x)));
  } else if (config_.layer_norm) {
    // norm(x + f(x)) as one fused residual + bias + LayerNorm step (without residual: norm(f(x)))
    const ad::Var b1 = fold1 ? c.param(self_attn.out_proj.bias) : ad::Var();
    const ad::Var b2 = fold2 ? c.param(ff.linear2.bias) : ad::Var();
    x = ad::add_layer_norm(sa_block(x), config_.residual ? x : ad::Var(), b1, c.param(norm1.weight),
                           c.param(norm1.bias), norm1.eps());
    x = ad::add_layer_norm(ff_block(x), config_.residual ? x : ad::Var(), b2, c.param(norm2.weight),
                           c.param(norm2.bias), norm2.eps());
  } else {
    x = res(x, sa_block(x));
    x = res(x, ff_block(x));
  }
  return x;
}

TransformerEncoder::TransformerEncoder(const TransformerLayerConfig& c, int64_t num_layers, bool final_norm,
                                       Rng& rng)
    : d_model_(detail::checked_layer_config(c, "TransformerEncoder")) {
  QKV_CHECK_ARG(num_layers >= 0, "[TransformerEncoder] num_layers must be >= 0, got ", num_layers);
  for (int64_t i = 0; i < num_layers; ++i) {
    layers.push_back(std::make_unique<TransformerEncoderLayer>(c, rng));
    register_module("layers." + std::to_string(i), layers.back().get());
  }
  if (final_norm) {
    norm = std::make_unique<LayerNorm>(c.d_model, c.layer_norm_eps, true, c.bias);
    register_module("norm", norm.get());
  }
}

ad::Var TransformerEncoder::forward(const Context& c, const ad::Var& src, const AttentionMasks& masks,
                                    StackRecord* record) const {
  detail::check_sequence(src.value, d_model_, "TransformerEncoder", "src", !masks.cu_seqlens.empty());
  ad::Var x = src;
  const Tensor& hm = masks.head_mask;
  const bool per_layer = hm.defined() && hm.dim() == 2;
  QKV_CHECK_ARG(!per_layer || hm.size(0) == num_layers(), "[TransformerEncoder] head_mask ", str(hm.shape()),
                " must be (num_heads) or (num_layers = ", num_layers(), ", num_heads)");
  AttentionMasks layer_masks = masks;
  detail::Recorder rec(record, layers.size(), "TransformerEncoder");
  rec.hidden(x);
  for (size_t i = 0; i < layers.size(); ++i) {
    if (per_layer) layer_masks.head_mask = hm.select(0, static_cast<int64_t>(i));
    x = layers[i]->forward(c, x, layer_masks, nullptr, rec.attention(i));
    rec.hidden(x);
  }
  if (norm) {
    x = norm->forward(c, x);
    rec.replace_last_hidden(x);
  }
  return x;
}

}  // namespace qkv::nn
