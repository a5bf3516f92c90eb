// The experiments' configurable Transformer encoder ("tagger": one output token per input position), built on the
// training tape so one forward serves training and inference. Every knob the article's claims turn on is exposed:
// positional encoding, 1/sqrt(d_k) scaling, residuals, LayerNorm placement, per-head masks, attention capture.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "qkv/core/rng.h"
#include "qkv/core/tensor.h"
#include "qkv/nn/module.h"
#include "qkv/ops/embedding.h"
#include "qkv/nn/context.h"

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
  std::vector<Tensor>* attention = nullptr;  // when set (inference only): per layer, weights (B, H, T, T)
};

class Tagger : public nn::Module {
 public:
  Tagger(const TaggerConfig& config, Rng& rng);
  const TaggerConfig& config() const { return config_; }

  // ids (B, T) -> logits (B, T, vocab_out). Builds on g's tape (constants when g has no parameters bound).
  ad::Var forward(const nn::Context& g, const Ids& ids, const TaggerRun& run = {}) const;
  // The same on continuous inputs: x (B, T, d_model) already embedded (used by the permutation check).
  ad::Var forward_embedded(const nn::Context& g, const ad::Var& x, const TaggerRun& run = {}) const;

 private:
  struct Layer {
    Tensor w_qkv, b_qkv, w_o, b_o, ln1_w, ln1_b, w1, b1, w2, b2, ln2_w, ln2_b, rel_k, rel_v;
  };
  TaggerConfig config_;
  Tensor tok_emb_, pos_emb_, t5_table_, lnf_w_, lnf_b_, w_out_, b_out_;
  std::vector<Layer> layers_;
};

// Inference helper: logits with no tape (eval), for evaluation loops.
Tensor tagger_logits(const Tagger& m, const Ids& ids, const TaggerRun& run = {});

}  // namespace qkv::experiments
