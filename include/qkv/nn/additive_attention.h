// Seq2Seq attention scorers: Bahdanau's additive score vᵀ tanh(W s + U h) and Luong's dot (sᵀh) and
// general (sᵀ W h) scores, with the masked softmax and the context vector c = Σ α_i h_i.
#pragma once

#include <cstdint>
#include <vector>

#include "qkv/core/rng.h"
#include "qkv/core/tensor.h"
#include "qkv/nn/context.h"
#include "qkv/nn/linear.h"
#include "qkv/nn/module.h"

namespace qkv::nn {

// lengths: B values in [0, T]  ->  keep mask (B, T): 1 where t < lengths[b], else 0.
Tensor lengths_to_keep_mask(const std::vector<int64_t>& lengths, int64_t max_len);

template <class T>
struct BasicAlignment {
  T weights;  // α: (B, Ts), or (B, Tq, Ts) for a (B, Tq, Hq) query
  T context;  // c = Σ_i α_i h_i: (B, Hk), or (B, Tq, Hk)
};
using AlignmentResult = BasicAlignment<Tensor>;
using AlignmentVars = BasicAlignment<ad::Var>;

// scores: (B, Ts) or (B, Tq, Ts)  keys: (B, Ts, Hk)  keep_mask: (B, Ts), nonzero = real source position, or
// undefined (all kept). Softmax over Ts of the kept positions; masked positions get weight 0; a row with every
// position masked gets weights 0 and context 0 (never NaN). Differentiable in scores and keys.
AlignmentVars align(const ad::Var& scores, const ad::Var& keys, const Tensor& keep_mask = {});
AlignmentResult align(const Tensor& scores, const Tensor& keys, const Tensor& keep_mask = {});

// A decoder-side scorer: compares a decoder state s with every encoder state h_i.
// Use: prepared = prepare(keys) once per source batch, then forward(s, keys, prepared, mask) every step.
class AttentionScorer : public Module {
 public:
  int64_t query_size() const { return query_size_; }
  int64_t key_size() const { return key_size_; }

  // keys: (B, Ts, Hk)  ->  the per-source cache the score needs (e.g. U·h_i), computed once.
  virtual ad::Var prepare(const Context& c, const ad::Var& keys) const = 0;
  Tensor prepare(const Tensor& keys) const { return prepare(Context(), keys).value; }
  // query: (B, Hq) or (B, Tq, Hq)  prepared: from prepare()  ->  scores (B, Ts) or (B, Tq, Ts), unmasked.
  virtual ad::Var score(const Context& c, const ad::Var& query, const ad::Var& prepared) const = 0;
  Tensor score(const Tensor& query, const Tensor& prepared) const { return score(Context(), query, prepared).value; }

  // score -> align, the scorer's one forward. query: (B, Hq) or (B, Tq, Hq)  keys: (B, Ts, Hk)
  // prepared: prepare(keys)  keep_mask: (B, Ts) or undefined.
  AlignmentVars forward(const Context& c, const ad::Var& query, const ad::Var& keys, const ad::Var& prepared,
                        const Tensor& keep_mask = {}) const;
  AlignmentResult forward(const Tensor& query, const Tensor& keys, const Tensor& prepared,
                          const Tensor& keep_mask = {}) const;
  // Convenience: prepare(keys) then forward, in one call (recomputes the cache; not for step loops).
  AlignmentResult attend(const Tensor& query, const Tensor& keys, const Tensor& keep_mask = {}) const;

 protected:
  AttentionScorer(const char* op, int64_t query_size, int64_t key_size);
  void check_keys(const Tensor& keys) const;
  // Returns query as (B, Tq, Hq), checking rank and last dim.
  ad::Var query3(const ad::Var& query) const;

  const char* op_;
  int64_t query_size_;
  int64_t key_size_;
};

// Bahdanau et al. (2015): score(s, h_i) = vᵀ tanh(W s + U h_i), no biases.
// Parameters: "W.weight" (A, Hq), "U.weight" (A, Hk), "v.weight" (1, A); init as nn.Linear.
// prepare(keys) = U·h_i: (B, Ts, A).
class BahdanauAttention : public AttentionScorer {
 public:
  BahdanauAttention(int64_t query_size, int64_t key_size, int64_t attention_size, Rng& rng);
  using AttentionScorer::prepare;
  using AttentionScorer::score;
  ad::Var prepare(const Context& c, const ad::Var& keys) const override;
  ad::Var score(const Context& c, const ad::Var& query, const ad::Var& prepared) const override;
  int64_t attention_size() const { return attention_size_; }

  Linear W;  // (A, Hq)
  Linear U;  // (A, Hk)
  Linear v;  // (1, A)

 private:
  int64_t attention_size_;
};

enum class LuongScore {
  kDot,      // sᵀ h_i; needs Hq == Hk; no parameters
  kGeneral,  // sᵀ W h_i; "W.weight" (Hq, Hk), no bias
};

// Luong et al. (2015) multiplicative scores. prepare(keys) = keys (dot) or W·h_i: (B, Ts, Hq) (general).
class LuongAttention : public AttentionScorer {
 public:
  LuongAttention(LuongScore kind, int64_t query_size, int64_t key_size, Rng& rng);
  using AttentionScorer::prepare;
  using AttentionScorer::score;
  ad::Var prepare(const Context& c, const ad::Var& keys) const override;
  ad::Var score(const Context& c, const ad::Var& query, const ad::Var& prepared) const override;
  LuongScore kind() const { return kind_; }

 private:
  LuongScore kind_;
  Tensor w_;  // (Hq, Hk), registered as "W.weight" for kGeneral; undefined for kDot
};

}  // namespace qkv::nn
