// Graph: the differentiable forwards of the nn modules, built on a Tape from the modules' own parameter tensors
// (so names and packing stay PyTorch's). One Graph per training step: it binds the ParameterSet to the tape.
#pragma once

#include <cstdint>
#include <vector>

#include "qkv/core/rng.h"
#include "qkv/nn/dropout.h"
#include "qkv/nn/embedding.h"
#include "qkv/nn/feed_forward.h"
#include "qkv/nn/layer_norm.h"
#include "qkv/nn/linear.h"
#include "qkv/nn/multihead_attention.h"
#include "qkv/nn/rnn.h"
#include "qkv/nn/transformer.h"
#include "qkv/train/autograd.h"
#include "qkv/train/functional.h"

namespace qkv::train {

// Outputs of a recurrent layer on the tape (see nn::RnnOutput).
struct RnnVars {
  Var output;  // (B, T, H) batch-first (else (T, B, H)); 0 at padded steps
  Var h_n;     // (L, B, H)
  Var c_n;     // (L, B, H) LSTM only
};

// One layer's recurrent weights as Vars: w_ih (G·H, in), w_hh (G·H, H), b_ih, b_hh (G·H) or undefined.
struct RnnLayerVars {
  Var w_ih, w_hh, b_ih, b_hh;
};

// Every method mirrors the module's forward step for step (same ops, same order, same masks). Dropout follows each
// module's training() flag and p, as the module's forward does, but draws from the Graph's Rng, so a training run
// has one random stream to checkpoint (nn::Dropout's own Rngs are not used on the tape).
class Graph {
 public:
  // dropout_rng may be null when no dropout is active (eval mode or p == 0); it must outlive the Graph.
  Graph(Tape& tape, ParameterSet& params, Rng* dropout_rng = nullptr);

  Tape& tape() { return *tape_; }
  // The Var of a module tensor: a parameter leaf when it is in the ParameterSet, else a constant.
  Var param(const Tensor& module_tensor) const { return binder_(module_tensor); }

  // x: any shape. Identity when !d.training() or d.p() == 0.
  Var dropout(const nn::Dropout& d, const Var& x);
  // x: any shape; p applied when `training`.
  Var dropout(const Var& x, float p, bool training);

  // x: (..., in) -> (..., out)
  Var linear(const nn::Linear& m, const Var& x);
  // x: (..., E) -> (..., E)
  Var layer_norm(const nn::LayerNorm& m, const Var& x);
  // ids: shape S -> S + (E). A padding_idx row gets no gradient, as torch.nn.Embedding.
  Var embedding(const nn::Embedding& m, const Ids& ids);
  // x: (..., E) -> (..., E): linear2(dropout(activation(linear1(x))))
  Var feed_forward(const nn::FeedForward& m, const Var& x);

  // query: (B, Tq, E)  key: (B, Tk, kdim)  value: (B, Tk, vdim)  ->  (B, Tq, E); unbatched (T, dim) accepted.
  // Masks as nn::MultiheadAttention::forward (need_weights is ignored: weights are not returned). attn_bias: an
  // extra differentiable additive bias broadcastable to (B, H, Tq, Tk) (T5's table through t5_bias()), added to
  // options.attn_bias. When query, key and value are the same Var, one packed (3E, E) projection runs; when key
  // and value are the same Var, one (2E, E) projection. Without weight dropout the attention is one fused node.
  Var multihead_attention(const nn::MultiheadAttention& m, const Var& query, const Var& key, const Var& value,
                          const nn::MhaForwardOptions& options = {}, const Var& attn_bias = {});

  // src: (B, T, E) -> (B, T, E), post-LN or pre-LN as configured.
  Var encoder_layer(const nn::TransformerEncoderLayer& m, const Var& src, const nn::AttentionMasks& masks = {});
  // tgt: (B, Tt, E)  memory: (B, Ts, E)  ->  (B, Tt, E)
  Var decoder_layer(const nn::TransformerDecoderLayer& m, const Var& tgt, const Var& memory,
                    const nn::AttentionMasks& tgt_masks = {}, const nn::AttentionMasks& memory_masks = {});
  Var encoder(const nn::TransformerEncoder& m, const Var& src, const nn::AttentionMasks& masks = {});
  Var decoder(const nn::TransformerDecoder& m, const Var& tgt, const Var& memory,
              const nn::AttentionMasks& tgt_masks = {}, const nn::AttentionMasks& memory_masks = {});
  // src: (B, Ts, E)  tgt: (B, Tt, E)  ->  (B, Tt, E)
  Var transformer(const nn::Transformer& m, const Var& src, const Var& tgt, const nn::AttentionMasks& src_masks = {},
                  const nn::AttentionMasks& tgt_masks = {}, const nn::AttentionMasks& memory_masks = {});

  // x: (B, T, E) (or (T, B, E) when !batch_first)  h0: (L, B, H) or undefined (zeros)
  // lengths: empty or B values in [0, T] (padded steps keep the state and output 0), as nn::GRU::forward.
  RnnVars gru(const nn::GRU& m, const Var& x, const Var& h0 = {}, const std::vector<int64_t>& lengths = {});
  // As nn::LSTM::forward; h0 and c0 both given or both undefined.
  RnnVars lstm(const nn::LSTM& m, const Var& x, const Var& h0 = {}, const Var& c0 = {},
               const std::vector<int64_t>& lengths = {});
  // The layer loop behind gru()/lstm() for weights given directly (gates 3 = GRU, 4 = LSTM); x batch-first
  // (B, T, E). One input-projection GEMM per layer over all steps, then one fused cell node per step.
  RnnVars rnn_layers(int64_t gates, const std::vector<RnnLayerVars>& layers, const Var& x, const Var& h0,
                     const Var& c0, const std::vector<int64_t>& lengths);

 private:
  Tape* tape_;
  Binder binder_;
  Rng* rng_;
};

}  // namespace qkv::train
