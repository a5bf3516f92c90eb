// `qkv train --model rnn|rnn-attn|transformer|decoder --task NAME|--data FILE.tsv --steps N --out DIR --seed S
// [--resume DIR]`: trains with a live progress bar (plain log lines when stdout is not a terminal), periodic
// evaluation (exact match, token accuracy) and atomic checkpoints; --resume continues bit-exactly. SIGINT/SIGTERM
// finish the current step, write a checkpoint and exit 130/143; a second signal stops at once.
#include <omp.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "checkpoint.h"
#include "commands.h"
#include "qkv/core/error.h"
#include "qkv/core/io.h"
#include "qkv/parallel/comm.h"
#include "qkv/ops/functional.h"
#include "qkv/train/data_parallel.h"
#include "qkv/train/trainer.h"
#include "qkv/train/loss.h"
#include "qkv/train/optim.h"
#include "qkv/train/schedule.h"
#include "run_common.h"
#include "run_data.h"
#include "run_model.h"

namespace qkv::cli {
namespace fs = std::filesystem;
namespace {

// SIGINT / SIGTERM: the handler only records the signal; the loop finishes its step, writes a checkpoint and exits
// with 128 + signal. SA_RESETHAND restores the default action on delivery, so a second signal stops at once.
volatile std::sig_atomic_t g_stop_signal = 0;

extern "C" void record_stop_signal(int sig) { g_stop_signal = sig; }

class StopSignals {
 public:
  StopSignals() {
    g_stop_signal = 0;
    struct sigaction sa {};
    sa.sa_handler = record_stop_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESETHAND;
    ::sigaction(SIGINT, &sa, &old_int_);
    ::sigaction(SIGTERM, &sa, &old_term_);
  }
  ~StopSignals() {
    ::sigaction(SIGINT, &old_int_, nullptr);
    ::sigaction(SIGTERM, &old_term_, nullptr);
  }
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;
  static int received() { return g_stop_signal; }

