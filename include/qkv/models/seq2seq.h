// Seq2Seq: an RNN encoder-decoder (GRU or LSTM) without attention (the fixed-size bottleneck) or with
// Bahdanau / Luong attention over all encoder states; teacher-forced forward and one decoder step (greedy / beam
// search over it: decode::RnnStep).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "qkv/core/rng.h"
#include "qkv/core/tensor.h"
#include "qkv/nn/additive_attention.h"
#include "qkv/nn/context.h"
#include "qkv/nn/embedding.h"
#include "qkv/nn/linear.h"
#include "qkv/nn/module.h"
#include "qkv/nn/rnn.h"
#include "qkv/ops/embedding.h"

namespace qkv::models {

enum class Seq2SeqAttention {
  // Decoder starts from the encoder's final state h_n and never sees the other encoder states.
  // With feed_context (default, as Cho et al. 2014) the top layer's final state c = h_n[L−1] is also
  // concatenated to every decoder input: x_t = [emb(y_{t−1}); c].   logits_t = out(s_t).
  kNone,
  // Bahdanau et al. 2015: α_t = attn(s_{t−1}, h) with the additive score, c_t = Σ α h_i,
  // s_t = RNN([emb(y_{t−1}); c_t], s_{t−1}),   logits_t = out([s_t; c_t]).
  kBahdanau,
  // Luong et al. 2015 (no input feeding): s_t = RNN(emb(y_{t−1}), s_{t−1}), α_t = attn(s_t, h),
  // h̃_t = tanh(W_c [c_t; s_t]),   logits_t = out(h̃_t).   Dot score sᵀh_i ...
  kLuongDot,
  // ... or general score sᵀ W h_i.
  kLuongGeneral,
};

enum class RnnCell { kGRU, kLSTM };

struct Seq2SeqConfig {
  int64_t src_vocab = 0;
  int64_t tgt_vocab = 0;
  int64_t embed_dim = 0;     // E
  int64_t hidden_size = 0;   // H, encoder and decoder
  int64_t num_layers = 1;    // L, encoder and decoder (the decoder starts from the encoder's h_n)
  RnnCell cell = RnnCell::kGRU;
  Seq2SeqAttention attention = Seq2SeqAttention::kNone;
  int64_t attention_size = 0;  // Bahdanau's A; 0 means H
  bool feed_context = true;    // kNone only: see Seq2SeqAttention::kNone
};

// What the decoder may read about the source (Tensor: inference results; ad::Var: the one forward's values).
template <class T>
struct BasicSeq2SeqEncoded {
  T states;          // (B, Ts, H) top-layer encoder outputs h_i; 0 at padded positions
  T h_n;             // (L, B, H) encoder state after each source's last real token
  T c_n;             // (L, B, H) LSTM only
  Tensor keep_mask;  // (B, Ts) 1 = real source token; undefined when no lengths were given
  T prepared;        // attention cache scorer.prepare(states) (e.g. U·h_i); undefined for kNone
};

// Decoder recurrent state between steps.
template <class T>
struct BasicSeq2SeqState {
  T h;  // (L, B, H)
  T c;  // (L, B, H) LSTM only
};

template <class T>
struct BasicSeq2SeqStep {
  T logits;   // (B, V)
  T weights;  // (B, Ts) alignment α_t; undefined for kNone
  BasicSeq2SeqState<T> state;
};

template <class T>
struct BasicSeq2SeqOutput {
  T logits;      // (B, Tt, V)
  T alignments;  // (B, Tt, Ts); undefined for kNone
};

using Seq2SeqEncoded = BasicSeq2SeqEncoded<Tensor>;
using Seq2SeqState = BasicSeq2SeqState<Tensor>;
using Seq2SeqStep = BasicSeq2SeqStep<Tensor>;
using Seq2SeqOutput = BasicSeq2SeqOutput<Tensor>;
using Seq2SeqEncodedVars = BasicSeq2SeqEncoded<ad::Var>;
using Seq2SeqStateVars = BasicSeq2SeqState<ad::Var>;
using Seq2SeqStepVars = BasicSeq2SeqStep<ad::Var>;
using Seq2SeqOutputVars = BasicSeq2SeqOutput<ad::Var>;

// Parameters (PyTorch-style dotted names): src_embed.weight (Vs, E), tgt_embed.weight (Vt, E),
// encoder.{weight_ih_l{k}, weight_hh_l{k}, bias_ih_l{k}, bias_hh_l{k}}, decoder.{same},
// attention.{W,U,v}.weight (Bahdanau) | attention.W.weight (Luong general), attn_combine.weight (H, 2H) (Luong),
// out.weight (V, H or 2H for Bahdanau), out.bias (V).
class Seq2Seq : public nn::Module {
 public:
  Seq2Seq(const Seq2SeqConfig& config, Rng& rng);
  ~Seq2Seq() override;

