// nn::TransformerEncoderLayer and nn::TransformerEncoder, step for step as torch.nn's (post-LN and pre-LN).
// Each layer of the stack gets its own random init; the optional final LayerNorm is "norm".
#include <string>

#include "qkv/core/error.h"
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
      dropout1(c.dropout, rng.next_u64()),
      dropout2(c.dropout, rng.next_u64()),
      config_(c) {
  register_module("self_attn", &self_attn);
  register_module("linear1", &ff.linear1);
  register_module("dropout", &ff.dropout);
  register_module("linear2", &ff.linear2);
  register_module("norm1", &norm1);
  register_module("norm2", &norm2);
  register_module("dropout1", &dropout1);
  register_module("dropout2", &dropout2);
}

ad::Var TransformerEncoderLayer::forward(const Context& c, const ad::Var& src, const AttentionMasks& masks,
                                         KvCache* cache, Tensor* weights) const {
  detail::check_sequence(src.value, config_.d_model, "TransformerEncoderLayer", "src", !masks.cu_seqlens.empty());
  MhaForwardOptions mo = to_mha_options(masks);
  mo.rotary = config_.rotary;
  mo.scale = config_.attn_scale;
  mo.kv_cache = cache;
  if (weights) {
    mo.need_weights = true;
    mo.recompute_weights = true;
    mo.average_attn_weights = false;
  }
  // Post-LN: a block's last bias (out_proj's, linear2's) joins the fused residual + bias + LayerNorm after it,
  // unless the block's dropout is active (the bias is inside the dropout then).
  const bool post = !config_.norm_first;
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
  ad::Var x = src;
  if (config_.norm_first) {
    x = ad::add(x, sa_block(norm1.forward(c, x)));
    x = ad::add(x, ff_block(norm2.forward(c, x)));
  } else {
    // norm(x + f(x)) as one fused residual + bias + LayerNorm step
    const ad::Var b1 = fold1 ? c.param(self_attn.out_proj.bias) : ad::Var();
    const ad::Var b2 = fold2 ? c.param(ff.linear2.bias) : ad::Var();
    x = ad::add_layer_norm(sa_block(x), x, b1, c.param(norm1.weight), c.param(norm1.bias), norm1.eps());
    x = ad::add_layer_norm(ff_block(x), x, b2, c.param(norm2.weight), c.param(norm2.bias), norm2.eps());
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
  detail::Recorder rec(record, layers.size(), "TransformerEncoder");
  rec.hidden(x);
  for (size_t i = 0; i < layers.size(); ++i) {
    x = layers[i]->forward(c, x, masks, nullptr, rec.attention(i));
    rec.hidden(x);
  }
  if (norm) {
    x = norm->forward(c, x);
    rec.replace_last_hidden(x);
  }
  return x;
}

}  // namespace qkv::nn
