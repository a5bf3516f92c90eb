// Helpers shared by the transformer modules (mask options, the causal mask, xavier re-init) and nn::Transformer,
// the encoder-decoder of torch.nn.Transformer with both final norms.
#include <cmath>
#include <limits>
#include <string>

#include "qkv/core/error.h"
#include "qkv/nn/init.h"
#include "qkv/nn/transformer.h"
#include "transformer_common.h"

namespace qkv::nn {
namespace detail {

// Checks a layer config before any member is built, so errors name the layer. Returns d_model.
int64_t checked_layer_config(const TransformerLayerConfig& c, const char* op) {
  QKV_CHECK_ARG(c.d_model > 0 && c.nhead > 0 && c.dim_feedforward > 0, "[", op, "] d_model ", c.d_model,
                ", nhead ", c.nhead, " and dim_feedforward ", c.dim_feedforward, " must be > 0");
  QKV_CHECK_ARG(c.d_model % c.nhead == 0, "[", op, "] d_model ", c.d_model, " must be divisible by nhead ",
                c.nhead);
  QKV_CHECK_ARG(c.dropout >= 0.0f && c.dropout < 1.0f, "[", op, "] dropout must be in [0, 1), got ", c.dropout);
  QKV_CHECK_ARG(!c.attn_scale || std::isfinite(*c.attn_scale), "[", op, "] attn_scale must be finite");
  QKV_CHECK_ARG(c.layer_norm_eps > 0.0f && std::isfinite(c.layer_norm_eps), "[", op,
                "] layer_norm_eps must be positive and finite, got ", c.layer_norm_eps);
  return c.d_model;
}

void check_sequence(const Tensor& x, int64_t d_model, const char* op, const char* name, bool packed) {
  QKV_CHECK_ARG(x.defined(), "[", op, "] ", name, " is undefined");
  if (packed) {
    QKV_CHECK_ARG(x.dim() == 2 && x.size(1) == d_model, "[", op, "] packed ", name, " ", str(x.shape()),
                  " must be (N, d_model) with d_model = ", d_model);
    return;
  }
  QKV_CHECK_ARG(x.dim() == 3 && x.size(2) == d_model, "[", op, "] ", name, " ", str(x.shape()),
                " must be (B, T, d_model) with d_model = ", d_model);
}

}  // namespace detail

MhaForwardOptions to_mha_options(const AttentionMasks& m) {
  MhaForwardOptions o;
  o.attn_mask = m.mask;
  o.attn_mask_kind = m.mask_kind;
  o.key_padding_mask = m.key_padding_mask;
  o.key_padding_mask_kind = m.key_padding_mask_kind;
  o.attn_bias = m.attn_bias;
  o.is_causal = m.is_causal;
  o.cu_seqlens = m.cu_seqlens;
  o.need_weights = false;
  return o;
}

Tensor generate_square_subsequent_mask(int64_t T) {
  QKV_CHECK_ARG(T >= 0, "[generate_square_subsequent_mask] T must be >= 0, got ", T);
  Tensor m = Tensor::zeros({T, T});
  float* p = m.data();
  const float ninf = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < T; ++i)
    for (int64_t j = i + 1; j < T; ++j) p[i * T + j] = ninf;
  return m;
}

void xavier_uniform_reset(Module& module, Rng& rng) {
  for (auto& [name, p] : module.named_parameters()) {
    if (p->dim() <= 1) continue;
    // torch's fan computation: fan_in = size(1) * receptive, fan_out = size(0) * receptive.
    int64_t receptive = 1;
    for (int64_t d = 2; d < p->dim(); ++d) receptive *= p->size(d);
    const int64_t fan_in = p->size(1) * receptive, fan_out = p->size(0) * receptive;
    if (fan_in + fan_out == 0) continue;
    const float a = std::sqrt(6.0f / static_cast<float>(fan_in + fan_out));
    p->copy_from(init_uniform(rng, p->shape(), -a, a));
  }
}

namespace {
const TransformerConfig& checked_config(const TransformerConfig& c) {
  detail::checked_layer_config(c.layer, "Transformer");
  QKV_CHECK_ARG(c.num_encoder_layers >= 0 && c.num_decoder_layers >= 0, "[Transformer] num_encoder_layers ",
                c.num_encoder_layers, " and num_decoder_layers ", c.num_decoder_layers, " must be >= 0");
  return c;
}
}  // namespace

Transformer::Transformer(const TransformerConfig& c, Rng& rng)
    : encoder(checked_config(c).layer, c.num_encoder_layers, true, rng),
      decoder(c.layer, c.num_decoder_layers, true, rng),
      config_(c) {
  register_module("encoder", &encoder);
  register_module("decoder", &decoder);
  xavier_uniform_reset(*this, rng);
}

ad::Var Transformer::forward(const Context& c, const ad::Var& src, const ad::Var& tgt, const AttentionMasks& src_masks,
                             const AttentionMasks& tgt_masks, const AttentionMasks& memory_masks) const {
  detail::check_sequence(src.value, config_.layer.d_model, "Transformer", "src");
  detail::check_sequence(tgt.value, config_.layer.d_model, "Transformer", "tgt");
  QKV_CHECK_ARG(src.size(0) == tgt.size(0), "[Transformer] src ", str(src.shape()), " and tgt ", str(tgt.shape()),
                " must have the same batch size");
  return decoder.forward(c, tgt, encoder.forward(c, src, src_masks), tgt_masks, memory_masks);
}

Tensor Transformer::forward(const Tensor& src, const Tensor& tgt, const AttentionMasks& src_masks,
                            const AttentionMasks& tgt_masks, const AttentionMasks& memory_masks) {
  Rng* rng = encoder.layers.empty() ? nullptr : &encoder.layers[0]->dropout1.rng();
  return forward(Context(rng), src, tgt, src_masks, tgt_masks, memory_masks).value;
}

}  // namespace qkv::nn
