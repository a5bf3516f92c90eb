// The experiments' ablation encoder layer: nn::TransformerEncoderLayer's forward with the LayerNorm, residual,
// Shaw relative and head-gate switches of the experiments.
#include "ablation_layer.h"

#include <cmath>

#include "qkv/core/error.h"
#include "qkv/nn/init.h"
#include "qkv/ops/elementwise.h"
#include "qkv/ops/functional.h"

namespace qkv::experiments {
namespace {

// Checks the switches before any member is built, so errors name this layer; the pieces check the rest.
const nn::TransformerLayerConfig& checked(const AblationLayerConfig& c) {
  QKV_CHECK_ARG(c.relative_clip >= 0, "[AblationEncoderLayer] relative_clip must be >= 0, got ", c.relative_clip);
  QKV_CHECK_ARG(!c.layer.attn_scale || std::isfinite(*c.layer.attn_scale),
                "[AblationEncoderLayer] attn_scale must be finite");
  return c.layer;
}

}  // namespace

AblationEncoderLayer::AblationEncoderLayer(const AblationLayerConfig& config, Rng& rng)
    : self_attn(checked(config).d_model, config.layer.nhead, rng, config.layer.dropout, config.layer.bias),
      ff(config.layer.d_model, config.layer.dim_feedforward, rng, config.layer.activation, config.layer.dropout,
         config.layer.bias),
      norm1(config.layer.d_model, config.layer.layer_norm_eps, true, config.layer.bias),
      norm2(config.layer.d_model, config.layer.layer_norm_eps, true, config.layer.bias),
      dropout1(config.layer.dropout, rng.next_u64()),
      dropout2(config.layer.dropout, rng.next_u64()),
      config_(config) {
  register_module("self_attn", &self_attn);
  register_module("linear1", &ff.linear1);
  register_module("dropout", &ff.dropout);
  register_module("linear2", &ff.linear2);
  if (config.layer_norm) {
    register_module("norm1", &norm1);
    register_module("norm2", &norm2);
  }
  register_module("dropout1", &dropout1);
  register_module("dropout2", &dropout2);
  if (config.relative) {
    const int64_t rows = 2 * config.relative_clip + 1, D = config.layer.d_model / config.layer.nhead;
    const float std = 1.0f / std::sqrt(static_cast<float>(D));
    rel_k = nn::init_normal(rng, {rows, D}, 0.0f, std);
    rel_v = nn::init_normal(rng, {rows, D}, 0.0f, std);
    register_parameter("rel_k", &rel_k);
    register_parameter("rel_v", &rel_v);
  }
}

ad::Var AblationEncoderLayer::forward(const nn::Context& c, const ad::Var& src, const nn::AttentionMasks& masks,
                                      const Tensor& head_mask, Tensor* weights) const {
  const nn::TransformerLayerConfig& lc = config_.layer;
  QKV_CHECK_ARG(src.defined() && src.dim() == 3 && src.size(2) == lc.d_model, "[AblationEncoderLayer] src ",
                src.defined() ? str(src.shape()) : "()", " must be (B, T, d_model) with d_model = ", lc.d_model);
  nn::MhaForwardOptions mo = nn::to_mha_options(masks);
  mo.rotary = lc.rotary;
  mo.scale = lc.attn_scale;
  mo.head_mask = head_mask;
  if (config_.relative) {
    mo.rel_k = c.param(rel_k);
    mo.rel_v = c.param(rel_v);
  }
  if (weights) {
    mo.need_weights = true;
    mo.recompute_weights = true;
    mo.average_attn_weights = false;
  }
  // Post-LN: a block's last bias (out_proj's, linear2's) joins the fused residual + bias + LayerNorm after it,
  // unless the block's dropout is active (the bias is inside the dropout then).
  const bool post = !lc.norm_first && config_.layer_norm;
  const bool fold1 = post && !(dropout1.training() && dropout1.p() > 0.0f);
  const bool fold2 = post && !(dropout2.training() && dropout2.p() > 0.0f);
  mo.out_proj_bias = !fold1;
  // Each block's result is a fresh value that nothing else reads: add_layer_norm may write into it.
  auto sa_block = [&](const ad::Var& x) {
    nn::MhaResult r = self_attn.forward(c, x, x, x, mo, masks.trained_bias);
    if (weights) *weights = r.weights;
    return dropout1.forward(c, r.out);
  };
  auto ff_block = [&](const ad::Var& x) { return dropout2.forward(c, ff.forward(c, x, !fold2)); };
  // Without layer_norm the norms are the identity; without residual the sum is the block's output alone.
  auto n1 = [&](const ad::Var& x) { return config_.layer_norm ? norm1.forward(c, x) : x; };
  auto n2 = [&](const ad::Var& x) { return config_.layer_norm ? norm2.forward(c, x) : x; };
  auto res = [&](const ad::Var& x, const ad::Var& f) { return config_.residual ? ad::add(x, f) : f; };
  ad::Var x = src;
  if (lc.norm_first) {
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

}  // namespace qkv::experiments
