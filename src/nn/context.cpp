// nn::Context: the parameter binding and the dropout stream shared by every module's forward.
#include "qkv/nn/context.h"

#include "qkv/core/error.h"
#include "qkv/ops/functional.h"

namespace qkv::nn {

Context::Context(ad::Tape& tape, ad::ParameterSet& params, Rng* dropout_rng)
    : binder_(std::make_shared<ad::Binder>(tape, params)), rng_(dropout_rng) {}

ad::Var Context::dropout(const ad::Var& x, float p, bool training, const char* op) const {
  if (!training || p == 0.0f) return x;
  QKV_CHECK_ARG(p > 0.0f && p <= 1.0f, "[", op, "] dropout p must be in [0, 1], got ", p);
  QKV_CHECK_ARG(rng_ != nullptr, "[", op, "] dropout p = ", p, " in training mode needs a dropout Rng in the Context");
  if (p >= 1.0f) return ad::Var(Tensor::zeros(x.shape()));  // PyTorch: p == 1 zeroes everything
  return ad::dropout(x, p, true, *rng_);
}

}  // namespace qkv::nn