 private:
  struct sigaction old_int_ {}, old_term_ {};
};

struct TrainArgs {
  RunConfig c;
  std::string out, resume;
  int64_t threads = 0;
  bool no_overlap = false;
};

// An option whose value a resumed run may not change, with how to print its value from a config.
struct Locked {
  CLI::Option* opt;
  std::function<std::string(const RunConfig&)> value;
};

std::string fmt_duration(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  const long t = static_cast<long>(s + 0.5);
  char buf[32];
  if (t >= 3600) std::snprintf(buf, sizeof buf, "%ldh%02ldm", t / 3600, (t / 60) % 60);
  else if (t >= 60) std::snprintf(buf, sizeof buf, "%ldm%02lds", t / 60, t % 60);
  else std::snprintf(buf, sizeof buf, "%lds", t);
  return buf;
}

std::string fmt_rate(double r) {
  char buf[32];
  if (r >= 1e6) std::snprintf(buf, sizeof buf, "%.1fM", r / 1e6);
  else if (r >= 1e3) std::snprintf(buf, sizeof buf, "%.1fk", r / 1e3);
  else std::snprintf(buf, sizeof buf, "%.0f", r);
  return buf;
}

std::unique_ptr<train::Optimizer> make_optimizer(const RunConfig& c, ad::ParameterSet& params) {
  if (c.optimizer == "sgd") {
    train::SgdOptions o;
    o.lr = c.lr;
    o.momentum = c.momentum;
    o.weight_decay = c.weight_decay;
    return std::make_unique<train::SGD>(params, o);
  }
  train::AdamOptions o;
  o.lr = c.lr;
  o.weight_decay = c.weight_decay;
  return std::make_unique<train::Adam>(params, o, c.optimizer == "adamw");
}

train::LrSchedule make_schedule(const RunConfig& c) {
  train::LrSchedule s;
  s.kind = train::schedule_kind_from_string(c.schedule);
  s.lr = c.lr;
  s.warmup = c.warmup;
  s.d_model = c.d_model;
  s.total_steps = std::max(c.steps, c.warmup);
  return s;
}

// Prints the progress bar (terminal) or plain lines (pipe/file).
class Progress {
 public:
  // plain: log lines even on a terminal (under mpirun, whose ranks always write to a pseudo-terminal)
  Progress(int64_t total, int64_t first, bool plain)
      : total_(total), first_(first), tty_(!plain && ::isatty(STDOUT_FILENO) == 1) {
    start_ = last_draw_ = std::chrono::steady_clock::now();
  }
  double seconds() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }
  void step(int64_t step, float loss, double lr, int64_t tokens, bool log_line) {
    const double el = seconds();
    const double rate = el > 0 ? static_cast<double>(tokens) / el : 0.0;
    const double steps_per_s = el > 0 ? static_cast<double>(step - first_) / el : 0.0;
    const double eta = steps_per_s > 0 ? static_cast<double>(total_ - step) / steps_per_s : NAN;
    if (tty_) {
      const auto now = std::chrono::steady_clock::now();
      if (step != total_ && std::chrono::duration<double>(now - last_draw_).count() < 0.1) return;
      last_draw_ = now;
      const int width = 24;
      const int fill = static_cast<int>(width * static_cast<double>(step) / static_cast<double>(total_));
      std::string bar(static_cast<size_t>(fill), '#');
      bar.resize(width, '.');
      std::printf("\r\033[Kstep %lld/%lld [%s] %3d%% loss %.4f | %s tok/s | ETA %s", static_cast<long long>(step),
                  static_cast<long long>(total_), bar.c_str(), static_cast<int>(100 * step / total_), loss,
                  fmt_rate(rate).c_str(), fmt_duration(eta).c_str());
      bar_visible_ = step != total_;
      if (!bar_visible_) std::printf("\n");  // the last bar stays on screen
      std::fflush(stdout);
    } else if (log_line) {
      std::printf("step %lld/%lld loss %.9g lr %.6g tok/s %s elapsed %s eta %s\n", static_cast<long long>(step),
                  static_cast<long long>(total_), loss, lr, fmt_rate(rate).c_str(), fmt_duration(el).c_str(),
                  fmt_duration(eta).c_str());
      std::fflush(stdout);
    }
  }
  // A line that must stay (eval, checkpoint): clears the bar first on a terminal.
  void line(const std::string& text) {
    std::printf("%s%s\n", bar_visible_ ? "\r\033[K" : "", text.c_str());
    std::fflush(stdout);
  }
  void finish() {
    if (bar_visible_) std::printf("\n");
    bar_visible_ = false;
    std::fflush(stdout);
  }

