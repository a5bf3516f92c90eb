// LlamaAttention: HF's q/k/v/o projections and head counts over the attention core (nn::attend), which runs the
// rotary positions, grouped-query heads, sliding window, soft-capping, masks and the KV cache (contiguous, paged).
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "qkv/core/error.h"
#include "qkv/models/llama.h"
#include "qkv/nn/attention_core.h"
#include "qkv/ops/functional.h"
#include "stored_weights.h"

namespace qkv::models {

LlamaAttention::LlamaAttention(const LlamaConfig& c, int64_t layer, Rng& rng)
    : q_proj(c.hidden_size, c.num_attention_heads * c.head_dim, c.attention_bias || c.qkv_bias, rng),
      k_proj(c.hidden_size, c.num_key_value_heads * c.head_dim, c.attention_bias || c.qkv_bias, rng),
      v_proj(c.hidden_size, c.num_key_value_heads * c.head_dim, c.attention_bias || c.qkv_bias, rng),
      o_proj(c.num_attention_heads * c.head_dim, c.hidden_size, c.attention_bias, rng),
      config_(c),
      sliding_(c.sliding_window > 0 && c.layer_sliding.at(static_cast<size_t>(layer))) {
  register_module("q_proj", &q_proj);
  register_module("k_proj", &k_proj);
  register_module("v_proj", &v_proj);
  register_module("o_proj", &o_proj);
}

ad::Var LlamaAttention::forward(const nn::Context& c, const ad::Var& x, int64_t offset, nn::KvCache* cache,
                                const std::vector<int64_t>* positions,
                                const std::shared_ptr<const RopeTable>& rope, int64_t last, Tensor* probs,
                                const Tensor& attention_mask) const {
  const LlamaConfig& k = config_;
  QKV_CHECK_ARG(x.dim() == 3 && x.size(2) == k.hidden_size, "[llama] attention input ", str(x.shape()),
                " must be (B, T, ", k.hidden_size, ")");
  const int64_t b = x.size(0), t = x.size(1), d = k.head_dim, hq = k.num_attention_heads,
                hkv = k.num_key_value_heads;
  QKV_CHECK_ARG(last >= 0, "[llama] last must be >= 0, got ", last, " for the attention input ", str(x.shape()));
  const nn::SequenceShard* shard = c.sequence_shard();
  // The queries of the last tq rows (all by default): causal and window masks are aligned bottom-right, so those
  // rows see the keys they see in the full product.
  const int64_t tq = last > 0 && last < t ? last : t;
  QKV_CHECK_ARG(shard == nullptr || tq == t, "[llama] the last ", last, " rows of the attention input ",
                str(x.shape()), " under context parallelism (every shard's queries run around the ring)");
  QKV_CHECK_ARG(shard == nullptr || probs == nullptr, "[llama] attention probabilities of the input ", str(x.shape()),
                " under context parallelism (the keys are spread over the ring)");
  QKV_CHECK_ARG(shard == nullptr || !sliding_, "[llama] sliding_window ", k.sliding_window, " with the input ",
                str(x.shape()), ": context parallelism (ring attention) has no sliding window; use sliding_window 0");
  if (positions != nullptr)
    QKV_CHECK_ARG(static_cast<int64_t>(positions->size()) == t && !cache, "[llama] ", positions->size(),
                  " positions for the attention input ", str(x.shape()), cache ? " with a KV cache" : "");
  QKV_CHECK_ARG(cache == nullptr || !c.tape(), "[llama] a KV cache is for inference only");
  const int64_t keys = (cache != nullptr && cache->ready() ? cache->length() : 0) + t;
  QKV_CHECK_ARG(!attention_mask.defined() || attention_mask.shape() == (Shape{b, keys}), "[llama] attention_mask ",
                attention_mask.defined() ? str(attention_mask.shape()) : "()", " must be (B, T_keys) = ",
                str(Shape{b, keys}), " for the input ", str(x.shape()));
  ad::Var qx, kx, vx;
  const kernels::QuantMatrix* wq = detail::stored_integer_weight(q_proj);
  const kernels::QuantMatrix* wk = detail::stored_integer_weight(k_proj);
  const kernels::QuantMatrix* wv = detail::stored_integer_weight(v_proj);
  if (c.tape() == nullptr && x.value.defined() && tq == t && wq && wk && wv && wq->cols == k.hidden_size &&
      wk->cols == k.hidden_size && wv->cols == k.hidden_size && detail::bias_ok(q_proj) && detail::bias_ok(k_proj) &&
      detail::bias_ok(v_proj)) {
    // Inference on a GGUF's integer-product weights: Q, K and V in one call (x quantized once, one parallel region),
    // the bits of the three products.
    const Tensor xc = x.value.contiguous();
    Tensor yq = Tensor::empty({b, t, wq->rows}), yk = Tensor::empty({b, t, wk->rows}),
           yv = Tensor::empty({b, t, wv->rows});
    const kernels::QuantProduct p[3] = {{wq, detail::bias_data(q_proj), yq.data(), wq->rows},
                                        {wk, detail::bias_data(k_proj), yk.data(), wk->rows},
                                        {wv, detail::bias_data(v_proj), yv.data(), wv->rows}};
    kernels::gemm_quant_many(xc.data(), b * t, k.hidden_size, p, 3);
    qx = ad::Var(yq);
    kx = ad::Var(yk);
    vx = ad::Var(yv);
  } else {
    qx = q_proj.forward(c, tq < t ? ad::slice(x, 1, t - tq, t) : x);
    kx = k_proj.forward(c, x);
    vx = v_proj.forward(c, x);
  }
  // (B, T, H·D) -> (B, H, T, D) views
  const ad::Var q = ad::permute(ad::reshape(qx, {b, tq, hq, d}), {0, 2, 1, 3});
  const ad::Var kk = ad::permute(ad::reshape(kx, {b, t, hkv, d}), {0, 2, 1, 3});
  const ad::Var v = ad::permute(ad::reshape(vx, {b, t, hkv, d}), {0, 2, 1, 3});

  // The core: HF's rotary angles (the model's shared table), causal bottom-right (the new positions follow the
  // cached ones), the window W as window_size (W - 1, 0) and soft-capping, so the fused kernels skip key tiles
  // outside the window; grouped-query heads read in place.
  nn::AttendOptions o;
  o.op = "llama";
  o.attention.precision = attention_precision();
  o.attention.scale = k.attention_scale > 0.0f ? k.attention_scale : 1.0f / std::sqrt(static_cast<float>(d));
  o.attention.causal = Causal::kBottomRight;
  if (sliding_) {
    o.attention.window_left = k.sliding_window - 1;
    o.attention.window_right = 0;
  }
  o.attention.softcap = k.attn_logit_softcapping;
  if (attention_mask.defined()) {  // (B, T_keys) -> (B, 1, 1, T_keys), HF's 1 = attend
    o.attention.mask = attention_mask.unsqueeze(1).unsqueeze(1);
    o.attention.mask_kind = MaskKind::kKeep;
  }
  o.rotary.enabled = true;
  o.rotary.base = k.rope_theta;
  o.rotary.scaling = k.rope_scaling;
  o.rotary.table = rope;
  o.rotary.positions = positions;
  o.offset = offset;
  o.query_first = t - tq;
  o.cache = cache;
  o.weights = probs != nullptr ? nn::AttendWeights::kRecomputed : nn::AttendWeights::kNone;
  nn::AttendResult r = nn::attend(c, q, kk, v, o);
  if (probs != nullptr) *probs = r.weights;
  // (B, Hq, T, D) -> (B, T, Hq·D)
  return o_proj.forward(c, ad::reshape(ad::permute(r.out, {0, 2, 1, 3}), {b, tq, hq * d}));
}

}  // namespace qkv::models
