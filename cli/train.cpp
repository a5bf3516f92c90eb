// `qkv train --model rnn|rnn-attn|transformer|decoder --task NAME|--data FILE.tsv --steps N --out DIR --seed S
// [--resume DIR]`: parses the options and runs the library's train::TextRun (periodic evaluation, atomic
// checkpoints, bit-exact --resume) with a live progress bar (plain log lines when stdout is not a terminal).
// SIGINT/SIGTERM set the run's stop flag: it finishes the current step, writes a checkpoint and the command exits
// 130/143; a second signal stops at once.
#include <omp.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "commands.h"
#include "qkv/core/error.h"
#include "qkv/parallel/comm.h"
#include "qkv/train/text_run.h"
#include "run_common.h"

namespace qkv::cli {
namespace fs = std::filesystem;
namespace {

// SIGINT / SIGTERM: the handler only records the signal; the loop finishes its step, writes a checkpoint and exits
// with 128 + signal. SA_RESETHAND restores the default action on delivery, so a second signal stops at once.
volatile std::sig_atomic_t g_stop_signal = 0;
std::atomic<bool> g_stop_requested{false};  // train::Run's cooperative stop flag (lock-free: safe in a handler)
static_assert(std::atomic<bool>::is_always_lock_free);

extern "C" void record_stop_signal(int sig) {
  g_stop_signal = sig;
  g_stop_requested.store(true, std::memory_order_relaxed);
}

class StopSignals {
 public:
  StopSignals() {
    g_stop_signal = 0;
    g_stop_requested.store(false);
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
  std::unique_ptr<train::TextRun> run;
  if (resume) {
    QKV_CHECK_ARG(a.out.empty() || fs::path(a.out).lexically_normal() == fs::path(a.resume).lexically_normal(),
                  "[train] --out '", a.out, "' and --resume '", a.resume, "' name different directories");
    const std::string& dir = a.resume;
    RunConfig saved = load_run_config(dir, "train");
    if (model_opt->count() > 0 && a.c.model != saved.model)
      throw std::invalid_argument("[train] '" + dir + "' holds a '" + saved.model + "' run, not '" + a.c.model +
                                  "': a checkpoint from another model kind cannot be resumed");
    for (const Locked& l : locked)
      if (l.opt->count() > 0 && l.value(a.c) != l.value(saved))
        throw std::invalid_argument("[train] " + l.opt->get_name() + " " + l.value(a.c) + " differs from the run's " +
                                    l.value(saved) + " in '" + dir + "/config.json'; a resumed run keeps its settings");
    // New data options (the vocabulary must stay the same, checked by the run): each one given replaces its saved
    // value; --task or --data replaces the source.
    std::string given;  // the data options given, named if the vocabulary changes
    for (const auto& [opt, apply] : data_opts)
      if (opt->count() > 0) {
        apply(saved);
        given += (given.empty() ? "" : " ") + opt->get_name() + " " + opt->as<std::string>();
      }
    for (const auto& [opt, apply] : run_overrides)
      if (opt->count() > 0) apply(saved);
    run = train::TextRun::resume(saved, dir, &comm, given);
    if (run->data_changed())
      std::fprintf(stderr, "qkv: warning: the data changed since the run started; the resumed run will differ\n");
  } else {
    run = train::TextRun::start(a.c, a.out, &comm);
  }
  const RunConfig& c = run->config();
  const train::RunData& d = run->data();
  const std::string& dir = run->dir();
  const train::TrainerState& st = run->run().state();
  const bool resumed = !run->resumed_from().empty();
  std::printf("%s %s: %lld parameters, vocabulary %lld, %zu train / %zu test examples, %s\n",
              resumed ? "resuming" : "training", c.model.c_str(), static_cast<long long>(run->num_parameters()),
              static_cast<long long>(d.vocab.size()), d.train.size(), d.test.size(),
              resumed ? ("from step " + std::to_string(st.step)).c_str() : dir.c_str());
  if (st.step >= c.steps) {
    std::printf("already at step %lld of %lld: nothing to do\n", static_cast<long long>(st.step),
                static_cast<long long>(c.steps));
    return;
  }
  std::fflush(stdout);

  Progress progress(c.steps, st.step, nranks > 1);
  train::TextRunHooks hooks;
  hooks.on_step = [&](const train::RunStep& s) {
    progress.step(s.step, static_cast<float>(s.loss), s.lr, s.tokens, s.step % c.log_every == 0 || s.step == c.steps);
  };
  hooks.on_eval = [&](int64_t step, const train::EvalResult& r) {
    char buf[160];
    std::snprintf(buf, sizeof buf, "eval step %lld: exact_match %.4f token_accuracy %.4f (%lld examples)",
                  static_cast<long long>(step), r.exact_match, r.token_accuracy, static_cast<long long>(r.examples));
    progress.line(buf);
  };
  hooks.on_checkpoint = [&](int64_t step, const std::string& path) {
    progress.line("checkpoint step " + std::to_string(step) + " -> " + path);
  };
  run->run().set_overlap(!a.no_overlap);
  const train::RunResult r = run->train(hooks, &g_stop_requested);
  if (r.stopped) {
    const int sig = StopSignals::received();
    progress.finish();
    std::fflush(stdout);
    std::fprintf(stderr, "qkv: train stopped by %s at step %lld%s; continue with --resume %s\n",
                 sig == SIGINT ? "SIGINT" : "SIGTERM", static_cast<long long>(r.step),
                 r.step > r.first_step ? ", checkpoint written" : " (nothing new to save)", dir.c_str());
    throw ExitStatus{128 + sig};
  }
  if (r.early_stopped)
    progress.line("early stop at step " + std::to_string(r.step) + ": exact match reached --early-stop " +
                  std::to_string(c.early_stop));
  progress.finish();
  if (nranks > 1 && r.step > r.first_step)
    std::printf("%s parallel: %d ranks, global batch %lld; parameters identical on every rank after every step "
                "(hash checked); %.0f bytes to MPI per step on rank 0 (%lld parameters)\n",
                c.context_parallel > 1 ? "context" : "data", nranks, static_cast<long long>(c.batch_size),
                static_cast<double>(r.bytes_sent) / static_cast<double>(r.step - r.first_step),
                static_cast<long long>(run->num_parameters()));
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