 private:
  int64_t total_, first_;
  bool tty_;
  bool bar_visible_ = false;  // a progress bar is on the current terminal line
  std::chrono::steady_clock::time_point start_, last_draw_;
};

// Every rank must train the same run: refuses, on every rank, a configuration that differs, a layout that the
// ranks do not match (data parallel: a global batch that does not split evenly; context parallel: other than
// --context-parallel ranks, or sequences that the padding to 2N chunks takes past the decoder's learned positions;
// Llama's rotary positions have no table).
void check_same_run(parallel::Communicator& comm, const RunConfig& c, const RunData& d) {
  const int64_t n = comm.size();
  if (c.context_parallel > 1) {
    QKV_CHECK_ARG(c.context_parallel == n, "[train] --context-parallel ", c.context_parallel, " needs exactly ",
                  c.context_parallel, " ranks (mpirun -np ", c.context_parallel, "), got ", n,
                  ": context and data parallelism together are not supported");
    int64_t longest = 0;
    for (const data::Example& e : d.train)
      longest = std::max<int64_t>(longest, static_cast<int64_t>(e.src.size() + e.tgt.size()) + 1);
    const int64_t padded = (longest + 2 * n - 1) / (2 * n) * (2 * n);
    QKV_CHECK_ARG(c.model != "decoder" || padded <= c.max_positions, "[train] --context-parallel ", n,
                  " pads the longest training sequence (", longest, " tokens) to ", padded, " positions (2 x ", n,
                  " equal chunks), more than --max-positions ", c.max_positions, ": raise --max-positions to at least ",
                  padded);
  } else {
    QKV_CHECK_ARG(c.batch_size % n == 0, "[train] --batch-size ", c.batch_size, " (the global batch) does not ",
                  "divide by the ", n, " ranks of mpirun");
  }
  // Every setting of config.json compared on its own, so that a difference names its flags.
  std::string differ;
  for (const auto& [key, value] : parse_flat_json(c.to_json(), "config.json")) {
    try {
      comm.check_same(parallel::hash_bytes(value.data(), value.size()), key);
    } catch (const std::runtime_error&) {
      std::string flag = key == "data_hash" ? "--data file contents" : "--" + key;
      std::replace(flag.begin(), flag.end(), '_', '-');
      differ += (differ.empty() ? "" : ", ") + flag;
    }
  }
  QKV_CHECK_ARG(differ.empty(), "[train] the ranks of mpirun were given different ", differ,
                ": every rank must train the same run (give them the same options)");
}

void run_train(TrainArgs a, const std::vector<Locked>& locked,
               const std::vector<std::pair<CLI::Option*, std::function<void(RunConfig&)>>>& data_opts,
               CLI::Option* model_opt, const std::vector<std::pair<CLI::Option*, std::function<void(RunConfig&)>>>&
                                           run_overrides) {
  const StopSignals stop_signals;
  if (a.threads > 0) omp_set_num_threads(static_cast<int>(a.threads));
  // Under mpirun every rank trains on its shard of each global batch; rank 0 alone prints and writes files.
  parallel::Communicator& comm = parallel::Communicator::world();
  const int nranks = comm.size(), rank = comm.rank();
  const bool rank0 = rank == 0;
  if (!rank0) QKV_CHECK_RUNTIME(std::freopen("/dev/null", "w", stdout) != nullptr, "[train] rank ", rank,
                                " cannot silence its standard output");
  const bool resume = !a.resume.empty();
  std::string dir;
  RunConfig c;
  RunData d;
  if (resume) {
    QKV_CHECK_ARG(a.out.empty() || fs::path(a.out).lexically_normal() == fs::path(a.resume).lexically_normal(),
                  "[train] --out '", a.out, "' and --resume '", a.resume, "' name different directories");
    dir = a.resume;
    RunConfig saved = load_run_config(dir, "train");
    if (model_opt->count() > 0 && a.c.model != saved.model)
      throw std::invalid_argument("[train] '" + dir + "' holds a '" + saved.model + "' run, not '" + a.c.model +
                                  "': a checkpoint from another model kind cannot be resumed");
    for (const Locked& l : locked)
      if (l.opt->count() > 0 && l.value(a.c) != l.value(saved))
        throw std::invalid_argument("[train] " + l.opt->get_name() + " " + l.value(a.c) + " differs from the run's " +
                                    l.value(saved) + " in '" + dir + "/config.json'; a resumed run keeps its settings");
    // New data options (the vocabulary must stay the same, checked below): each one given replaces its saved
    // value; --task or --data replaces the source.
    for (const auto& [opt, apply] : data_opts)
      if (opt->count() > 0) apply(saved);
    for (const auto& [opt, apply] : run_overrides)
      if (opt->count() > 0) apply(saved);
    c = saved;
    c.resolve_and_check();
    const data::Vocabulary vocab = data::Vocabulary::load((fs::path(dir) / "vocab.txt").string());
    const std::string old_hash = c.data_hash;
    d = load_run_data(c);
    QKV_CHECK_ARG(c.ranks == nranks, "[train] '", dir, "' was trained on ", c.ranks, " rank", c.ranks == 1 ? "" : "s",
                  c.context_parallel > 1 ? " (context parallel)" : c.ranks > 1 ? " (data parallel)" : "",
                  "; resuming it on ", nranks, " is refused (the split of every batch and the order of the gradient "
                  "sums would change): resume with mpirun -np ", c.ranks);
    check_same_run(comm, c, d);
    if (d.vocab != vocab) {
      std::string given;  // the data options that made the difference
      for (const auto& [opt, apply] : data_opts)
        if (opt->count() > 0) given += (given.empty() ? "" : " ") + opt->get_name() + " " + opt->as<std::string>();
      throw std::invalid_argument("[train] vocabulary mismatch on resume: " +
                                  (given.empty() ? std::string("the data") : "the data of " + given) +
                                  " builds another vocabulary than '" + dir + "/vocab.txt' (" +
                                  vocab_difference(vocab, d.vocab) +
                                  "); a resumed run keeps its vocabulary, so its data may change only in ways that "
                                  "keep it");
    }
    if (!old_hash.empty() && old_hash != c.data_hash)
      std::fprintf(stderr, "qkv: warning: the data changed since the run started; the resumed run will differ\n");
  } else {
    QKV_CHECK_ARG(!a.out.empty(), "[train] --out DIR is required (or --resume DIR)");
    dir = a.out;
    QKV_CHECK_ARG(!fs::exists(fs::path(dir) / "config.json"), "[train] '", dir,
                  "' already holds a run; continue it with --resume ", dir, " or choose another --out");
    c = a.c;
    c.ranks = nranks;
    c.resolve_and_check();
    d = load_run_data(c);
    check_same_run(comm, c, d);  // also: every rank has looked at `dir` before rank 0 writes to it
  }
  if (!resume && rank0) {
    std::error_code ec;
    fs::create_directories(dir, ec);
    QKV_CHECK_RUNTIME(!ec, "[train] cannot create '", dir, "': ", ec.message());
    // A vocab.txt that is not this run's own (same bytes, as after a kill before config.json) is someone's file.
    const std::string vocab_path = (fs::path(dir) / "vocab.txt").string();
    if (fs::exists(vocab_path, ec) || fs::is_symlink(vocab_path, ec)) {
      std::string existing;
      try {
        existing = read_file_text(vocab_path, "train");
      } catch (const std::runtime_error&) {
        existing.clear();
      }
      QKV_CHECK_ARG(existing == d.vocab.serialize(), "[train] '", vocab_path,
                    "' already exists and was not written by this run; remove it or choose another --out");
    }
    d.vocab.save(vocab_path);
  }
  QKV_CHECK_ARG(!d.train.empty(), "[train] the training split is empty");
  if (rank0) write_file_atomic((fs::path(dir) / "config.json").string(), c.to_json());

  Rng init(c.seed);
  std::unique_ptr<train::TextModel> model = make_run_model(c, d.vocab.size(), init);
  ad::ParameterSet params(model->module());
  std::unique_ptr<train::Optimizer> opt = make_optimizer(c, params);
  const train::LrSchedule schedule = make_schedule(c);
  TrainerState st;
  const uint64_t dropout_seed = c.seed ^ 0xD80F0D7ULL;
  Rng dropout_rng(dropout_seed);
  const std::string ckpt = resume ? latest_checkpoint(dir) : "";
  if (!ckpt.empty()) {
    LoadedCheckpoint loaded = load_checkpoint(ckpt, c.model);
    try {
      model->module().load_state_dict(loaded.weights, true);
      opt->load_state_dict(loaded.optimizer);
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument("[checkpoint] " + ckpt + " does not fit this '" + c.model + "' run: " + e.what());
    }
    st = loaded.state;
    dropout_rng.set_state(st.dropout_rng_state);
  }
  train::DataParallel dp(comm, params);
  dp.set_overlap(!a.no_overlap);
  if (nranks > 1) dp.broadcast_from_root(*opt);
  // Context parallel: every rank runs the whole batch on its positions of each sequence (ring attention), and its
  // loss is its share of the global token mean.
  const bool context_parallel = c.context_parallel > 1;
  const train::ContextParallel cp(comm);
  dp.set_loss_shares(context_parallel);
  data::Sampler sampler(static_cast<int64_t>(d.train.size()), c.batch_size, c.seed ^ 0x5A3D1E5ULL);
  sampler.seek(st.epoch, st.position);

  std::printf("%s %s: %lld parameters, vocabulary %lld, %zu train / %zu test examples, %s\n",
              resume && !ckpt.empty() ? "resuming" : "training", c.model.c_str(),
              static_cast<long long>(params.numel()), static_cast<long long>(d.vocab.size()), d.train.size(),
              d.test.size(), resume && !ckpt.empty() ? ("from step " + std::to_string(st.step)).c_str() : dir.c_str());
  if (st.step >= c.steps) {
    std::printf("already at step %lld of %lld: nothing to do\n", static_cast<long long>(st.step),
                static_cast<long long>(c.steps));
    return;
  }
  std::fflush(stdout);

  train::CrossEntropyOptions ce;
  ce.ignore_index = data::Vocabulary::kPad;
  ce.label_smoothing = static_cast<float>(c.label_smoothing);
  const DecodeSettings dec{c.max_decode_len, 1, 0.6, 64};
  train::Trainer trainer(params, *opt, schedule, dropout_rng, c.clip);
  if (nranks > 1) trainer.set_data_parallel(&dp);
  Progress progress(c.steps, st.step, nranks > 1);
  int64_t tokens = 0;
  const double elapsed_before = st.elapsed_s;
  model->module().train();
  // bf16 trains on its live weights; fp32, the new model's default, is left unprepared (packed fp32 copies would
  // sit unused once the first step switches the model to its live weights).
  if (const Precision p = parse_precision(c.precision); p != Precision::kFloat32) model->module().set_precision(p);
  auto stopped = [&](bool saved) {
    const int sig = StopSignals::received();
    progress.finish();
    std::fflush(stdout);
    std::fprintf(stderr, "qkv: train stopped by %s at step %lld%s; continue with --resume %s\n",
                 sig == SIGINT ? "SIGINT" : "SIGTERM", static_cast<long long>(st.step),
                 saved ? ", checkpoint written" : " (nothing new to save)", dir.c_str());
    throw ExitStatus{128 + sig};
  };
  if (StopSignals::received() != 0) stopped(false);  // before the first step: the run directory is as it was
  const int64_t first_step = st.step, bytes_before = comm.bytes_sent();
  for (int64_t step = st.step + 1; step <= c.steps; ++step) {
    const std::vector<int64_t> idx = sampler.next();
    // This rank's contiguous share of the global batch. A share left empty (an epoch's short last batch) runs one
    // example with weight 0, so that every rank takes part in the step and adds nothing.
    const size_t lo = context_parallel ? 0 : idx.size() * static_cast<size_t>(rank) / static_cast<size_t>(nranks);
    const size_t hi =
        context_parallel ? idx.size() : idx.size() * static_cast<size_t>(rank + 1) / static_cast<size_t>(nranks);
    std::vector<const data::Example*> batch;
    for (size_t i = lo; i < hi; ++i) batch.push_back(&d.train[static_cast<size_t>(idx[i])]);
    const bool empty_share = batch.empty();
    if (empty_share) batch.push_back(&d.train[static_cast<size_t>(idx[0])]);
    int64_t ntok = 0;
    const train::StepResult r = trainer.step(step, [&](nn::Context& g) {
      if (context_parallel) g.set_sequence_shard(&cp);
      const train::TeacherForced tf = model->teacher_forced(g, batch);
      ntok = empty_share ? 0 : tf.num_target_tokens;
      const double terms = empty_share ? 0.0 : static_cast<double>(train::count_targets(tf.targets, ce.ignore_index));
      dp.set_local_weight(terms);
      if (!context_parallel) return train::cross_entropy(tf.logits, tf.targets, ce);
      // This rank's share of the mean over the global batch's loss terms (summed over the ranks' positions).
      train::CrossEntropyOptions sum = ce;
      sum.reduction = train::Reduction::kSum;
      const double total = cp.global_sum(terms);
      const float inv = total > 0.0 ? static_cast<float>(1.0 / total) : 0.0f;
      return ad::scale(train::cross_entropy(tf.logits, tf.targets, sum), inv);
    });
    const float loss_value = static_cast<float>(r.loss);
    QKV_CHECK_RUNTIME(r.finite, "[train] the loss became ", loss_value, " at step ", step,
                      " (try a smaller --lr or --clip)");
    const double lr = r.lr;
    if (nranks > 1) {
      dp.check_replicas(step);  // every rank holds the same bits after every step
      float n = static_cast<float>(ntok);
      comm.allreduce_sum(&n, 1);
      ntok = static_cast<int64_t>(n);
    }
    tokens += ntok;
    st.step = step;
    st.last_loss = loss_value;
    progress.step(step, loss_value, lr, tokens, step % c.log_every == 0 || step == c.steps);

    bool stop = false;
    if (rank0 && (step % c.eval_every == 0 || step == c.steps) && !d.test.empty() && c.eval_size > 0) {
      const EvalResult r = evaluate(*model, d.test, c.eval_size, dec);
      stop = c.early_stop > 0.0 && r.exact_match >= c.early_stop;
      model->module().train();
      char buf[160];
      std::snprintf(buf, sizeof buf, "eval step %lld: exact_match %.4f token_accuracy %.4f (%lld examples)",
                    static_cast<long long>(step), r.exact_match, r.token_accuracy,
                    static_cast<long long>(r.examples));
      progress.line(buf);
    }
    bool signalled = StopSignals::received() != 0;
    if (nranks > 1) {  // rank 0's early stop and any rank's signal stop every rank at the same step
      float flags[2] = {stop ? 1.0f : 0.0f, signalled ? 1.0f : 0.0f};
      comm.allreduce_max(flags, 2);
      stop = flags[0] != 0.0f;
      signalled = flags[1] != 0.0f;
    }
    if (step % c.checkpoint_every == 0 || step == c.steps || stop || signalled) {
      st.epoch = sampler.epoch();
      st.position = sampler.position();
      st.dropout_rng_state = dropout_rng.state();
      st.elapsed_s = elapsed_before + progress.seconds();
      if (rank0) {
        const std::string path =
            save_checkpoint(dir, c.model, model->module().state_dict(), opt->state_dict(), st, c.keep_checkpoints);
        progress.line("checkpoint step " + std::to_string(step) + " -> " + path);
      }
    }
    if (signalled) {
      comm.barrier();  // rank 0's checkpoint is on disk before any rank reports it
      stopped(true);
    }
    if (stop) {
      progress.line("early stop at step " + std::to_string(step) + ": exact match reached --early-stop " +
                    std::to_string(c.early_stop));
      break;
    }
  }
  progress.finish();
  if (nranks > 1 && st.step > first_step)
    std::printf("%s parallel: %d ranks, global batch %lld; parameters identical on every rank after every step "
                "(hash checked); %.0f bytes to MPI per step on rank 0 (%lld parameters)\n",
                context_parallel ? "context" : "data", nranks, static_cast<long long>(c.batch_size),
                static_cast<double>(comm.bytes_sent() - bytes_before) / static_cast<double>(st.step - first_step),
                static_cast<long long>(params.numel()));
}

}  // namespace

