// Recurrent layers (GRU, LSTM) with PyTorch's gate order, formulas, parameter names and packing,
// plus the single-step cell functions they are built from (fused elementwise gate math).
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "qkv/core/rng.h"
#include "qkv/core/tensor.h"
#include "qkv/nn/context.h"
#include "qkv/nn/module.h"
#include "qkv/ops/autograd.h"

namespace qkv::nn {

// ---------------------------------------------------------------------------------------------
// Cells. The input projection gi = x·W_ihᵀ + b_ih is computed by the caller (for a layer: one GEMM
// over all time steps); the step does the recurrent GEMM h·W_hhᵀ + b_hh and the fused gate math.
// The results keep the gate activations a backward pass needs.
// ---------------------------------------------------------------------------------------------

// GRU, gates packed (r, z, n) along the 3H axis, as torch.nn.GRU:
//   r = σ(gi_r + W_hr h + b_hr)   z = σ(gi_z + W_hz h + b_hz)
//   n = tanh(gi_n + r ∘ (W_hn h + b_hn))   h' = (1 − z) ∘ n + z ∘ h
struct GruCellResult {
  Tensor h;   // (B, H)  new state
  Tensor r;   // (B, H)  reset gate
  Tensor z;   // (B, H)  update gate
  Tensor n;   // (B, H)  candidate
  Tensor hn;  // (B, H)  W_hn h + b_hn (the part r multiplies)
};

// gi: (B, 3H) input projection (rows may be strided)  h: (B, H)  w_hh: (3H, H)  b_hh: (3H) or undefined
GruCellResult gru_cell_step(const Tensor& gi, const Tensor& h, const Tensor& w_hh, const Tensor& b_hh);

// As torch.gru_cell, the whole cell from the input x (the _step functions take its projection gi instead):
// x: (B, E)  h: (B, H)  w_ih: (3H, E)  w_hh: (3H, H)  b_ih, b_hh: (3H) or undefined
GruCellResult gru_cell(const Tensor& x, const Tensor& h, const Tensor& w_ih, const Tensor& w_hh,
                       const Tensor& b_ih = {}, const Tensor& b_hh = {});

// LSTM, gates packed (i, f, g, o) along the 4H axis, as torch.nn.LSTM:
//   i = σ(·)  f = σ(·)  g = tanh(·)  o = σ(·)   where · = gi_gate + W_h_gate h + b_h_gate
//   c' = f ∘ c + i ∘ g   h' = o ∘ tanh(c')
struct LstmCellResult {
  Tensor h;  // (B, H)  new hidden state
  Tensor c;  // (B, H)  new cell state
  Tensor i;  // (B, H)  input gate
  Tensor f;  // (B, H)  forget gate
  Tensor g;  // (B, H)  cell candidate
  Tensor o;  // (B, H)  output gate
};

// gi: (B, 4H) input projection (rows may be strided)  h, c: (B, H)  w_hh: (4H, H)  b_hh: (4H) or undefined
LstmCellResult lstm_cell_step(const Tensor& gi, const Tensor& h, const Tensor& c, const Tensor& w_hh,
                              const Tensor& b_hh);

// As torch.lstm_cell, the whole cell from the input x (the _step functions take its projection gi instead):
// x: (B, E)  h, c: (B, H)  w_ih: (4H, E)  w_hh: (4H, H)  b_ih, b_hh: (4H) or undefined
LstmCellResult lstm_cell(const Tensor& x, const Tensor& h, const Tensor& c, const Tensor& w_ih,
                         const Tensor& w_hh, const Tensor& b_ih = {}, const Tensor& b_hh = {});

// ---------------------------------------------------------------------------------------------
// Layers.
// ---------------------------------------------------------------------------------------------

struct RnnOptions {
  int64_t num_layers = 1;
  bool bias = true;
  // true: x (B, T, E) and output (B, T, H). false: (T, B, E) and (T, B, H).
  // NOTE: torch.nn.GRU/LSTM default to batch_first=False; this library's default is (B, T, E).
  bool batch_first = true;
};

struct RnnOutput {
  Tensor output;  // (B, T, H) when batch_first, else (T, B, H): top layer's h_t; 0 at padded steps
  Tensor h_n;     // (L, B, H) state after each sequence's last real step
  Tensor c_n;     // (L, B, H) LSTM only; undefined for GRU
};

// RnnOutput as Vars (the one forward's result; on the tape when the Context trains).
struct RnnVars {
  ad::Var output;
  ad::Var h_n;
  ad::Var c_n;
};

// One layer's recurrent weights as Vars: w_ih (G·H, in), w_hh (G·H, H), b_ih, b_hh (G·H) or undefined.
struct RnnLayerVars {
  ad::Var w_ih, w_hh, b_ih, b_hh;
};

// The layer loop behind GRU / LSTM forward, for weights given directly (gates 3 = GRU, 4 = LSTM).
// x: (B, T, E) when batch_first, else (T, B, E)  h0, c0: (L, B, H) or undefined  lengths: as GRU::forward.
// Per layer: one input-projection GEMM over all steps, then one fused cell (ad::gru_cell_step / lstm_cell_step)
// per step; padded steps keep the state and give output 0.
RnnVars rnn_layers(int64_t gates, const std::vector<RnnLayerVars>& layers, const ad::Var& x, const ad::Var& h0,
                   const ad::Var& c0, const std::vector<int64_t>& lengths, bool batch_first = true);

// Shared parameter store, checks and layer loop for GRU and LSTM. Parameters, per layer k, in
// PyTorch's order and packing: weight_ih_l{k} (G·H, in), weight_hh_l{k} (G·H, H), bias_ih_l{k} (G·H),
// bias_hh_l{k} (G·H), with G = 3 (GRU) or 4 (LSTM), in = E for k = 0 and H above.
// Initialised uniform(−1/√H, 1/√H) in that order, as PyTorch.
class RnnBase : public Module {
 public:
  int64_t input_size() const { return input_size_; }
  int64_t hidden_size() const { return hidden_size_; }
  int64_t num_layers() const { return options_.num_layers; }
  int64_t gate_count() const { return gates_; }
  const RnnOptions& options() const { return options_; }

