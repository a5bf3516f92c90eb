// The experiments' Transformer encoder: embeddings (+ absolute positions), AblationEncoderLayer stack with the
// config's residual / LayerNorm / positional options, and the output projection.
#include "tagger.h"

#include <cmath>
#include <string>
#include <utility>

#include "qkv/core/error.h"
#include "qkv/nn/positional.h"
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

// The encoder layers' config for a Tagger config, which is checked first so errors name the Tagger.
AblationLayerConfig layer_config(const TaggerConfig& c) {
  QKV_CHECK_ARG(c.vocab_in > 0 && c.vocab_out > 0 && c.d_model > 0 && c.heads > 0 && c.d_model % c.heads == 0 &&
                    c.ff > 0 && c.layers >= 1 && c.max_len >= 1 && c.shaw_clip >= 0,
                "[Tagger] bad config: vocab ", c.vocab_in, "/", c.vocab_out, ", d_model ", c.d_model, ", heads ",
                c.heads, ", ff ", c.ff, ", layers ", c.layers, ", shaw_clip ", c.shaw_clip);
  AblationLayerConfig a;
  nn::TransformerLayerConfig& l = a.layer;
  l.d_model = c.d_model;
  l.nhead = c.heads;
  l.dim_feedforward = c.ff;
  l.dropout = 0.0f;
  l.activation = nn::Activation::kRelu;
  l.norm_first = c.norm == NormKind::kPre;
  l.rotary = c.pos == PosKind::kRope;
  if (!c.scaled) l.attn_scale = 1.0f;
  a.layer_norm = c.norm != NormKind::kNone;
  a.residual = c.residual;
  a.relative = c.pos == PosKind::kShaw;
  a.relative_clip = c.shaw_clip;
  return a;
}

}  // namespace

Tagger::Tagger(const TaggerConfig& c, Rng& rng) : Tagger(c, rng, Rng(0)) {}

Tagger::Tagger(const TaggerConfig& c, Rng& rng, Rng&& scratch) : config_(c) {
  const AblationLayerConfig lc = layer_config(c);
  for (int64_t l = 0; l < c.layers; ++l) layers_.push_back(std::make_unique<AblationEncoderLayer>(lc, scratch));
  if (c.norm == NormKind::kPre) norm_ = std::make_unique<nn::LayerNorm>(c.d_model, lc.layer.layer_norm_eps);
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
  const float xavier = std::sqrt(6.0f / static_cast<float>(E + 3 * E));
  for (int64_t l = 0; l < c.layers; ++l) {
    AblationEncoderLayer& L = *layers_[static_cast<size_t>(l)];
    L.self_attn.in_proj_weight.copy_from(uniform(rng, {3 * E, E}, xavier));
    L.self_attn.out_proj.weight.copy_from(uniform(rng, {E, E}, 1.0f / std::sqrt(static_cast<float>(E))));
    L.ff.linear1.weight.copy_from(uniform(rng, {c.ff, E}, 1.0f / std::sqrt(static_cast<float>(E))));
    L.ff.linear2.weight.copy_from(uniform(rng, {E, c.ff}, 1.0f / std::sqrt(static_cast<float>(c.ff))));
    L.ff.linear1.bias.fill(0.0f);  // the attention biases start at zero already
    L.ff.linear2.bias.fill(0.0f);
    if (c.pos == PosKind::kShaw) {
      L.rel_k.copy_from(rng.normal({2 * c.shaw_clip + 1, D}, 0.0f, 0.5f));
      L.rel_v.copy_from(rng.normal({2 * c.shaw_clip + 1, D}, 0.0f, 0.5f));
    }
    register_module("layers." + std::to_string(l), &L);
  }
  if (norm_) register_module("norm", norm_.get());
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

Var Tagger::forward_embedded(const nn::Context& g, const Var& x, const TaggerRun& run) const {
  const TaggerConfig& c = config_;
  QKV_CHECK_ARG(x.dim() == 3 && x.size(2) == c.d_model, "[Tagger] x must be (B, T, ", c.d_model, "), got ",
                str(x.shape()));
  const int64_t B = x.size(0), T = x.size(1), H = c.heads;
  QKV_CHECK_ARG(run.head_mask.empty() || static_cast<int64_t>(run.head_mask.size()) == c.layers * H,
                "[Tagger] head_mask needs ", c.layers * H, " values, got ", run.head_mask.size());
  nn::AttentionMasks m;
  if (run.key_padding.defined()) {
    QKV_CHECK_ARG(run.key_padding.dim() == 2 && run.key_padding.size(0) == B && run.key_padding.size(1) == T,
                  "[Tagger] key_padding must be (", B, ", ", T, "), got ", str(run.key_padding.shape()));
    m.key_padding_mask = run.key_padding;  // nonzero = padding
  }
  if (c.pos == PosKind::kAlibi) m.attn_bias = alibi_bias(H, T, T, AlibiMode::kSymmetric);
  if (c.pos == PosKind::kT5) m.trained_bias = ad::t5_bias(g.param(t5_table_), T, T, true, c.t5_max_distance);
  const Tensor gates = run.head_mask.empty() ? Tensor() : Tensor::from_vector({c.layers, H}, run.head_mask);
  std::vector<Tensor> weights(run.attention ? layers_.size() : 0);  // every layer's when run.attention asks
  Var y = x;
  for (size_t l = 0; l < layers_.size(); ++l)
    y = layers_[l]->forward(g, y, m, gates.defined() ? gates.select(0, static_cast<int64_t>(l)) : Tensor(),
                            run.attention ? &weights[l] : nullptr);
  if (norm_) y = norm_->forward(g, y);
  if (run.attention) *run.attention = std::move(weights);
  return ad::linear(y, g.param(w_out_), g.param(b_out_));
}

Tensor tagger_logits(const Tagger& m, const Ids& ids, const TaggerRun& run) {
  ad::Tape tape;
  ad::ParameterSet none;
  nn::Context g(tape, none);
  return m.forward(g, ids, run).value;
}

}  // namespace qkv::experiments