void add_train(CLI::App& app) {
  auto* cmd = app.add_subcommand("train", "Train a Seq2Seq (RNN or Transformer) or decoder-only model with checkpoints");
  auto a = std::make_shared<TrainArgs>();
  RunConfig& c = a->c;
  auto locked = std::make_shared<std::vector<Locked>>();
  auto data_opts = std::make_shared<std::vector<std::pair<CLI::Option*, std::function<void(RunConfig&)>>>>();
  auto overrides = std::make_shared<std::vector<std::pair<CLI::Option*, std::function<void(RunConfig&)>>>>();
  auto lock = [&](CLI::Option* o, std::function<std::string(const RunConfig&)> f) { locked->push_back({o, f}); };
  auto i64 = [](int64_t RunConfig::*m) { return [m](const RunConfig& r) { return std::to_string(r.*m); }; };
  auto f64 = [](double RunConfig::*m) { return [m](const RunConfig& r) { return format_double(r.*m); }; };
  auto s = [](std::string RunConfig::*m) { return [m](const RunConfig& r) { return r.*m; }; };

  cmd->group("Model");
  CLI::Option* model_opt = cmd->add_option("--model", c.model, "rnn | rnn-attn | transformer | decoder | llama")
                               ->capture_default_str();
  lock(cmd->add_option("--cell", c.cell, "RNN cell: gru | lstm")->capture_default_str(), s(&RunConfig::cell));
  lock(cmd->add_option("--attention", c.attention, "rnn-attn scoring: bahdanau | luong-dot | luong-general")
           ->capture_default_str(),
       s(&RunConfig::attention));
  lock(cmd->add_option("--d-model", c.d_model, "Embedding width / d_model (default 64)")->check(at_least(1)), i64(&RunConfig::d_model));
  lock(cmd->add_option("--hidden", c.hidden, "RNN hidden size (default 128)")->check(at_least(1)), i64(&RunConfig::hidden));
  lock(cmd->add_option("--layers", c.layers, "Layers (default: RNN 1, Transformers 2 per side)")->check(at_least(1)),
       i64(&RunConfig::layers));
  lock(cmd->add_option("--heads", c.heads, "Attention heads")->capture_default_str()->check(at_least(1)), i64(&RunConfig::heads));
  lock(cmd->add_option("--ffn", c.ffn, "Feed-forward width (default 4 * d_model)")->check(at_least(1)), i64(&RunConfig::ffn));
  lock(cmd->add_option("--dropout", c.dropout, "Dropout")->capture_default_str(), f64(&RunConfig::dropout));
  lock(cmd->add_flag("--post-ln", c.post_ln, "Transformers: post-LN (as the 2017 paper) instead of pre-LN"),
       [](const RunConfig& r) { return std::string(r.post_ln ? "true" : "false"); });
  lock(cmd->add_flag("--scale-embeddings", c.scale_embeddings,
                     "transformer: scale token embeddings by sqrt(d_model), as the paper (off: see docs)"),
       [](const RunConfig& r) { return std::string(r.scale_embeddings ? "true" : "false"); });
  lock(cmd->add_flag("--reverse-source", c.reverse_source, "rnn: read the source reversed (Sutskever et al. 2014)"),
       [](const RunConfig& r) { return std::string(r.reverse_source ? "true" : "false"); });
  lock(cmd->add_option("--max-positions", c.max_positions, "decoder: learned positions (default from the data)")->check(at_least(1)),
       i64(&RunConfig::max_positions));

  cmd->group("Data");
  RunConfig* dp = &a->c;
  auto dat = [&](CLI::Option* o, std::function<void(RunConfig&)> f) { data_opts->push_back({o, f}); };
  dat(cmd->add_option("--task", c.task, "copy | reverse | sort | addition | dates | num2words-en | num2words-zh"),
      [dp](RunConfig& r) { r.task = dp->task; r.data.clear(); r.test_data.clear(); });
  dat(cmd->add_option("--data", c.data, "TSV parallel corpus (source<TAB>target per line)"),
      [dp](RunConfig& r) { r.data = dp->data; r.task.clear(); });
  dat(cmd->add_option("--test-data", c.test_data, "TSV test corpus (default: held out from --data)"),
      [dp](RunConfig& r) { r.test_data = dp->test_data; });
  dat(cmd->add_option("--test-fraction", c.test_fraction, "Share of --data held out for testing")->capture_default_str(),
      [dp](RunConfig& r) { r.test_fraction = dp->test_fraction; });
  dat(cmd->add_option("--tokenizer", c.tokenizer, "TSV tokenizer: char | word | byte")->capture_default_str(),
      [dp](RunConfig& r) { r.tokenizer = dp->tokenizer; });
  dat(cmd->add_option("--max-tokens", c.max_tokens,
                      "TSV: skip (and count, on stderr) pairs with more tokens than this on a side")
          ->capture_default_str()
          ->check(at_least(1)),
      [dp](RunConfig& r) { r.max_tokens = dp->max_tokens; });
  dat(cmd->add_option("--train-size", c.train_size, "Task training examples")->capture_default_str(),
      [dp](RunConfig& r) { r.train_size = dp->train_size; });
  dat(cmd->add_option("--test-size", c.test_size, "Task test examples")->capture_default_str(),
      [dp](RunConfig& r) { r.test_size = dp->test_size; });
  dat(cmd->add_option("--min-len", c.min_len, "Task: shortest sequence (digits for numbers)")->capture_default_str()->check(at_least(1)),
      [dp](RunConfig& r) { r.min_len = dp->min_len; });
  dat(cmd->add_option("--max-len", c.max_len, "Task: longest sequence (digits for numbers)")->capture_default_str()->check(at_least(1)),
      [dp](RunConfig& r) { r.max_len = dp->max_len; });
  dat(cmd->add_option("--alphabet", c.alphabet, "copy/reverse/sort: digits | letters")->capture_default_str(),
      [dp](RunConfig& r) { r.alphabet = dp->alphabet; });
  lock(cmd->add_option("--max-decode-len", c.max_decode_len, "Generation limit (default: longest target + 8)")->check(at_least(1)),
       i64(&RunConfig::max_decode_len));

  cmd->group("Optimisation");
  lock(cmd->add_option("--optimizer", c.optimizer, "adam | adamw | sgd")->capture_default_str(),
       s(&RunConfig::optimizer));
  lock(cmd->add_option("--lr", c.lr, "Learning rate (inverse_sqrt: the scale factor)")->capture_default_str(),
       f64(&RunConfig::lr));
  lock(cmd->add_option("--weight-decay", c.weight_decay, "Weight decay")->capture_default_str(),
       f64(&RunConfig::weight_decay));
  lock(cmd->add_option("--momentum", c.momentum, "SGD momentum")->capture_default_str(), f64(&RunConfig::momentum));
  lock(cmd->add_option("--clip", c.clip, "Clip the global gradient norm (0 = off)")->capture_default_str(),
       f64(&RunConfig::clip));
  lock(cmd->add_option("--schedule", c.schedule, "constant | inverse_sqrt | cosine")->capture_default_str(),
       s(&RunConfig::schedule));
  lock(cmd->add_option("--warmup", c.warmup, "Warmup steps")->capture_default_str(), i64(&RunConfig::warmup));
  lock(cmd->add_option("--label-smoothing", c.label_smoothing, "Label smoothing")->capture_default_str(),
       f64(&RunConfig::label_smoothing));
  lock(cmd->add_option("--precision", c.precision,
                       "fp32 | bf16: compute precision of the linears and attention, forward and backward")
           ->capture_default_str(),
       s(&RunConfig::precision));
  lock(cmd->add_option("--batch-size", c.batch_size, "Examples per step")->capture_default_str(),
       i64(&RunConfig::batch_size));
  lock(cmd->add_option("--context-parallel", c.context_parallel,
                       "mpirun -np N: the N ranks split every sequence (ring attention; --model decoder or llama) "
                       "instead of the batch")
           ->capture_default_str()
           ->check(at_least(1)),
       i64(&RunConfig::context_parallel));
  lock(cmd->add_option("--seed", c.seed, "Seed of the data, the init, the shuffling and dropout")
           ->capture_default_str()
           ->check(seed_value()),
       [](const RunConfig& r) { return std::to_string(r.seed); });

  cmd->group("Run");
  auto over = [&](CLI::Option* o, std::function<void(RunConfig&)> f) { overrides->push_back({o, f}); };
  RunConfig* cp = &a->c;
  over(cmd->add_option("--steps", c.steps, "Train until this many steps")->capture_default_str(),
       [cp](RunConfig& r) { r.steps = cp->steps; });
  over(cmd->add_option("--eval-every", c.eval_every, "Evaluate every N steps")->capture_default_str(),
       [cp](RunConfig& r) { r.eval_every = cp->eval_every; });
  over(cmd->add_option("--eval-size", c.eval_size, "Test examples per periodic evaluation")->capture_default_str(),
       [cp](RunConfig& r) { r.eval_size = cp->eval_size; });
  over(cmd->add_option("--checkpoint-every", c.checkpoint_every, "Checkpoint every N steps (default --eval-every)")->check(at_least(1)),
       [cp](RunConfig& r) { r.checkpoint_every = cp->checkpoint_every; });
  over(cmd->add_option("--log-every", c.log_every, "Plain log line every N steps")->capture_default_str(),
       [cp](RunConfig& r) { r.log_every = cp->log_every; });
  over(cmd->add_option("--early-stop", c.early_stop, "Stop once a periodic evaluation reaches this exact match")
           ->capture_default_str(),
       [cp](RunConfig& r) { r.early_stop = cp->early_stop; });
  over(cmd->add_option("--keep-checkpoints", c.keep_checkpoints, "Checkpoints kept")->capture_default_str(),
       [cp](RunConfig& r) { r.keep_checkpoints = cp->keep_checkpoints; });
  cmd->add_option("--out", a->out, "Run directory (config.json, vocab.txt, checkpoints/)");
  cmd->add_option("--resume", a->resume, "Continue the run in this directory from its latest checkpoint");
  cmd->add_option("--threads", a->threads, "OpenMP threads (default: OMP_NUM_THREADS)")->check(at_least(1));
  cmd->add_flag("--no-overlap", a->no_overlap,
                "mpirun: all-reduce the gradients after the backward, not during it (for timing the overlap)");

  cmd->callback([a, locked, data_opts, model_opt, overrides]() {
    try {
      run_train(*a, *locked, *data_opts, model_opt, *overrides);
    } catch (const CLI::Error&) {
      throw;
    } catch (const std::exception& e) {
      throw std::runtime_error(one_line(e.what()));
    }
  });
}

}  // namespace qkv::cli
