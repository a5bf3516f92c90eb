// train::Trainer: one optimisation step.
#include "qkv/train/trainer.h"

#include <cmath>

#include "qkv/core/error.h"

namespace qkv::train {

Trainer::Trainer(ad::ParameterSet& params, Optimizer& optimizer, const LrSchedule& schedule, Rng& dropout_rng,
                 double clip)
    : params_(&params), optimizer_(&optimizer), schedule_(&schedule), dropout_rng_(&dropout_rng), clip_(clip) {}

StepResult Trainer::step(int64_t step, const LossFn& loss_fn) {
  QKV_CHECK_ARG(static_cast<bool>(loss_fn), "[Trainer] step ", step, " has no loss function");
  StepResult r;
  r.step = step;
  params_->zero_grad();
  tape_.clear();
  {
    nn::Context c(tape_, *params_, dropout_rng_);
    const ad::Var loss = loss_fn(c);
    QKV_CHECK_ARG(loss.defined() && loss.numel() == 1, "[Trainer] the loss of step ", step,
                  " must be a scalar, got ", loss.defined() ? str(loss.shape()) : std::string("(undefined)"));
    r.loss = loss.value.item();
    if (dp_ != nullptr) r.loss = dp_->global_loss(r.loss);  // every rank sees the global batch's loss
    r.finite = std::isfinite(r.loss);
    if (!r.finite) {
      tape_.clear();
      return r;
    }
    // Data parallel: each bucket of gradients starts its all-reduce as soon as the backward has finished it.
    if (dp_ != nullptr && dp_->overlap())
      tape_.set_on_param_ready([dp = dp_](ad::Parameter& p, size_t nodes_left) { dp->parameter_ready(p, nodes_left); });
    else
      tape_.set_on_param_ready(nullptr);
    tape_.backward(loss);
  }
  // Every parameter gradient of this step is complete here, before clipping, the schedule and the update.
  if (dp_ != nullptr) dp_->reduce_gradients();  // the rest of the all-reduce: clipping and the step see the global
                                                // gradient
  if (clip_ > 0.0) clip_grad_norm(*params_, clip_);
  r.lr = schedule_->at(step);
  optimizer_->set_lr(r.lr);
  optimizer_->step();
  return r;
}

}  // namespace qkv::train
