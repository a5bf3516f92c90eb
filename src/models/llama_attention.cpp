// LlamaAttention: rotary positions, grouped-query heads, HF's sliding window and logit soft-capping, and the KV
// cache (contiguous, or paged and read in place).
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "qkv/core/error.h"
#include "qkv/models/llama.h"
#include "qkv/ops/attention.h"
#include "qkv/ops/attention_varlen.h"
#include "qkv/ops/functional.h"
#include "qkv/ops/lowp.h"

namespace qkv::models {
namespace {

// The options of the attention of q (B, Hq, Tq, D) over k, v (B, Hkv, Tk, D): causal bottom-right (the new
// positions follow the cached ones), HF's sliding window W as window_size (W - 1, 0) and logit soft-capping, so
// the fused kernels skip key tiles outside the window; the caller sets enable_gqa (query head h reads kv head
// h / (Hq / Hkv); K/V never copied).
AttentionOptions attention_options(float scale, int64_t window, float softcap, Precision precision) {
  AttentionOptions o;
  o.precision = precision;
  o.scale = scale;
  o.causal = Causal::kBottomRight;
  if (window > 0) {
    o.window_left = window - 1;
    o.window_right = 0;
  }
  o.softcap = softcap;
  return o;
}

// The probabilities (B, Hq, Tq, Tk) of q (B, Hq, Tq, D) over the keys k (B, Hkv, Tk, D) under o, recomputed beside
// the fused kernel by the reference softmax (scale, soft-cap, causal alignment, window and GQA as the layer ran them;
// the values take no part: a zero column stands in for them).
Tensor attention_probabilities(const Tensor& q, const Tensor& k, AttentionOptions o) {
  o.return_weights = true;
  o.enable_gqa = q.size(1) != k.size(1);
  return attention_reference(q, k, Tensor::zeros({k.size(0), k.size(1), k.size(2), 1}), o).weights;
}

}  // namespace

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
                                const std::shared_ptr<const RopeTable>& rope, int64_t last, Tensor* probs) const {
  const LlamaConfig& k = config_;
  QKV_CHECK_ARG(x.dim() == 3 && x.size(2) == k.hidden_size, "[llama] attention input ", str(x.shape()),
                " must be (B, T, ", k.hidden_size, ")");
  const int64_t b = x.size(0), t = x.size(1), d = k.head_dim, hkv = k.num_key_value_heads;
  QKV_CHECK_ARG(last >= 0, "[llama] last must be >= 0, got ", last, " for the attention input ", str(x.shape()));
  const nn::SequenceShard* shard = c.sequence_shard();
  // The queries of the last tq rows (all by default): causal and window masks are aligned bottom-right, so those
  // rows see the keys they see in the full product.
  const int64_t tq = last > 0 && last < t ? last : t;
  QKV_CHECK_ARG(shard == nullptr || tq == t, "[llama] the last ", last, " rows of the attention input ",
                str(x.shape()), " under context parallelism (every shard's queries run around the ring)");
  QKV_CHECK_ARG(shard == nullptr || probs == nullptr, "[llama] attention probabilities of the input ", str(x.shape()),
                " under context parallelism (the keys are spread over the ring)");
  // (B, T, H·D) -> (B, H, T, D)
  ad::Var q = ad::permute(
      ad::reshape(q_proj.forward(c, tq < t ? ad::slice(x, 1, t - tq, t) : x), {b, tq, k.num_attention_heads, d}),
      {0, 2, 1, 3});
  ad::Var kk = ad::permute(ad::reshape(k_proj.forward(c, x), {b, t, hkv, d}), {0, 2, 1, 3});
  ad::Var v = ad::permute(ad::reshape(v_proj.forward(c, x), {b, t, hkv, d}), {0, 2, 1, 3});
  if (positions != nullptr)
    QKV_CHECK_ARG(static_cast<int64_t>(positions->size()) == t && !cache, "[llama] ", positions->size(),
                  " positions for the attention input ", str(x.shape()), cache ? " with a KV cache" : "");
  if (cache != nullptr && cache->ragged()) {
    // Rows at different positions (a server's running batch): row r's angles start at its own cache length.
    QKV_CHECK_ARG(!c.tape() && positions == nullptr && cache->rows() == b, "[llama] the ragged KV cache of ",
                  cache->rows(), " rows takes the input ", str(x.shape()), " at inference, without positions");
    Tensor qr = Tensor::empty({b, k.num_attention_heads, tq, d}), kr = Tensor::empty({b, hkv, t, d});
    for (int64_t r = 0; r < b; ++r) {
      const RopeTable angles = rope_table(cache->row_length(r), t, d, k.rope_theta, k.rope_scaling);
      qr.select(0, r).copy_from(
          rope_apply(q.value.select(0, r), tq < t ? rope_table_rows(angles, t - tq, tq) : angles));
      kr.select(0, r).copy_from(rope_apply(kk.value.select(0, r), angles));
    }
    q = ad::Var(qr);
    kk = ad::Var(kr);
  } else {
    const std::shared_ptr<const RopeTable> angles =
        rope != nullptr ? rope
                        : std::make_shared<const RopeTable>(
                              positions != nullptr ? rope_table(*positions, d, k.rope_theta, k.rope_scaling)
                                                   : rope_table(offset, t, d, k.rope_theta, k.rope_scaling));
    q = ad::rope(q, tq < t ? std::make_shared<const RopeTable>(rope_table_rows(*angles, t - tq, tq)) : angles,
                 RopeVariant::kHalfSplit);
    kk = ad::rope(kk, angles, RopeVariant::kHalfSplit);
  }
  const float scale = k.attention_scale > 0.0f ? k.attention_scale : 1.0f / std::sqrt(static_cast<float>(d));
  AttentionOptions o =
      attention_options(scale, sliding_ ? k.sliding_window : 0, k.attn_logit_softcapping, attention_precision());
  if (cache) {
    QKV_CHECK_ARG(!c.tape(), "[llama] a KV cache is for inference only");
    QKV_CHECK_ARG(cache->ready() && cache->rows() == b && cache->length() == offset, "[llama] the KV cache holds ",
                  cache->rows(), " rows of length ", cache->length(), "; the input is ", str(x.shape()),
                  " at position ", offset);
    // bf16: the cache holds the rounded keys and values, as attention() would round them at every step.
    const bool bf16 = o.precision == Precision::kBFloat16;
    cache->append(bf16 ? round_to_bf16(kk.value) : kk.value, bf16 ? round_to_bf16(v.value) : v.value);
    if (cache->paged()) {  // the pages read in place; q (B, Hq, T, D) as (B, T, Hq, D), out (B, T, Hq, D)
      if (probs) *probs = attention_probabilities(q.value, cache->keys(), o);
      Tensor kp = cache->key_pages(), vp = cache->value_pages();
      std::vector<int32_t> lens(static_cast<size_t>(b));
      for (int64_t r = 0; r < b; ++r) lens[static_cast<size_t>(r)] = static_cast<int32_t>(cache->row_length(r));
      const Tensor out = attention_with_kvcache(q.value.transpose(1, 2), kp, vp, Tensor(), Tensor(), lens,
                                                cache->block_table(), cache->max_pages(), o)
                             .out;
      return o_proj.forward(c, ad::Var(out.reshape({b, tq, k.num_attention_heads * d})));
    }
    kk = ad::Var(cache->keys());
    v = ad::Var(cache->values());
  }
  o.enable_gqa = q.size(1) != kk.size(1);
  if (probs) *probs = attention_probabilities(q.value, kk.value, o);
  QKV_CHECK_ARG(shard == nullptr || !sliding_, "[llama] sliding_window ", k.sliding_window, " with the input ",
                str(x.shape()), ": context parallelism (ring attention) has no sliding window; use sliding_window 0");
  const ad::Var out = shard != nullptr ? shard->attention(q, kk, v, o) : ad::attention(q, kk, v, o);
  // (B, Hq, T, D) -> (B, T, Hq·D)
  return o_proj.forward(c, ad::reshape(ad::permute(out, {0, 2, 1, 3}), {b, tq, k.num_attention_heads * d}));
}

}  // namespace qkv::models
