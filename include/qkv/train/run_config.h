// The configuration of a `qkv train` run (model, data, optimiser, schedule, run lengths) and its JSON file
// (config.json in the run directory), shared by `qkv train`, `qkv eval`, `qkv translate`
// and Python's qkv.train.
#pragma once

#include <cstdint>
#include <map>
#include <string>

namespace qkv::train {

struct RunConfig {
  // --- model ---------------------------------------------------------------------------------------------------
  std::string model = "transformer";   // rnn | rnn-attn | transformer | decoder
  std::string cell = "gru";            // rnn, rnn-attn: gru | lstm
  std::string attention = "bahdanau";  // rnn-attn: bahdanau | luong-dot | luong-general
  int64_t d_model = 0;   // embedding width (RNN) / d_model (Transformers); 0 = default of the kind
  int64_t hidden = 0;    // RNN hidden size; 0 = default
  int64_t layers = 0;    // RNN layers / Transformer layers on each side; 0 = default
  int64_t heads = 4;
  int64_t ffn = 0;       // Transformer feed-forward width; 0 = 4 * d_model
  double dropout = 0.0;
  bool post_ln = false;  // Transformers: post-LN (the 2017 paper) instead of pre-LN
  // transformer: multiply token embeddings by sqrt(d_model) (the paper). Off by default: with nn.Embedding's
  // N(0, 1) init the scaled embeddings drown the sinusoidal positions and copy-like tasks learn ~5x slower.
  bool scale_embeddings = false;
  // rnn: feed the source reversed (Sutskever et al. 2014): the first target tokens then depend on the last encoder
  // steps, which shortens the paths the gradient must travel through the fixed-size state.
  bool reverse_source = false;
  int64_t max_positions = 0;  // decoder: learned positions; 0 = from the data
  // --- data ----------------------------------------------------------------------------------------------------
  std::string task;       // a built-in task, or
  std::string data;       // a TSV file (source<TAB>target)
  std::string test_data;  // optional TSV test file; else test_fraction of `data` is held out
  double test_fraction = 0.1;
  std::string tokenizer = "char";  // char | word | byte (TSV data; tasks are char-level)
  int64_t train_size = 10000;
  int64_t test_size = 500;
  int64_t min_len = 1;
  int64_t max_len = 10;
  std::string alphabet = "digits";
  std::string data_hash;       // FNV-1a of the TSV bytes, checked on resume
  // TSV: pairs whose source or target has more tokens than this are skipped, with a warning that counts them (a
  // single 200k-character line would otherwise make every batch that long).
  int64_t max_tokens = 256;
  int64_t max_decode_len = 0;  // generation limit; 0 = from the data (longest target + 8)
  // --- optimisation ----------------------------------------------------------------------------------------------
  std::string optimizer = "adam";  // adam | adamw | sgd
  double lr = 1e-3;
  double weight_decay = 0.0;
  double momentum = 0.9;  // sgd
  double clip = 1.0;      // global gradient-norm clip; 0 = off
  std::string schedule = "constant";  // constant | inverse_sqrt | cosine
  int64_t warmup = 0;
  double label_smoothing = 0.0;
  int64_t batch_size = 64;
  // fp32 | bf16: the linears' and attention's compute precision (bf16: forward and backward products in bf16 with
  // float32 accumulation, weights, optimizer state and everything else float32, as autocast)
  std::string precision = "fp32";
  // --- run -----------------------------------------------------------------------------------------------------
  int64_t steps = 1000;
  uint64_t seed = 0;
  int64_t eval_every = 200;
  int64_t eval_size = 200;
  int64_t checkpoint_every = 0;  // 0 = eval_every
  int64_t log_every = 50;
  int64_t keep_checkpoints = 2;
  double early_stop = 0.0;  // stop (with a checkpoint) once a periodic evaluation reaches this exact match; 0 = off
  // --- parallel layout (mpirun) --------------------------------------------------------------------------------
  int64_t ranks = 1;             // the processes the run was started on; a resume must use as many
  int64_t context_parallel = 1;  // > 1: the ranks split every sequence (ring attention), not the batch

  // Fills the 0 defaults of the model kind and checks every field; throws invalid_argument "[train] ...".
  void resolve_and_check();
  std::string to_json() const;
  // Parses to_json()'s output (unknown keys are an error); `name` prefixes errors.
  static RunConfig from_json(const std::string& text, const std::string& name);
  // A copy with the named settings (config.json's keys; values as its text: "transformer", "200", "0.001",
  // "true") replaced; an unknown key or a bad value throws invalid_argument "[config] NAME: ...".
  RunConfig with(const std::map<std::string, std::string>& settings, const std::string& name) const;
  // This run's saved config as a resume in run_dir continues it with `settings` given again: the run lengths,
  // evaluation, checkpoints and data settings change (a new task or data file replaces the source); any other
  // setting must equal the saved one, else invalid_argument "[train] KEY V differs from the run's W in
  // 'RUN/config.json'; a resumed run keeps its settings".
  RunConfig resumed_with(const std::map<std::string, std::string>& settings, const std::string& run_dir) const;

 private:
  static RunConfig from_settings(std::map<std::string, std::string> kv, const std::string& name);
};

// The shortest decimal text that reads back as v (0.1, not 0.10000000000000001): config.json's numbers and the
// values named in messages.
std::string format_double(double v);

// A flat JSON object of strings, numbers and booleans (qkv/core/json.h's strict Reader): values are kept as their
// text (strings unescaped); errors throw invalid_argument "[config] NAME: ... (at byte N)".
std::map<std::string, std::string> parse_flat_json(const std::string& text, const std::string& name);

// RUN/config.json, resolved and checked; invalid_argument "[op] RUN is not a training run (no config.json)" when
// absent.
RunConfig load_run_config(const std::string& run_dir, const char* op);

}  // namespace qkv::train
