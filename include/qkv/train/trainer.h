// train::Trainer: the one training step of the library. train::Run (train/run.h: `qkv train`, the experiments,
// Python) and the training benchmark run their steps through it: zero_grad -> forward and loss on a training
// Context -> backward -> clip -> learning rate from the schedule -> optimizer step. The loop around the steps
// (batches, evaluation, checkpoints, stopping) is train::Run's.
#pragma once

#include <cstdint>
#include <functional>

#include "qkv/core/rng.h"
#include "qkv/nn/context.h"
#include "qkv/ops/autograd.h"
#include "qkv/train/data_parallel.h"
#include "qkv/train/optim.h"
#include "qkv/train/schedule.h"

namespace qkv::train {

struct StepResult {
  int64_t step = 0;
  double loss = 0.0;  // the loss of this step's batch, before the update
  double lr = 0.0;    // the learning rate the update used
  bool finite = true; // false: the loss was not finite, and no update was made
};

class Trainer {
 public:
  // The forward and loss of one batch, on the training Context the trainer passes (a tape over `params`, dropout
  // from the trainer's Rng): returns a scalar loss Var.
  using LossFn = std::function<ad::Var(nn::Context& c)>;

  // params, optimizer, schedule and dropout_rng must outlive the trainer. clip <= 0: no gradient clipping.
  Trainer(ad::ParameterSet& params, Optimizer& optimizer, const LrSchedule& schedule, Rng& dropout_rng,
          double clip = 0.0);

  // One step numbered `step` (the schedule's step, from 1).
  StepResult step(int64_t step, const LossFn& loss);

  ad::Tape& tape() { return tape_; }
  // Data parallelism (nullptr: off): the step's loss becomes the global batch's and the gradients are all-reduced
  // in buckets that start during the backward (dp->overlap(); else after it), complete before clipping. `dp`
  // must outlive the trainer.
  void set_data_parallel(DataParallel* dp) { dp_ = dp; }

 private:
  ad::ParameterSet* params_;
  Optimizer* optimizer_;
  const LrSchedule* schedule_;
  Rng* dropout_rng_;
  double clip_;
  ad::Tape tape_;
  DataParallel* dp_ = nullptr;
};

}  // namespace qkv::train