  // Layer k's parameters; bias tensors are undefined when options.bias is false.
  const Tensor& weight_ih(int64_t layer) const;
  const Tensor& weight_hh(int64_t layer) const;
  const Tensor& bias_ih(int64_t layer) const;
  const Tensor& bias_hh(int64_t layer) const;

  // The one forward of GRU and LSTM through time, on any Context (inference: constants, the cells' own kernels;
  // training: recorded on the tape). x: (B, T, E) (or (T, B, E) when !batch_first)  h0, c0: (L, B, H) or
  // undefined (zeros); c0 only for an LSTM, and then given with h0 or not at all.  lengths: empty (all T) or B
  // values in [0, T]: steps t >= lengths[b] leave row b's state unchanged and give output 0 (as a packed sequence
  // padded back by PyTorch). Per layer: one input-projection GEMM over all steps, then one fused cell per step.
  RnnVars forward_any(const Context& c, const ad::Var& x, const ad::Var& h0 = {}, const ad::Var& c0 = {},
                      const std::vector<int64_t>& lengths = {}) const;
  // One time step through all layers. x: (B, E)  h (and c for an LSTM): (L, B, H)  ->  the new state in
  // h_n (and c_n); `output` is the top layer's new h (B, H).
  RnnVars step_any(const Context& c, const ad::Var& x, const ad::Var& h, const ad::Var& cell = {}) const;

 protected:
  RnnBase(const char* op, int64_t gates, int64_t input_size, int64_t hidden_size, Rng& rng,
          const RnnOptions& options);

