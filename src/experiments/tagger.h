// The experiments' configurable Transformer encoder ("tagger": one output token per input position): embeddings,
// a stack of AblationEncoderLayer (final LayerNorm for pre-LN) and an output projection, on the training tape
// so one forward serves training and inference. Every knob the article's claims turn on is exposed: positional
// encoding, 1/sqrt(d_k) scaling, residuals, LayerNorm placement, per-head masks, attention capture.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "qkv/core/rng.h"
#include "qkv/core/tensor.h"
#include "qkv/nn/module.h"
#include "qkv/nn/transformer.h"
#include "qkv/ops/embedding.h"
#include "qkv/nn/context.h"
#include "ablation_layer.h"

namespace qkv::experiments {

enum class PosKind { kNone, kSinusoidal, kLearned, kShaw, kT5, kRope, kAlibi };
const char* pos_name(PosKind p);  // "none", "sinusoidal", "learned", "Shaw", "T5", "RoPE", "ALiBi"
const std::vector<PosKind>& all_pos_kinds();

enum class NormKind { kPre, kPost, kNone };

struct TaggerConfig {
  int64_t vocab_in = 0, vocab_out = 0;  // > 0
  int64_t d_model = 64, heads = 4, ff = 128, layers = 2;
  int64_t max_len = 64;                 // learned positions: table rows
  PosKind pos = PosKind::kSinusoidal;
  NormKind norm = NormKind::kPre;       // kPre: x + f(LN(x)) and a final LN; kPost: LN(x + f(x)); kNone: no LN
  bool residual = true;
  bool scaled = true;                   // scores · 1/sqrt(d_k), else · 1
  int64_t shaw_clip = 16;
  int64_t t5_buckets = 32, t5_max_distance = 128;
  float embed_std = 1.0f;               // token (and learned position) embeddings ~ N(0, embed_std)
};

// Per-forward options.
struct TaggerRun {
  Tensor key_padding;             // (B, T) 1 = padding (ignored as a key), or undefined
  std::vector<float> head_mask;   // empty, or layers·heads multipliers of each head's output (ablation)
  std::vector<Tensor>* attention = nullptr;  // when set (inference only): replaced by per-layer weights (B, H, T, T)
};

// Parameters: tok_emb.weight, pos_emb.weight (learned), relative_attention_bias.weight (T5 table), the
// AblationEncoderLayer stack's layers.N.{self_attn.*, linear1.*, linear2.*, norm1.*, norm2.* (with LayerNorm),
// rel_k, rel_v (Shaw)}, norm.* (pre-LN), out.{weight,bias}. Init: token / position embeddings N(0, embed_std), in_proj xavier-uniform, out_proj and the
// feed-forward weights U(±1/sqrt(fan_in)), relative tables N(0, 0.5), zero biases, drawn from `rng` in that order.
class Tagger : public nn::Module {
 public:
  Tagger(const TaggerConfig& config, Rng& rng);
  const TaggerConfig& config() const { return config_; }

  // ids (B, T) -> logits (B, T, vocab_out). Builds on g's tape (constants when g has no parameters bound).
  ad::Var forward(const nn::Context& g, const Ids& ids, const TaggerRun& run = {}) const;
  // The same on continuous inputs: x (B, T, d_model) already embedded (used by the permutation check).
  ad::Var forward_embedded(const nn::Context& g, const ad::Var& x, const TaggerRun& run = {}) const;

 private:
  // `scratch` serves the layers' own construction; every parameter is then drawn again from `rng`.
  Tagger(const TaggerConfig& config, Rng& rng, Rng&& scratch);
  TaggerConfig config_;
  Tensor tok_emb_, pos_emb_, t5_table_, w_out_, b_out_;
  std::vector<std::unique_ptr<AblationEncoderLayer>> layers_;
  std::unique_ptr<nn::LayerNorm> norm_;  // pre-LN's final norm, else null
};

// Inference helper: logits with no tape (eval), for evaluation loops.
Tensor tagger_logits(const Tagger& m, const Ids& ids, const TaggerRun& run = {});

}  // namespace qkv::experiments
