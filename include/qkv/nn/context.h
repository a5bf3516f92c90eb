// nn::Context: what a module's one forward runs with. A default Context is inference: module tensors are
// constants and nothing is recorded. A training Context binds the module tensors to a Tape (through a
// ParameterSet), so the same forward records its backward, and supplies the run's one dropout Rng.
#pragma once

#include <memory>

#include "qkv/core/rng.h"
#include "qkv/core/tensor.h"
#include "qkv/ops/autograd.h"

namespace qkv::nn {

class Context {
 public:
  // Inference, no dropout stream: a module in training() mode with dropout p > 0 is refused.
  Context() = default;
  // Inference with a dropout stream (a module's own Tensor forward in training() mode).
  explicit Context(Rng* dropout_rng) : rng_(dropout_rng) {}
  // Training: module tensors found in `params` become parameter leaves on `tape`; others stay constants.
  // dropout_rng may be null when no dropout is active; tape, params and dropout_rng must outlive the Context.
  Context(ad::Tape& tape, ad::ParameterSet& params, Rng* dropout_rng = nullptr);

  // The Var of a module tensor: a parameter leaf when training and the tensor is in the set, else a constant.
  ad::Var param(const Tensor& module_tensor) const {
    return binder_ ? (*binder_)(module_tensor) : ad::Var(module_tensor);
  }
  ad::Tape* tape() const { return binder_ ? &binder_->tape() : nullptr; }
  Rng* dropout_rng() const { return rng_; }

  // x: any shape. Inverted dropout with probability p when `training` and p > 0, drawing from dropout_rng();
  // identity otherwise. p in [0, 1]; p == 1 zeroes everything, as PyTorch. `op` names the module in errors.
  ad::Var dropout(const ad::Var& x, float p, bool training, const char* op = "Dropout") const;

 private:
  std::shared_ptr<ad::Binder> binder_;
  Rng* rng_ = nullptr;
};

}  // namespace qkv::nn