  struct Layer {
    Tensor w_ih, w_hh, b_ih, b_hh;
  };
  // Each layer's parameters through the Context (leaves when it trains, else constants).
  std::vector<RnnLayerVars> layer_vars(const Context& c) const;
  // Checks x (rank 3, last dim E), a state (L, B, H) when defined, and lengths (empty or B values in
  // [0, T]); returns {B, T}.
  std::pair<int64_t, int64_t> check_input(const Tensor& x, const std::vector<int64_t>& lengths) const;
  void check_state(const Tensor& s, const char* what, int64_t batch) const;

  const char* op_;
  int64_t gates_;
  int64_t input_size_;
  int64_t hidden_size_;
  RnnOptions options_;
  std::vector<Layer> layers_;  // sized once in the constructor: parameters are registered by address
};

class GRU : public RnnBase {
 public:
  GRU(int64_t input_size, int64_t hidden_size, Rng& rng, const RnnOptions& options = {});

  // x: (B, T, E) (or (T, B, E) when !batch_first)  h0: (L, B, H) or undefined (zeros)
  // lengths: empty (all T) or B values in [0, T] (see RnnBase::forward_any).
  RnnVars forward(const Context& c, const ad::Var& x, const ad::Var& h0 = {},
                  const std::vector<int64_t>& lengths = {}) const {
    return forward_any(c, x, h0, {}, lengths);
  }
  RnnOutput forward(const Tensor& x, const Tensor& h0 = {}, const std::vector<int64_t>& lengths = {}) const;

  // One time step through all layers. x: (B, E)  h: (L, B, H)  ->  new h (L, B, H); the top layer's
  // new state is h'[L−1].
  Tensor step(const Tensor& x, const Tensor& h) const { return step_any(Context(), x, h).h_n.value; }
};

class LSTM : public RnnBase {
 public:
  LSTM(int64_t input_size, int64_t hidden_size, Rng& rng, const RnnOptions& options = {});

  // x: (B, T, E) (or (T, B, E))  h0, c0: (L, B, H) or undefined (zeros; both or neither)
  // lengths: as GRU::forward.
  RnnVars forward(const Context& c, const ad::Var& x, const ad::Var& h0 = {}, const ad::Var& c0 = {},
                  const std::vector<int64_t>& lengths = {}) const {
    return forward_any(c, x, h0, c0, lengths);
  }
  RnnOutput forward(const Tensor& x, const Tensor& h0 = {}, const Tensor& c0 = {},
                    const std::vector<int64_t>& lengths = {}) const;

  struct State {
    Tensor h;  // (L, B, H)
    Tensor c;  // (L, B, H)
  };
  // One time step through all layers. x: (B, E)  h, c: (L, B, H)  ->  new (h, c)
  State step(const Tensor& x, const Tensor& h, const Tensor& c) const;
};

}  // namespace qkv::nn

// The cell steps on the tape (ops/autograd.h): one node per step, as the modules' own numerics.
namespace qkv::ad {

// --- recurrent cells (fused single nodes) ---------------------------------------------------------------------
// `active`: empty, or one flag per batch row; a row whose flag is 0 keeps its old state (h' = h, c' = c) and
// passes the gradient straight through (a padded step of a shorter sequence).
//
// GRU step, torch.nn.GRU's formulas and gate order (r, z, n), as nn::gru_cell_step:
// gi: (B, 3H) input projection x·W_ihᵀ + b_ih (may be a strided view)  h: (B, H)  w_hh: (3H, H)
// b_hh: (3H) or undefined  ->  h' (B, H)
Var gru_cell_step(const Var& gi, const Var& h, const Var& w_hh, const Var& b_hh,
                  const std::vector<uint8_t>& active = {});

// LSTM step, gates (i, f, g, o), as nn::lstm_cell_step: gi: (B, 4H)  h, c: (B, H)  w_hh: (4H, H)
// b_hh: (4H) or undefined  ->  (h', c')
struct LstmVars {
  Var h;
  Var c;
};
LstmVars lstm_cell_step(const Var& gi, const Var& h, const Var& c, const Var& w_hh, const Var& b_hh,
                        const std::vector<uint8_t>& active = {});

}  // namespace qkv::ad
