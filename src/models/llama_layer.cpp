// LlamaMlp (the gated MLP: SwiGLU / GeGLU) and LlamaDecoderLayer (pre-norm residual block; Gemma 2's sandwich norms).
#include <memory>
#include <vector>

#include "qkv/core/error.h"
#include "qkv/models/llama.h"
#include "qkv/ops/functional.h"

namespace qkv::models {

LlamaMlp::LlamaMlp(const LlamaConfig& c, Rng& rng)
    : gate_proj(c.hidden_size, c.intermediate_size, c.mlp_bias, rng),
      up_proj(c.hidden_size, c.intermediate_size, c.mlp_bias, rng),
      down_proj(c.intermediate_size, c.hidden_size, c.mlp_bias, rng),
      act_(c.hidden_act) {
  register_module("gate_proj", &gate_proj);
  register_module("up_proj", &up_proj);
  register_module("down_proj", &down_proj);
}

ad::Var LlamaMlp::forward(const nn::Context& c, const ad::Var& x) const {
  const ad::Var gate = gate_proj.forward(c, x);
  ad::Var a;
  switch (act_) {
    case GatedActivation::kSilu: a = ad::silu(gate); break;
    case GatedActivation::kGelu: a = ad::gelu(gate, GeluApprox::kNone); break;
    case GatedActivation::kGeluTanh: a = ad::gelu(gate, GeluApprox::kTanh); break;
  }
  return down_proj.forward(c, ad::mul(a, up_proj.forward(c, x)));
}

LlamaDecoderLayer::LlamaDecoderLayer(const LlamaConfig& c, int64_t layer, Rng& rng)
    : self_attn(c, layer, rng),
      mlp(c, rng),
      input_layernorm(c.hidden_size, c.rms_norm_eps, c.norm_unit_offset),
      post_attention_layernorm(c.hidden_size, c.rms_norm_eps, c.norm_unit_offset),
      sandwich_(c.sandwich_norms) {
  register_module("self_attn", &self_attn);
  register_module("mlp", &mlp);
  register_module("input_layernorm", &input_layernorm);
  register_module("post_attention_layernorm", &post_attention_layernorm);
  if (sandwich_) {
    pre_feedforward_layernorm = std::make_unique<nn::RmsNorm>(c.hidden_size, c.rms_norm_eps, c.norm_unit_offset);
    post_feedforward_layernorm = std::make_unique<nn::RmsNorm>(c.hidden_size, c.rms_norm_eps, c.norm_unit_offset);
    register_module("pre_feedforward_layernorm", pre_feedforward_layernorm.get());
    register_module("post_feedforward_layernorm", post_feedforward_layernorm.get());
  }
}

ad::Var LlamaDecoderLayer::forward(const nn::Context& c, const ad::Var& x, int64_t offset, nn::KvCache* cache,
                                   const std::vector<int64_t>* positions,
                                   const std::shared_ptr<const RopeTable>& rope, int64_t last, Tensor* probs) const {
  const ad::Var h = self_attn.forward(c, input_layernorm.forward(c, x), offset, cache, positions, rope, last, probs);
  const int64_t t = x.size(1);
  const ad::Var r = h.size(1) < t ? ad::slice(x, 1, t - h.size(1), t) : x;  // the residual of the rows it gave
  if (sandwich_) {
    const ad::Var y = ad::add(r, post_attention_layernorm.forward(c, h));
    return ad::add(y, post_feedforward_layernorm->forward(c, mlp.forward(c, pre_feedforward_layernorm->forward(c, y))));
  }
  const ad::Var y = ad::add(r, h);
  return ad::add(y, mlp.forward(c, post_attention_layernorm.forward(c, y)));
}

}  // namespace qkv::models