  const Seq2SeqConfig& config() const { return config_; }
  // The scorer (null for kNone): prepare() rebuilds Seq2SeqEncoded::prepared for edited states.
  const nn::AttentionScorer* attention() const { return attention_.get(); }

  // Each call below computes once, on a Context (inference: constants; training: recorded on the tape); the
  // Tensor overloads run it with an inference Context.
  // src: ids (B, Ts) in [0, Vs)  src_lengths: empty (all Ts) or B values in [0, Ts]
  Seq2SeqEncodedVars encode(const nn::Context& c, const Ids& src, const std::vector<int64_t>& src_lengths = {}) const;
  Seq2SeqEncoded encode(const Ids& src, const std::vector<int64_t>& src_lengths = {}) const;

  // Decoder state before the first target token: the encoder's (h_n, c_n).
  Seq2SeqStateVars initial_state(const Seq2SeqEncodedVars& enc) const;
  Seq2SeqState initial_state(const Seq2SeqEncoded& enc) const;

  // One decoder step. prev_tokens: B ids in [0, Vt) (y_{t−1}; bos first).
  Seq2SeqStepVars decode_step(const nn::Context& c, const Seq2SeqEncodedVars& enc, const Seq2SeqStateVars& state,
                              const std::vector<int64_t>& prev_tokens) const;
  Seq2SeqStep decode_step(const Seq2SeqEncoded& enc, const Seq2SeqState& state,
                          const std::vector<int64_t>& prev_tokens) const;

  // Teacher forcing. tgt_in: ids (B, Tt) (bos + target without its last token)  ->  logits (B, Tt, V),
  // alignments (B, Tt, Ts). Same numbers as running decode_step over tgt_in's columns.
  Seq2SeqOutputVars decode(const nn::Context& c, const Seq2SeqEncodedVars& enc, const Ids& tgt_in) const;
  Seq2SeqOutput decode(const Seq2SeqEncoded& enc, const Ids& tgt_in) const;

  // encode + decode.
  Seq2SeqOutputVars forward(const nn::Context& c, const Ids& src, const std::vector<int64_t>& src_lengths,
                            const Ids& tgt_in) const;
  Seq2SeqOutput forward(const Ids& src, const std::vector<int64_t>& src_lengths, const Ids& tgt_in) const;

 private:
  // One decoder RNN step, whichever cell is configured.
  Seq2SeqStateVars step_rnn(const nn::Context& c, const ad::Var& x, const Seq2SeqStateVars& state) const;
  void check_ids(const Ids& ids, const char* what) const;

  Seq2SeqConfig config_;
  nn::Embedding src_embed_;
  nn::Embedding tgt_embed_;
  std::unique_ptr<nn::RnnBase> encoder_;
  std::unique_ptr<nn::RnnBase> decoder_;
  std::unique_ptr<nn::AttentionScorer> attention_;  // null for kNone
  std::unique_ptr<nn::Linear> attn_combine_;        // Luong only
  std::unique_ptr<nn::Linear> out_;
};

}  // namespace qkv::models
