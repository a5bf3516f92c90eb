// The experiments' Transformer encoder: embeddings (+ absolute positions), L layers of multi-head self-attention and
// a ReLU feed-forward block with configurable residuals / LayerNorm, relative or rotary positions inside attention.
#include "tagger.h"

#include <cmath>
#include <limits>

#include "qkv/core/error.h"
#include "qkv/nn/positional.h"
#include "qkv/ops/attention.h"
#include "qkv/ops/elementwise.h"
#include "qkv/ops/functional.h"

namespace qkv::experiments {

using ad::Var;

const char* pos_name(PosKind p) {
  switch (p) {
    case PosKind::kNone: return "none";
    case PosKind::kSinusoidal: return "sinusoidal";
    case PosKind::kLearned: return "learned";
    case PosKind::kShaw: return "Shaw";
    case PosKind::kT5: return "T5";
    case PosKind::kRope: return "RoPE";
    case PosKind::kAlibi: return "ALiBi";
  }
  return "?";
}

const std::vector<PosKind>& all_pos_kinds() {
  static const std::vector<PosKind> k = {PosKind::kNone, PosKind::kSinusoidal, PosKind::kLearned, PosKind::kShaw,
                                         PosKind::kT5,   PosKind::kRope,       PosKind::kAlibi};
  return k;
}

namespace {

Tensor uniform(Rng& rng, const Shape& shape, float bound) { return rng.uniform(shape, -bound, bound); }

}  // namespace

Tagger::Tagger(const TaggerConfig& c, Rng& rng) : config_(c) {
  QKV_CHECK_ARG(c.vocab_in > 0 && c.vocab_out > 0 && c.d_model > 0 && c.heads > 0 && c.d_model % c.heads == 0 &&
                    c.ff > 0 && c.layers >= 1 && c.max_len >= 1,
                "[Tagger] bad config: vocab ", c.vocab_in, "/", c.vocab_out, ", d_model ", c.d_model, ", heads ",
                c.heads, ", ff ", c.ff, ", layers ", c.layers);
  const int64_t E = c.d_model, D = E / c.heads;
  tok_emb_ = rng.normal({c.vocab_in, E}, 0.0f, c.embed_std);
  register_parameter("tok_emb.weight", &tok_emb_);
  if (c.pos == PosKind::kLearned) {
    pos_emb_ = rng.normal({c.max_len, E}, 0.0f, c.embed_std);
    register_parameter("pos_emb.weight", &pos_emb_);
  }
  if (c.pos == PosKind::kT5) {
    t5_table_ = rng.normal({c.t5_buckets, c.heads}, 0.0f, 0.5f);
    register_parameter("relative_attention_bias.weight", &t5_table_);
  }
  layers_.resize(static_cast<size_t>(c.layers));  // never resized again: parameters are registered by address
  const float xavier = std::sqrt(6.0f / static_cast<float>(E + 3 * E));
  for (int64_t l = 0; l < c.layers; ++l) {
    Layer& L = layers_[static_cast<size_t>(l)];
    const std::string p = "layers." + std::to_string(l) + ".";
    L.w_qkv = uniform(rng, {3 * E, E}, xavier);
    L.b_qkv = Tensor::zeros({3 * E});
    L.w_o = uniform(rng, {E, E}, 1.0f / std::sqrt(static_cast<float>(E)));
    L.b_o = Tensor::zeros({E});
    L.w1 = uniform(rng, {c.ff, E}, 1.0f / std::sqrt(static_cast<float>(E)));
    L.b1 = Tensor::zeros({c.ff});
    L.w2 = uniform(rng, {E, c.ff}, 1.0f / std::sqrt(static_cast<float>(c.ff)));
    L.b2 = Tensor::zeros({E});
    register_parameter(p + "self_attn.in_proj_weight", &L.w_qkv);
    register_parameter(p + "self_attn.in_proj_bias", &L.b_qkv);
    register_parameter(p + "self_attn.out_proj.weight", &L.w_o);
    register_parameter(p + "self_attn.out_proj.bias", &L.b_o);
    register_parameter(p + "linear1.weight", &L.w1);
    register_parameter(p + "linear1.bias", &L.b1);
    register_parameter(p + "linear2.weight", &L.w2);
    register_parameter(p + "linear2.bias", &L.b2);
    if (c.norm != NormKind::kNone) {
      L.ln1_w = Tensor::ones({E});
      L.ln1_b = Tensor::zeros({E});
      L.ln2_w = Tensor::ones({E});
      L.ln2_b = Tensor::zeros({E});
      register_parameter(p + "norm1.weight", &L.ln1_w);
      register_parameter(p + "norm1.bias", &L.ln1_b);
      register_parameter(p + "norm2.weight", &L.ln2_w);
      register_parameter(p + "norm2.bias", &L.ln2_b);
    }
    if (c.pos == PosKind::kShaw) {
      L.rel_k = rng.normal({2 * c.shaw_clip + 1, D}, 0.0f, 0.5f);
      L.rel_v = rng.normal({2 * c.shaw_clip + 1, D}, 0.0f, 0.5f);
      register_parameter(p + "rel_k", &L.rel_k);
      register_parameter(p + "rel_v", &L.rel_v);
    }
  }
  if (c.norm == NormKind::kPre) {
    lnf_w_ = Tensor::ones({E});
    lnf_b_ = Tensor::zeros({E});
    register_parameter("norm.weight", &lnf_w_);
    register_parameter("norm.bias", &lnf_b_);
  }
  w_out_ = uniform(rng, {c.vocab_out, E}, 1.0f / std::sqrt(static_cast<float>(E)));
  b_out_ = Tensor::zeros({c.vocab_out});
  register_parameter("out.weight", &w_out_);
  register_parameter("out.bias", &b_out_);
}

Var Tagger::forward(const nn::Context& g, const Ids& ids, const TaggerRun& run) const {
  QKV_CHECK_ARG(ids.shape.size() == 2, "[Tagger] ids must be (B, T), got ", str(ids.shape));
  QKV_CHECK_ARG(config_.pos != PosKind::kLearned || ids.shape[1] <= config_.max_len, "[Tagger] length ",
                ids.shape[1], " exceeds the learned table's ", config_.max_len, " rows");
  Var x = ad::embedding(g.param(tok_emb_), ids);
  if (config_.pos == PosKind::kSinusoidal) x = ad::add_sinusoidal(x);
  if (config_.pos == PosKind::kLearned) x = ad::add_learned_positions(x, g.param(pos_emb_));
  return forward_embedded(g, x, run);
}

Var Tagger::forward_embedded(const nn::Context& g, const Var& x_in, const TaggerRun& run) const {
  const TaggerConfig& c = config_;
  QKV_CHECK_ARG(x_in.dim() == 3 && x_in.size(2) == c.d_model, "[Tagger] x must be (B, T, ", c.d_model, "), got ",
                str(x_in.shape()));
  const int64_t B = x_in.size(0), T = x_in.size(1), E = c.d_model, H = c.heads, D = E / H;
  QKV_CHECK_ARG(run.head_mask.empty() || static_cast<int64_t>(run.head_mask.size()) == c.layers * H,
                "[Tagger] head_mask needs ", c.layers * H, " values, got ", run.head_mask.size());

  // Constant additive mask: key padding (B, 1, 1, T) and/or ALiBi (1, H, T, T).
  Tensor mask;
  if (run.key_padding.defined()) {
    QKV_CHECK_ARG(run.key_padding.dim() == 2 && run.key_padding.size(0) == B && run.key_padding.size(1) == T,
                  "[Tagger] key_padding must be (", B, ", ", T, "), got ", str(run.key_padding.shape()));
    mask = Tensor::zeros({B, 1, 1, T});
    const Tensor kp = run.key_padding.contiguous();
    for (int64_t i = 0; i < B * T; ++i)
      if (kp.data()[i] != 0.0f) mask.data()[i] = -std::numeric_limits<float>::infinity();
  }
  if (c.pos == PosKind::kAlibi) {
    const Tensor a = alibi_bias(H, T, T, AlibiMode::kSymmetric);
    mask = mask.defined() ? add(mask, a) : a;
  }
  AttentionOptions opts;
  if (mask.defined()) {
    opts.mask = mask;
    opts.mask_kind = MaskKind::kAdditive;
  }
  if (!c.scaled) opts.scale = 1.0f;
  Var t5;
  if (c.pos == PosKind::kT5) t5 = ad::t5_bias(g.param(t5_table_), T, T, true, c.t5_max_distance);

  Var x = x_in;
  for (int64_t l = 0; l < c.layers; ++l) {
    const Layer& L = layers_[static_cast<size_t>(l)];
    auto ln = [&](const Var& v, const Tensor& w, const Tensor& b) { return ad::layer_norm(v, g.param(w), g.param(b)); };
    // --- self-attention block ---
    const Var h = c.norm == NormKind::kPre ? ln(x, L.ln1_w, L.ln1_b) : x;
    const Var qkv = ad::reshape(ad::linear(h, g.param(L.w_qkv), g.param(L.b_qkv)), {B, T, 3, H, D});
    Var q = ad::transpose(ad::select(qkv, 2, 0), 1, 2);  // (B, H, T, D)
    Var k = ad::transpose(ad::select(qkv, 2, 1), 1, 2);
    const Var v = ad::transpose(ad::select(qkv, 2, 2), 1, 2);
    if (c.pos == PosKind::kRope) {
      q = ad::rope(q);
      k = ad::rope(k);
    }
    Var o;
    if (c.pos == PosKind::kShaw) {
      o = ad::relative_attention(q, k, v, g.param(L.rel_k), g.param(L.rel_v), c.shaw_clip, opts);
    } else {
      ad::AttentionExtras extras;
      extras.bias = t5;
      o = ad::attention(q, k, v, opts, extras);
    }
    if (run.attention) {  // the weights, recomputed on values (inference only)
      AttentionOptions wo = opts;
      wo.return_weights = true;
      if (c.pos == PosKind::kShaw) {
        run.attention->push_back(
            relative_attention(q.value, k.value, v.value, L.rel_k, L.rel_v, c.shaw_clip, wo).weights);
      } else {
        if (t5.defined()) {
          wo.mask = wo.mask.defined() ? add(wo.mask, t5.value) : t5.value;
          wo.mask_kind = MaskKind::kAdditive;
        }
        run.attention->push_back(attention_reference(q.value, k.value, v.value, wo).weights);
      }
    }
    if (!run.head_mask.empty()) {
      Tensor hm = Tensor::zeros({1, H, 1, 1});
      for (int64_t i = 0; i < H; ++i) hm.data()[i] = run.head_mask[static_cast<size_t>(l * H + i)];
      o = ad::mul(o, Var(hm));
    }
    const Var merged = ad::reshape(ad::transpose(o, 1, 2), {B, T, E});
    const Var a = ad::linear(merged, g.param(L.w_o), g.param(L.b_o));
    x = c.residual ? ad::add(x, a) : a;
    if (c.norm == NormKind::kPost) x = ln(x, L.ln1_w, L.ln1_b);
    // --- feed-forward block ---
    const Var h2 = c.norm == NormKind::kPre ? ln(x, L.ln2_w, L.ln2_b) : x;
    const Var f = ad::linear(ad::relu(ad::linear(h2, g.param(L.w1), g.param(L.b1))), g.param(L.w2),
                                g.param(L.b2));
    x = c.residual ? ad::add(x, f) : f;
    if (c.norm == NormKind::kPost) x = ln(x, L.ln2_w, L.ln2_b);
  }
  if (c.norm == NormKind::kPre) x = ad::layer_norm(x, g.param(lnf_w_), g.param(lnf_b_));
  return ad::linear(x, g.param(w_out_), g.param(b_out_));
}

Tensor tagger_logits(const Tagger& m, const Ids& ids, const TaggerRun& run) {
  ad::Tape tape;
  ad::ParameterSet none;
  nn::Context g(tape, none);
  return m.forward(g, ids, run).value;
}

}  // namespace qkv::experiments
