// train::Run: the training run around train::Trainer — a per-rank sampler over the training examples, data or
// context parallelism over the ranks of a communicator, evaluation and early stop, atomic checkpoints with a
// bit-exact resume (train/checkpoint.h) and a cooperative stop flag. `qkv train`, Python's qkv.train, the
// experiments and the train-step benchmark all train through it; printing stays with the caller (hooks).
//
//   train::Run run(params, optimizer, schedule, model.module(), train.size(), options);
//   run.resume();                                        // the newest checkpoint of options.dir, if any
//   train::RunHooks hooks;
//   hooks.forward = [&](const nn::Context& c, const std::vector<int64_t>& rows) { ... return teacher_forced; };
//   train::RunResult r = run.run(hooks, &stop_flag);     // stop_flag: set by a signal handler, another thread
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "qkv/core/precision.h"
#include "qkv/core/rng.h"
#include "qkv/data/batch.h"
#include "qkv/nn/context.h"
#include "qkv/nn/module.h"
#include "qkv/ops/autograd.h"
#include "qkv/parallel/comm.h"
#include "qkv/train/checkpoint.h"
#include "qkv/train/data_parallel.h"
#include "qkv/train/loss.h"
#include "qkv/train/optim.h"
#include "qkv/train/schedule.h"
#include "qkv/train/text_model.h"
#include "qkv/train/trainer.h"

namespace qkv::train {

struct RunOptions {
  int64_t steps = 1000;      // train until this step (the schedule's step, from 1)
  int64_t batch_size = 64;   // the global batch: examples per step over all ranks
  uint64_t seed = 0;         // the sampler draws from seed ^ 0x5A3D1E5, dropout from seed ^ 0xD80F0D7
  std::optional<uint64_t> dropout_seed;  // instead of seed ^ 0xD80F0D7
  double clip = 0.0;         // global gradient-norm clip; <= 0: off
  CrossEntropyOptions loss;  // the loss of the forward's logits against its targets
  // The ranks split every sequence (ring attention; the forward's model must support nn::SequenceShard) instead of
  // the batch. Needs a communicator of two ranks or more.
  bool context_parallel = false;
  // The linears' and attention's compute precision, set on the module before the first step (after a resume's
  // weights reach every rank); kFloat32 leaves the module as it is.
  Precision precision = Precision::kFloat32;
  bool overlap = true;       // data parallel: all-reduce the gradients during the backward, not after it
  int64_t eval_every = 0;    // evaluate (hooks.evaluate, rank 0) every N steps and at the last; <= 0: the last only
  double early_stop = 0.0;   // > 0: stop, with a checkpoint, once an evaluation's score reaches this
  std::string dir;           // checkpoints under DIR/checkpoints; "": none
  std::string model_kind;    // recorded in every checkpoint and checked on resume
  int64_t checkpoint_every = 0;  // and at the last step, an early stop or a stop flag; <= 0: only those
  int64_t keep_checkpoints = 2;
};

// After every step, on every rank.
struct RunStep {
  int64_t step = 0;
  double loss = 0.0;     // the global batch's loss before the update
  double lr = 0.0;       // the learning rate of the update
  int64_t tokens = 0;    // target tokens trained on by this run() so far, all ranks together
};

struct RunResult {
  int64_t first_step = 0;     // the step run() started after (0, or the resumed checkpoint's)
  int64_t step = 0;           // the last step done (first_step when none was)
  double last_loss = 0.0;
  bool early_stopped = false;  // an evaluation reached options.early_stop
  bool stopped = false;        // the stop flag ended the run (after a checkpoint, when a step was done)
  bool diverged = false;       // the loss of step `step + 1` was not finite; no update was made
  double diverged_loss = 0.0;
  std::string checkpoint;      // the last checkpoint written by this run ("" when none)
  int64_t tokens = 0;
  int64_t bytes_sent = 0;      // to MPI by this rank during the steps
};

struct RunHooks {
  // Required: the teacher-forced logits and targets of this rank's share of a global batch (indices into the
  // training examples, in batch order), on the training Context (a tape; the sequence shard under context
  // parallelism). An empty share runs the batch's first example with weight 0.
  std::function<TeacherForced(const nn::Context& c, const std::vector<int64_t>& examples)> forward;
  // The global batch of step `step`. Default: data::Sampler(num_examples, batch_size, seed ^ 0x5A3D1E5), whose
  // position the checkpoints keep; a batch hook's own state is the caller's to keep.
  std::function<std::vector<int64_t>(int64_t step)> batch;
  // Rank 0, at the evaluation steps: returns the score options.early_stop compares. The module is put back in
  // training mode after it.
  std::function<double(int64_t step)> evaluate;
  std::function<void(const RunStep& s)> on_step;
  // Rank 0, after a checkpoint is durable.
  std::function<void(int64_t step, const std::string& path)> on_checkpoint;
};

class Run {
 public:
  // params (of `module`), optimizer (over params) and schedule must outlive the run. num_examples: the size of the
  // training set the sampler draws from. comm: the ranks that train together (nullptr: this process alone); with
  // two ranks or more, data parallel unless options.context_parallel. Throws invalid_argument "[train] ..." on
  // options that cannot run.
  Run(ad::ParameterSet& params, Optimizer& optimizer, const LrSchedule& schedule, nn::Module& module,
      int64_t num_examples, const RunOptions& options, parallel::Communicator* comm = nullptr);
  ~Run();
  Run(const Run&) = delete;
  Run& operator=(const Run&) = delete;

  // Loads the newest complete checkpoint of options.dir into the module, the optimizer, the sampler and the dropout
  // Rng; returns its path, or "" when there is none (the run starts at step 0). Throws invalid_argument
  // "[checkpoint] PATH does not fit this 'KIND' run: ..." when its tensors do not fit.
  std::string resume();
  // Steps state().step + 1 .. options.steps. With several ranks, rank 0's parameters and optimizer state go to
  // every rank first, and every rank must call run(). A stop flag seen set (on any rank) ends the run after the
  // current step's checkpoint, or at once before the first step.
  RunResult run(const RunHooks& hooks, const std::atomic<bool>* stop = nullptr);

  // Data parallel: all-reduce the gradients during the backward (on, the default) or after it.
  void set_overlap(bool on);

  const TrainerState& state() const { return state_; }
  const RunOptions& options() const { return options_; }
  Trainer& trainer() { return trainer_; }
  int rank() const;
  int ranks() const;

 private:
  ad::ParameterSet* params_;
  Optimizer* optimizer_;
  nn::Module* module_;
  RunOptions options_;
  parallel::Communicator* comm_;
  TrainerState state_;
  Rng dropout_rng_;
  data::Sampler sampler_;
  std::unique_ptr<DataParallel> dp_;
  std::unique_ptr<ContextParallel> cp_;
  Trainer trainer_;
};

}  // namespace qkv::train
