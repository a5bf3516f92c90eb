// train::TextRun: opening a run directory (new or resumed), checking that every rank trains the same run, and
// training its TextModel through train::Run with periodic evaluation.
#include "qkv/train/text_run.h"

#include <algorithm>
#include <filesystem>

#include "qkv/core/error.h"
#include "qkv/core/io.h"
#include "qkv/data/vocab.h"

namespace qkv::train {
namespace fs = std::filesystem;
namespace {

// Every rank must train the same run: refuses, on every rank, a configuration that differs, a layout that the
// ranks do not match (data parallel: a global batch that does not split evenly; context parallel: other than
// --context-parallel ranks, or sequences that the padding to 2N chunks takes past the decoder's learned positions;
// Llama's rotary positions have no table).
void check_same_run(parallel::Communicator* comm, const RunConfig& c, const RunData& d) {
  const int64_t n = comm != nullptr ? comm->size() : 1;
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
  if (comm == nullptr) return;
  // Every setting of config.json compared on its own, so that a difference names its flags.
  std::string differ;
  for (const auto& [key, value] : parse_flat_json(c.to_json(), "config.json")) {
    try {
      comm->check_same(parallel::hash_bytes(value.data(), value.size()), key);
    } catch (const std::runtime_error&) {
      std::string flag = key == "data_hash" ? "--data file contents" : "--" + key;
      std::replace(flag.begin(), flag.end(), '_', '-');
      differ += (differ.empty() ? "" : ", ") + flag;
    }
  }
  QKV_CHECK_ARG(differ.empty(), "[train] the ranks of mpirun were given different ", differ,
                ": every rank must train the same run (give them the same options)");
}

bool is_rank0(parallel::Communicator* comm) { return comm == nullptr || comm->rank() == 0; }

}  // namespace

std::unique_ptr<Optimizer> make_optimizer(const RunConfig& c, ad::ParameterSet& params) {
  if (c.optimizer == "sgd") {
    SgdOptions o;
    o.lr = c.lr;
    o.momentum = c.momentum;
    o.weight_decay = c.weight_decay;
    return std::make_unique<SGD>(params, o);
  }
  AdamOptions o;
  o.lr = c.lr;
  o.weight_decay = c.weight_decay;
  return std::make_unique<Adam>(params, o, c.optimizer == "adamw");
}

LrSchedule make_schedule(const RunConfig& c) {
  LrSchedule s;
  s.kind = schedule_kind_from_string(c.schedule);
  s.lr = c.lr;
  s.warmup = c.warmup;
  s.d_model = c.d_model;
  s.total_steps = std::max(c.steps, c.warmup);
  return s;
}

std::unique_ptr<TextRun> TextRun::start(RunConfig config, const std::string& dir, parallel::Communicator* comm) {
  QKV_CHECK_ARG(!dir.empty(), "[train] --out DIR is required (or --resume DIR)");
  QKV_CHECK_ARG(!fs::exists(fs::path(dir) / "config.json"), "[train] '", dir,
                "' already holds a run; continue it with --resume ", dir, " or choose another --out");
  std::unique_ptr<TextRun> r(new TextRun());
  r->dir_ = dir;
  r->config_ = std::move(config);
  RunConfig& c = r->config_;
  c.ranks = comm != nullptr ? comm->size() : 1;
  c.resolve_and_check();
  r->data_ = load_run_data(c);
  check_same_run(comm, c, r->data_);  // also: every rank has looked at `dir` before rank 0 writes to it
  if (is_rank0(comm)) {
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
      QKV_CHECK_ARG(existing == r->data_.vocab.serialize(), "[train] '", vocab_path,
                    "' already exists and was not written by this run; remove it or choose another --out");
    }
    r->data_.vocab.save(vocab_path);
  }
  r->build(comm);
  return r;
}

