// LlamaMlp (the gated MLP: SwiGLU / GeGLU) and LlamaDecoderLayer (pre-norm residual block; Gemma 2's sandwich norms).
#include <algorithm>
#include <memory>
#include <vector>

#include "qkv/core/error.h"
#include "qkv/kernels/quant_gemm.h"
#include "qkv/models/llama.h"
#include "qkv/ops/functional.h"
#include "stored_weights.h"

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

using detail::bias_data;
using detail::bias_ok;
using detail::stored_integer_weight;

ad::Var LlamaMlp::forward(const nn::Context& c, const ad::Var& x) const {
  // Inference on a GGUF's integer-product weights: the whole SwiGLU MLP in one kernel (x quantized once for gate
  // and up, one parallel region), the same bits as the composition below (kernels::gated_mlp_quant).
  if (act_ == GatedActivation::kSilu && c.tape() == nullptr && x.value.defined() && x.dim() >= 1) {
    const kernels::QuantMatrix* g = stored_integer_weight(gate_proj);
    const kernels::QuantMatrix* u = stored_integer_weight(up_proj);
    const kernels::QuantMatrix* d = stored_integer_weight(down_proj);
    const bool biases_ok = bias_ok(gate_proj) && bias_ok(up_proj) && bias_ok(down_proj);
    if (g && u && d && biases_ok && g->type == u->type && g->rows == u->rows && g->cols == x.size(-1) &&
        g->cols == u->cols && d->rows == g->cols && d->cols == g->rows && g->rows % 32 == 0) {
      const Tensor xc = x.value.contiguous();
      const int64_t e = g->cols, rows = xc.numel() / std::max<int64_t>(e, 1);
      Tensor y = Tensor::empty(xc.shape());
      kernels::gated_mlp_quant(xc.data(), rows, e, *g, bias_data(gate_proj), *u, bias_data(up_proj), *d,
                               bias_data(down_proj), y.data(), e);
      return ad::Var(y);
    }
  }
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
                                   const std::shared_ptr<const RopeTable>& rope, int64_t last, Tensor* probs,
                                   const Tensor& attention_mask) const {
  const ad::Var h =
      self_attn.forward(c, input_layernorm.forward(c, x), offset, cache, positions, rope, last, probs, attention_mask);
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
