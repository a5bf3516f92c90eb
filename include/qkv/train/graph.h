// Graph: a training Context (one per step: it binds the ParameterSet to the tape) plus the recurrent layers' tape
// forwards (GRU/LSTM through time), built from the modules' own parameter tensors.
#pragma once

#include <cstdint>
#include <vector>

#include "qkv/core/rng.h"
#include "qkv/nn/context.h"
#include "qkv/nn/rnn.h"
#include "qkv/ops/autograd.h"
#include "qkv/ops/functional.h"

namespace qkv::train {

// Outputs of a recurrent layer on the tape (see nn::RnnOutput).
struct RnnVars {
  ad::Var output;  // (B, T, H) batch-first (else (T, B, H)); 0 at padded steps
  ad::Var h_n;     // (L, B, H)
  ad::Var c_n;     // (L, B, H) LSTM only
};

// One layer's recurrent weights as Vars: w_ih (G·H, in), w_hh (G·H, H), b_ih, b_hh (G·H) or undefined.
struct RnnLayerVars {
  ad::Var w_ih, w_hh, b_ih, b_hh;
};

// A training Context (nn/context.h) that also runs the recurrent layers on the tape. The Transformer family's
// modules take any Context directly (m.forward(g, x, ...)); the RNN layers still have their tape forward here.
class Graph : public nn::Context {
 public:
  // dropout_rng may be null when no dropout is active (eval mode or p == 0); it must outlive the Graph.
  Graph(ad::Tape& tape, ad::ParameterSet& params, Rng* dropout_rng = nullptr)
      : nn::Context(tape, params, dropout_rng) {}

  // x: (B, T, E) (or (T, B, E) when !batch_first)  h0: (L, B, H) or undefined (zeros)
  // lengths: empty or B values in [0, T] (padded steps keep the state and output 0), as nn::GRU::forward.
  RnnVars gru(const nn::GRU& m, const ad::Var& x, const ad::Var& h0 = {}, const std::vector<int64_t>& lengths = {});
  // As nn::LSTM::forward; h0 and c0 both given or both undefined.
  RnnVars lstm(const nn::LSTM& m, const ad::Var& x, const ad::Var& h0 = {}, const ad::Var& c0 = {},
               const std::vector<int64_t>& lengths = {});
  // The layer loop behind gru()/lstm() for weights given directly (gates 3 = GRU, 4 = LSTM); x batch-first
  // (B, T, E). One input-projection GEMM per layer over all steps, then one fused cell node per step.
  RnnVars rnn_layers(int64_t gates, const std::vector<RnnLayerVars>& layers, const ad::Var& x, const ad::Var& h0,
                     const ad::Var& c0, const std::vector<int64_t>& lengths);
};

}  // namespace qkv::train
