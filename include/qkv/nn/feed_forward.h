// nn::FeedForward: the position-wise block linear2(dropout(activation(linear1(x)))) of a transformer layer.
// Its pieces are public so that a layer registers them as ITS OWN children ("linear1", "dropout", "linear2"), as PyTorch.
#pragma once

#include <cstdint>
#include <string>

#include "qkv/core/rng.h"
#include "qkv/core/tensor.h"
#include "qkv/ops/autograd.h"
#include "qkv/nn/dropout.h"
#include "qkv/nn/linear.h"
#include "qkv/nn/module.h"

namespace qkv::nn {

enum class Activation {
  kRelu,      // F.relu (PyTorch's default)
  kGelu,      // F.gelu, exact erf form ("gelu")
  kGeluTanh,  // F.gelu(approximate="tanh")
};

// "relu" | "gelu" | "gelu_tanh" -> Activation; throws invalid_argument naming `op` otherwise.
Activation activation_from_string(const std::string& name, const char* op = "FeedForward");

// x: any shape -> same shape.
Tensor apply_activation(const Tensor& x, Activation activation);

class FeedForward : public Module {
 public:
  // d_model > 0, dim_feedforward > 0, dropout in [0, 1).
  // Standalone parameter names: "linear1.weight" (F, E), "linear1.bias" (F), "linear2.weight" (E, F), "linear2.bias" (E).
  FeedForward(int64_t d_model, int64_t dim_feedforward, Rng& rng, Activation activation = Activation::kRelu,
              float dropout = 0.0f, bool bias = true);

  // x: (..., E) -> (..., E). Dropout (after the activation) follows the `dropout` child's training flag and draws
  // from the Context's Rng; the Tensor form draws from the child's own. GELU runs as one fused bias + GELU step
  // after linear1 without its bias (ad::add_bias_gelu). out_bias false: linear2 runs without its bias, which the
  // caller adds in what follows (a fused residual + LayerNorm).
  ad::Var forward(const Context& c, const ad::Var& x, bool out_bias = true) const;
  Tensor forward(const Tensor& x) { return forward(Context(&dropout.rng()), x).value; }

  Activation activation() const { return activation_; }

  Linear linear1;   // (F, E)
  Dropout dropout;  // after the activation
  Linear linear2;   // (E, F)

 private:
  Activation activation_;
};

}  // namespace qkv::nn

namespace qkv::ad {
// The feed-forward activation of nn::FeedForward on the tape.
Var activation(const Var& x, nn::Activation a);
}  // namespace qkv::ad
