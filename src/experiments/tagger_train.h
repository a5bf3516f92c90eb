// Training and evaluation of the experiments' Tagger on same-length tasks (copy / reverse / sort): batches hold one
// length each (no padding), AdamW with warmup + cosine decay and gradient clipping, accuracy per length.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "common.h"
#include "qkv/data/vocab.h"
#include "tagger.h"

namespace qkv::experiments {

// Pairs of id sequences with |src| == |tgt|.
struct TagData {
  std::vector<std::vector<int64_t>> src, tgt;
  size_t size() const { return src.size(); }
};

// A built-in task ("reverse", "copy", "sort") of digit strings with lengths in [min_len, max_len], encoded with a
// character vocabulary of the ten digits (ids 4..13; 0..3 are the specials).
struct TagTask {
  data::Vocabulary vocab;
  TagData train, test;
};
TagTask make_tag_task(const std::string& name, int64_t train_size, int64_t test_size, int64_t min_len,
                      int64_t max_len, uint64_t seed);
// More test items of the same task and vocabulary (e.g. longer lengths), disjoint by seed only.
TagData make_tag_data(const std::string& name, const data::Vocabulary& vocab, int64_t size, int64_t min_len,
                      int64_t max_len, uint64_t seed);

struct TagTrainConfig {
  int64_t steps = 1000;
  int64_t batch = 64;
  double lr = 1e-3;
  int64_t warmup = 100;
  double clip = 1.0;
  double weight_decay = 0.01;
  uint64_t seed = 0;
  int64_t log_every = 0;  // > 0: a progress line every so many steps
  int64_t curve_every = 10;
};

struct TagCurve {
  std::vector<double> step, loss;  // training loss (mean over the last curve_every steps)
  double final_loss = 0.0;         // mean of the last 10% of steps
  bool diverged = false;           // a non-finite loss stopped training
};

TagCurve train_tagger(Tagger& model, const TagData& data, const TagTrainConfig& config, const Options& options,
                      const std::string& label);

struct TagEval {
  double token_accuracy = 0.0;  // over all target tokens
  double exact_match = 0.0;     // whole sequences right
  std::map<int64_t, std::pair<double, double>> by_length;  // length -> (token accuracy, exact match)
};
TagEval eval_tagger(const Tagger& model, const TagData& data, const TaggerRun& run = {});

}  // namespace qkv::experiments
