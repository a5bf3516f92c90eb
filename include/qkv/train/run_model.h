// The model of a `qkv train` run: the library's TextModel (teacher-forced logits on a Context for training, a
// step model for decoding) built from the run config, and evaluation (exact match, token accuracy) shared by
// train / eval / translate.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "qkv/core/rng.h"
#include "qkv/data/batch.h"
#include "qkv/decode/search.h"
#include "qkv/train/text_model.h"
#include "qkv/train/run_config.h"

namespace qkv::train {

// The run config's kind (rnn, rnn-attn, transformer, decoder) and sizes as the library's model config.
TextModelConfig text_model_config(const RunConfig& c, int64_t vocab);
// make_text_model(text_model_config(c, vocab)); init draws from rng.
std::unique_ptr<TextModel> make_run_model(const RunConfig& c, int64_t vocab, Rng& rng);

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
std::vector<std::vector<int64_t>> decode_all(TextModel& model, const std::vector<std::vector<int64_t>>& sources,
                                             const DecodeSettings& settings);

// Scores the first `limit` examples (all when limit <= 0 or larger). Leaves the module in eval mode.
EvalResult evaluate(TextModel& model, const std::vector<data::Example>& examples, int64_t limit,
                    const DecodeSettings& settings);

}  // namespace qkv::train
