// The model of a `qkv train` run behind one face, whatever its kind: teacher-forced logits on a tape for training,
// a step model for decoding, and evaluation (exact match, token accuracy) shared by train / eval / translate.
// One file per family of kinds (run_model_rnn.cpp, run_model_transformer.cpp).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "qkv/core/rng.h"
#include "qkv/data/batch.h"
#include "qkv/decode/search.h"
#include "qkv/nn/context.h"
#include "qkv/nn/module.h"
#include "qkv/ops/autograd.h"
#include "run_config.h"

namespace qkv::cli {

class RunModel {
 public:
  virtual ~RunModel() = default;
  virtual nn::Module& module() = 0;
  // Teacher forcing on a batch: logits (..., V) on g's tape and the flat targets (PAD = ignored) they predict.
  virtual ad::Var logits(nn::Context& g, const std::vector<const data::Example*>& batch,
                            std::vector<int64_t>& targets, int64_t& num_target_tokens) = 0;
  // A decoder over these sources (ids without specials); puts the module in eval mode.
  virtual std::unique_ptr<decode::StepModel> decoder(const std::vector<std::vector<int64_t>>& sources) = 0;
  // Whether decoder() can report attention (rnn without attention cannot).
  virtual bool has_attention() const = 0;
};

// rnn / rnn-attn (run_model_rnn.cpp) and transformer / decoder (run_model_transformer.cpp); init draws from rng.
std::unique_ptr<RunModel> make_rnn_model(const RunConfig& c, int64_t vocab, Rng& rng);
std::unique_ptr<RunModel> make_transformer_model(const RunConfig& c, int64_t vocab, Rng& rng);
std::unique_ptr<RunModel> make_run_model(const RunConfig& c, int64_t vocab, Rng& rng);

struct EvalResult {
  double exact_match = 0.0;     // outputs equal to the reference (up to EOS)
  double token_accuracy = 0.0;  // positions of reference + EOS where the output has the same token
  int64_t examples = 0;
  int64_t tokens = 0;
};

struct DecodeSettings {
  int64_t max_len = 64;
  int64_t beam = 1;  // 1 = greedy
  double alpha = 0.6;  // GNMT length penalty for beam > 1
  int64_t batch = 64;  // sources decoded together
};

// Decodes every source -> the generated ids (without BOS, cut before EOS).
std::vector<std::vector<int64_t>> decode_all(RunModel& model, const std::vector<std::vector<int64_t>>& sources,
                                             const DecodeSettings& settings);

// Scores the first `limit` examples (all when limit <= 0 or larger). Leaves the module in eval mode.
EvalResult evaluate(RunModel& model, const std::vector<data::Example>& examples, int64_t limit,
                    const DecodeSettings& settings);

}  // namespace qkv::cli
