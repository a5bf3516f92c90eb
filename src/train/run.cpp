// train::Run: the steps of a training run with its sampler, parallel policy, evaluation, checkpoints and stop flag.
#include "qkv/train/run.h"

#include <chrono>

#include "qkv/core/error.h"
#include "qkv/ops/functional.h"

namespace qkv::train {
namespace {

int64_t checked_examples(int64_t n) {
  QKV_CHECK_ARG(n >= 1, "[train] the training split is empty");
  return n;
}

int64_t checked_batch(int64_t b) {
  QKV_CHECK_ARG(b >= 1, "[train] batch_size must be >= 1, got ", b);
  return b;
}

}  // namespace

Run::Run(ad::ParameterSet& params, Optimizer& optimizer, const LrSchedule& schedule, nn::Module& module,
         int64_t num_examples, const RunOptions& options, parallel::Communicator* comm)
    : params_(&params),
      optimizer_(&optimizer),
      module_(&module),
      options_(options),
      comm_(comm),
      dropout_rng_(options.dropout_seed.value_or(options.seed ^ 0xD80F0D7ULL)),
      sampler_(checked_examples(num_examples), checked_batch(options.batch_size), options.seed ^ 0x5A3D1E5ULL),
      trainer_(params, optimizer, schedule, dropout_rng_, options.clip) {
  QKV_CHECK_ARG(options.steps >= 0, "[train] steps must be >= 0, got ", options.steps);
  QKV_CHECK_ARG(options.keep_checkpoints >= 1, "[train] keep_checkpoints must be >= 1, got ",
                options.keep_checkpoints);
  QKV_CHECK_ARG(!options.context_parallel || ranks() > 1,
                "[train] context parallelism needs two ranks or more, got ", ranks());
  if (ranks() > 1) {
    dp_ = std::make_unique<DataParallel>(*comm_, params);
    dp_->set_overlap(options.overlap);
    // Context parallel: every rank runs the whole batch on its positions of each sequence (ring attention), and
    // its loss is its share of the global token mean.
    dp_->set_loss_shares(options.context_parallel);
    if (options.context_parallel) cp_ = std::make_unique<ContextParallel>(*comm_);
    trainer_.set_data_parallel(dp_.get());
  }
}

Run::~Run() = default;

void Run::set_overlap(bool on) {
  options_.overlap = on;
  if (dp_ != nullptr) dp_->set_overlap(on);
}

int Run::rank() const { return comm_ != nullptr ? comm_->rank() : 0; }
int Run::ranks() const { return comm_ != nullptr ? comm_->size() : 1; }

std::string Run::resume() {
  const std::string ckpt = options_.dir.empty() ? "" : latest_checkpoint(options_.dir);
  if (ckpt.empty()) return ckpt;
  LoadedCheckpoint loaded = load_checkpoint(ckpt, options_.model_kind);
  try {
    module_->load_state_dict(loaded.weights, true);
    optimizer_->load_state_dict(loaded.optimizer);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument("[checkpoint] " + ckpt + " does not fit this '" + options_.model_kind +
                                "' run: " + e.what());
  }
  state_ = loaded.state;
  dropout_rng_.set_state(state_.dropout_rng_state);
  sampler_.seek(state_.epoch, state_.position);
  return ckpt;
}

RunResult Run::run(const RunHooks& hooks, const std::atomic<bool>* stop) {
  QKV_CHECK_ARG(static_cast<bool>(hooks.forward), "[train] Run::run needs hooks.forward");
  const auto start = std::chrono::steady_clock::now();
  const double elapsed_before = state_.elapsed_s;
  const int nranks = ranks(), this_rank = rank();
  const bool rank0 = this_rank == 0;
  if (dp_ != nullptr) dp_->broadcast_from_root(*optimizer_);
  RunResult result;
  result.first_step = result.step = state_.step;
  result.last_loss = state_.last_loss;
  auto stop_requested = [&] { return stop != nullptr && stop->load(std::memory_order_relaxed); };
  if (stop_requested()) {  // before the first step: the run directory is as it was
    result.stopped = true;
    return result;
  }
  module_->train();
  // bf16 trains on its live weights; fp32, a new model's default, is left unprepared (packed fp32 copies would sit
  // unused once the first step switches the model to its live weights).
  if (options_.precision != Precision::kFloat32) module_->set_precision(options_.precision);
  const int64_t bytes_before = comm_ != nullptr ? comm_->bytes_sent() : 0;
  const int64_t pad = options_.loss.ignore_index;
  for (int64_t step = state_.step + 1; step <= options_.steps; ++step) {
    const std::vector<int64_t> idx = hooks.batch ? hooks.batch(step) : sampler_.next();
    QKV_CHECK_ARG(!idx.empty(), "[train] the batch of step ", step, " is empty");
    // This rank's contiguous share of the global batch. A share left empty (an epoch's short last batch) runs one
    // example with weight 0, so that every rank takes part in the step and adds nothing.
    const bool split = nranks > 1 && !options_.context_parallel;
    const size_t lo = split ? idx.size() * static_cast<size_t>(this_rank) / static_cast<size_t>(nranks) : 0;
    const size_t hi = split ? idx.size() * static_cast<size_t>(this_rank + 1) / static_cast<size_t>(nranks)
                            : idx.size();
    std::vector<int64_t> share(idx.begin() + static_cast<std::ptrdiff_t>(lo),
                               idx.begin() + static_cast<std::ptrdiff_t>(hi));
    const bool empty_share = share.empty();
    if (empty_share) share.push_back(idx[0]);
    int64_t ntok = 0;
    const StepResult r = trainer_.step(step, [&](nn::Context& g) {
      if (cp_ != nullptr) g.set_sequence_shard(cp_.get());
      const TeacherForced tf = hooks.forward(g, share);
      ntok = empty_share ? 0 : tf.num_target_tokens;
      if (dp_ == nullptr) return cross_entropy(tf.logits, tf.targets, options_.loss);
      const double terms = empty_share ? 0.0 : static_cast<double>(count_targets(tf.targets, pad));
      dp_->set_local_weight(terms);
      if (cp_ == nullptr) return cross_entropy(tf.logits, tf.targets, options_.loss);
      // This rank's share of the mean over the global batch's loss terms (summed over the ranks' positions).
      CrossEntropyOptions sum = options_.loss;
      sum.reduction = Reduction::kSum;
      const double total = cp_->global_sum(terms);
      const float inv = total > 0.0 ? static_cast<float>(1.0 / total) : 0.0f;
      return ad::scale(cross_entropy(tf.logits, tf.targets, sum), inv);
    });
    if (!r.finite) {
      result.diverged = true;
      result.diverged_loss = r.loss;
      break;
    }
    if (dp_ != nullptr) {
      dp_->check_replicas(step);  // every rank holds the same bits after every step
      float n = static_cast<float>(ntok);
      comm_->allreduce_sum(&n, 1);
      ntok = static_cast<int64_t>(n);
    }
    result.tokens += ntok;
    state_.step = result.step = step;
    state_.last_loss = result.last_loss = static_cast<float>(r.loss);
    if (hooks.on_step) hooks.on_step(RunStep{step, r.loss, r.lr, result.tokens});

    bool early = false;
    const bool eval_step = step == options_.steps || (options_.eval_every > 0 && step % options_.eval_every == 0);
    if (rank0 && eval_step && hooks.evaluate) {
      const double score = hooks.evaluate(step);
      early = options_.early_stop > 0.0 && score >= options_.early_stop;
      module_->train();
    }
    bool signalled = stop_requested();
    if (nranks > 1) {  // rank 0's early stop and any rank's stop flag stop every rank at the same step
      float flags[2] = {early ? 1.0f : 0.0f, signalled ? 1.0f : 0.0f};
      comm_->allreduce_max(flags, 2);
      early = flags[0] != 0.0f;
      signalled = flags[1] != 0.0f;
    }
    const bool periodic = options_.checkpoint_every > 0 && step % options_.checkpoint_every == 0;
    if (periodic || step == options_.steps || early || signalled) {
      state_.epoch = sampler_.epoch();
      state_.position = sampler_.position();
      state_.dropout_rng_state = dropout_rng_.state();
      state_.elapsed_s = elapsed_before + std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (rank0 && !options_.dir.empty()) {
        result.checkpoint = save_checkpoint(options_.dir, options_.model_kind, module_->state_dict(),
                                            optimizer_->state_dict(), state_, options_.keep_checkpoints);
        if (hooks.on_checkpoint) hooks.on_checkpoint(step, result.checkpoint);
      }
    }
    if (signalled) {
      if (comm_ != nullptr) comm_->barrier();  // rank 0's checkpoint is on disk before any rank reports it
      result.stopped = true;
      break;
    }
    if (early) {
      result.early_stopped = true;
      break;
    }
  }
  result.bytes_sent = (comm_ != nullptr ? comm_->bytes_sent() : 0) - bytes_before;
  return result;
}

}  // namespace qkv::train
