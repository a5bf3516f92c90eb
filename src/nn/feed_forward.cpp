// nn::FeedForward: linear2(dropout(activation(linear1(x)))) and the activation helpers shared by transformer layers.
// Dropout after the block (dropout2/dropout3) belongs to the enclosing layer, as in PyTorch.
#include "qkv/nn/feed_forward.h"

#include "qkv/ops/functional.h"

#include "qkv/core/error.h"
#include "qkv/ops/elementwise.h"

namespace qkv::nn {
namespace {

int64_t checked_d_model(int64_t d_model, int64_t dim_feedforward, float dropout) {
  QKV_CHECK_ARG(d_model > 0 && dim_feedforward > 0, "[FeedForward] d_model ", d_model, " and dim_feedforward ",
                dim_feedforward, " must be > 0");
  QKV_CHECK_ARG(dropout >= 0.0f && dropout < 1.0f, "[FeedForward] dropout must be in [0, 1), got ", dropout);
  return d_model;
}

}  // namespace

Activation activation_from_string(const std::string& name, const char* op) {
  if (name == "relu") return Activation::kRelu;
  if (name == "gelu") return Activation::kGelu;
  if (name == "gelu_tanh") return Activation::kGeluTanh;
  QKV_CHECK_ARG(false, "[", op, "] activation must be \"relu\", \"gelu\" or \"gelu_tanh\", got \"", name, "\"");
  return Activation::kRelu;
}

Tensor apply_activation(const Tensor& x, Activation activation) {
  switch (activation) {
    case Activation::kRelu: return relu(x);
    case Activation::kGelu: return gelu(x, GeluApprox::kNone);
    case Activation::kGeluTanh: return gelu(x, GeluApprox::kTanh);
  }
  QKV_CHECK_ARG(false, "[FeedForward] unknown activation");
  return {};
}

FeedForward::FeedForward(int64_t d_model, int64_t dim_feedforward, Rng& rng, Activation activation, float dropout,
                         bool bias)
    : linear1(checked_d_model(d_model, dim_feedforward, dropout), dim_feedforward, bias, rng),
      dropout(dropout, rng.next_u64()),
      linear2(dim_feedforward, d_model, bias, rng),
      activation_(activation) {
  register_module("linear1", &linear1);
  register_module("dropout", &this->dropout);
  register_module("linear2", &linear2);
}

ad::Var FeedForward::forward(const Context& c, const ad::Var& x, bool out_bias) const {
  QKV_CHECK_ARG(x.defined() && x.dim() >= 1 && x.size(-1) == linear1.in_features(), "[FeedForward] input ",
                x.defined() ? str(x.shape()) : std::string("(undefined)"), " must have last dim d_model = ",
                linear1.in_features());
  ad::Var h = activation_ == Activation::kRelu
                  ? ad::relu(linear1.forward(c, x))
                  : ad::add_bias_gelu(linear1.forward(c, x, false), c.param(linear1.bias),
                                      activation_ == Activation::kGeluTanh ? GeluApprox::kTanh : GeluApprox::kNone);
  h = dropout.forward(c, h);
  return linear2.forward(c, h, out_bias);
}

}  // namespace qkv::nn

namespace qkv::ad {

Var activation(const Var& x, nn::Activation a) {
  switch (a) {
    case nn::Activation::kRelu: return relu(x);
    case nn::Activation::kGelu: return gelu(x, GeluApprox::kNone);
    case nn::Activation::kGeluTanh: return gelu(x, GeluApprox::kTanh);
  }
  QKV_CHECK_ARG(false, "[activation] unknown activation");
  return Var();
}

}  // namespace qkv::ad
