// train::TextRun: the run of `qkv train` and Python's qkv.train — a RunConfig in a run directory (config.json,
// vocab.txt, checkpoints/): its data, its TextModel, optimizer and schedule, and the train::Run that steps them,
// started fresh or resumed bit-exactly from the newest checkpoint. Under mpirun every rank opens the same run;
// rank 0 alone writes files.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "qkv/parallel/comm.h"
#include "qkv/train/optim.h"
#include "qkv/train/run.h"
#include "qkv/train/run_config.h"
#include "qkv/train/run_data.h"
#include "qkv/train/run_model.h"
#include "qkv/train/schedule.h"
#include "qkv/train/text_model.h"

namespace qkv::train {

// The optimizer (adam | adamw | sgd) and the learning-rate schedule a RunConfig names.
std::unique_ptr<Optimizer> make_optimizer(const RunConfig& c, ad::ParameterSet& params);
LrSchedule make_schedule(const RunConfig& c);

// Hooks of TextRun::train (each optional): printing and curves are the caller's.
struct TextRunHooks {
  std::function<void(const RunStep& s)> on_step;                      // every rank, after every step
  std::function<void(int64_t step, const EvalResult& r)> on_eval;      // rank 0, after each periodic evaluation
  std::function<void(int64_t step, const std::string& path)> on_checkpoint;  // rank 0
};

class TextRun {
 public:
  // A new run of `config` in `dir` (created; it must not hold a config.json yet). comm: the ranks that train
  // together (nullptr: this process alone); config.ranks is set to their number. Throws invalid_argument
  // "[train] ..." on a configuration the ranks cannot run or that differs between them.
  static std::unique_ptr<TextRun> start(RunConfig config, const std::string& dir,
                                        parallel::Communicator* comm = nullptr);
  // The run in `dir` continued from its newest checkpoint. `config`: the saved one (load_run_config) with the
  // caller's changes (run lengths, data options that keep the vocabulary); refused on another number of ranks or
  // when the data builds another vocabulary. data_options names the changed data options in that message
  // ("--task copy"; "" for "the data").
  static std::unique_ptr<TextRun> resume(RunConfig config, const std::string& dir,
                                         parallel::Communicator* comm = nullptr,
                                         const std::string& data_options = "");
  ~TextRun();

  // Steps to config().steps with periodic evaluation (decoding the first eval_size test examples), early stop and
  // checkpoints; a stop flag seen set ends it after a checkpoint. Throws runtime_error "[train] the loss became
  // nan at step N ..." when the loss stops being finite (nothing is saved for that step).
  RunResult train(const TextRunHooks& hooks = {}, const std::atomic<bool>* stop = nullptr);

  const RunConfig& config() const { return config_; }
  const RunData& data() const { return data_; }
  TextModel& model() { return *model_; }
  Run& run() { return *run_; }
  const std::string& dir() const { return dir_; }
  int64_t num_parameters() const { return params_->numel(); }
  const std::string& resumed_from() const { return checkpoint_; }  // "" when started fresh
  bool data_changed() const { return data_changed_; }  // resume: the TSV's bytes differ from the run's start

 private:
  TextRun() = default;
  void build(parallel::Communicator* comm);

  RunConfig config_;
  RunData data_;
  std::string dir_, checkpoint_;
  bool data_changed_ = false;
  std::unique_ptr<TextModel> model_;
  std::unique_ptr<ad::ParameterSet> params_;
  std::unique_ptr<Optimizer> optimizer_;
  LrSchedule schedule_;
  std::unique_ptr<Run> run_;
};

}  // namespace qkv::train
