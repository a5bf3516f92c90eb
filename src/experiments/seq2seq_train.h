// Training and decoding of the encoder-decoder models the experiments compare: the RNN Seq2Seq without attention,
// with Bahdanau or Luong attention, and the Transformer. Batches are drawn from one source length at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common.h"
#include "qkv/data/batch.h"
#include "qkv/data/tsv.h"
#include "qkv/data/vocab.h"
#include "qkv/nn/module.h"
#include "qkv/train/text_model.h"

namespace qkv::experiments {

struct S2STask {
  data::Vocabulary src_vocab, tgt_vocab;
  std::vector<data::Example> train, test;
};
// Encodes text pairs with character vocabularies built from the training side (min_freq 1).
S2STask encode_task(const std::vector<data::TextPair>& train, const std::vector<data::TextPair>& test,
                    data::TokenizerKind kind = data::TokenizerKind::kChar);

enum class S2SKind { kRnn, kBahdanau, kLuong, kTransformer };
const char* s2s_name(S2SKind k);  // "GRU", "GRU+Bahdanau", "GRU+Luong", "Transformer"

struct S2SSize {
  int64_t embed = 32;       // RNN embedding width
  int64_t hidden = 64;      // RNN hidden size
  int64_t d_model = 64;     // Transformer width
  int64_t heads = 4, ff = 128, layers = 2;  // Transformer encoder and decoder layers each
  float dropout = 0.0f;     // Transformer dropout
};

// One model of either family: the library's train::TextModel (the sources get EOS appended; the Transformer's
// decoder also masks target padding).
struct S2SModel {
  S2SKind kind = S2SKind::kRnn;
  std::shared_ptr<train::TextModel> model;
  nn::Module* module = nullptr;  // &model->module()
  int64_t num_parameters() { return module->num_parameters(); }
};
S2SModel make_s2s(S2SKind kind, int64_t src_vocab, int64_t tgt_vocab, const S2SSize& size, uint64_t seed);

struct S2STrainConfig {
  int64_t steps = 1000, batch = 64;
  double lr = 2e-3;
  int64_t warmup = 100;
  double clip = 1.0;
  uint64_t seed = 0;
  int64_t log_every = 0;
  int64_t curve_every = 20;
};

struct S2SCurve {
  std::vector<double> step, loss;
  double final_loss = 0.0;
  double seconds = 0.0;
};
S2SCurve train_s2s(S2SModel& model, const std::vector<data::Example>& train, const S2STrainConfig& config,
                   const Options& options, const std::string& label);

// Greedy decoding of every example's source (batches of up to 128, sorted by length), tokens without EOS.
std::vector<std::vector<int64_t>> greedy_s2s(S2SModel& model, const std::vector<data::Example>& examples,
                                             int64_t max_len);
// Teacher-forced cross-attention / alignment maps (Tt+1 rows incl. EOS, Ts(+EOS) columns) of one example:
// RNN attention models only (Bahdanau / Luong); undefined for the others.
Tensor alignment_map(S2SModel& model, const data::Example& example);

struct SeqScore {
  double exact = 0.0, token_accuracy = 0.0;  // token accuracy: position-wise matches / max(len(hyp), len(ref))
};
SeqScore score_sequences(const std::vector<std::vector<int64_t>>& hyps, const std::vector<data::Example>& refs);

}  // namespace qkv::experiments