std::unique_ptr<TextRun> TextRun::resume(RunConfig config, const std::string& dir, parallel::Communicator* comm,
                                         const std::string& data_options) {
  std::unique_ptr<TextRun> r(new TextRun());
  r->dir_ = dir;
  r->config_ = std::move(config);
  RunConfig& c = r->config_;
  c.resolve_and_check();
  const data::Vocabulary vocab = data::Vocabulary::load((fs::path(dir) / "vocab.txt").string());
  const std::string old_hash = c.data_hash;
  r->data_ = load_run_data(c);
  const int64_t nranks = comm != nullptr ? comm->size() : 1;
  QKV_CHECK_ARG(c.ranks == nranks, "[train] '", dir, "' was trained on ", c.ranks, " rank", c.ranks == 1 ? "" : "s",
                c.context_parallel > 1 ? " (context parallel)" : c.ranks > 1 ? " (data parallel)" : "",
                "; resuming it on ", nranks, " is refused (the split of every batch and the order of the gradient "
                "sums would change): resume with mpirun -np ", c.ranks);
  check_same_run(comm, c, r->data_);
  QKV_CHECK_ARG(r->data_.vocab == vocab, "[train] vocabulary mismatch on resume: ",
                data_options.empty() ? std::string("the data") : "the data of " + data_options,
                " builds another vocabulary than '", dir, "/vocab.txt' (", vocab_difference(vocab, r->data_.vocab),
                "); a resumed run keeps its vocabulary, so its data may change only in ways that keep it");
  r->data_changed_ = !old_hash.empty() && old_hash != c.data_hash;
  r->build(comm);
  r->checkpoint_ = r->run_->resume();
  return r;
}

TextRun::~TextRun() = default;

void TextRun::build(parallel::Communicator* comm) {
  const RunConfig& c = config_;
  QKV_CHECK_ARG(!data_.train.empty(), "[train] the training split is empty");
  if (is_rank0(comm)) write_file_atomic((fs::path(dir_) / "config.json").string(), c.to_json());
  Rng init(c.seed);
  model_ = make_run_model(c, data_.vocab.size(), init);
  params_ = std::make_unique<ad::ParameterSet>(model_->module());
  optimizer_ = make_optimizer(c, *params_);
  schedule_ = make_schedule(c);
  RunOptions o;
  o.steps = c.steps;
  o.batch_size = c.batch_size;
  o.seed = c.seed;
  o.clip = c.clip;
  o.loss.ignore_index = data::Vocabulary::kPad;
  o.loss.label_smoothing = static_cast<float>(c.label_smoothing);
  o.context_parallel = c.context_parallel > 1;
  o.precision = parse_precision(c.precision);
  o.eval_every = c.eval_every;
  o.early_stop = c.early_stop;
  o.dir = dir_;
  o.model_kind = c.model;
  o.checkpoint_every = c.checkpoint_every;
  o.keep_checkpoints = c.keep_checkpoints;
  run_ = std::make_unique<Run>(*params_, *optimizer_, schedule_, model_->module(),
                               static_cast<int64_t>(data_.train.size()), o,
                               comm != nullptr && comm->size() > 1 ? comm : nullptr);
}

RunResult TextRun::train(const TextRunHooks& hooks, const std::atomic<bool>* stop) {
  RunHooks h;
  h.forward = [this](const nn::Context& g, const std::vector<int64_t>& rows) {
    std::vector<const data::Example*> batch;
    batch.reserve(rows.size());
    for (const int64_t i : rows) batch.push_back(&data_.train[static_cast<size_t>(i)]);
    return model_->teacher_forced(g, batch);
  };
  if (!data_.test.empty() && config_.eval_size > 0) {
    const DecodeSettings dec{config_.max_decode_len, 1, 0.6, 64};
    h.evaluate = [this, dec, &hooks](int64_t step) {
      const EvalResult e = evaluate(*model_, data_.test, config_.eval_size, dec);
      if (hooks.on_eval) hooks.on_eval(step, e);
      return e.exact_match;
    };
  }
  h.on_step = hooks.on_step;
  h.on_checkpoint = hooks.on_checkpoint;
  const RunResult r = run_->run(h, stop);
  QKV_CHECK_RUNTIME(!r.diverged, "[train] the loss became ", static_cast<float>(r.diverged_loss), " at step ",
                    r.step + 1, " (try a smaller --lr or --clip)");
  return r;
}

}  // namespace qkv::train
