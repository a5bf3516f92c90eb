// Step model for the RNN Seq2Seq (GRU/LSTM, with or without attention): the encoder runs once, each step() is one
// Seq2Seq::decode_step over the current rows, whose recurrent states and encoder outputs are gathered per row. (A
// recurrent state, no KV cache: the models with KV caches share decode::CachedStep.)
#pragma once

#include <cstdint>
#include <vector>

#include "qkv/decode/search.h"
#include "qkv/models/seq2seq.h"

namespace qkv::decode {

class RnnStep : public StepModel {
 public:
  // src: ids (S, Ts); src_lengths: empty (all Ts) or S lengths, as Seq2Seq::encode. The model must outlive this.
  RnnStep(const models::Seq2Seq& model, const Ids& src, const std::vector<int64_t>& src_lengths = {});
  int64_t num_sources() const override { return sources_; }
  int64_t vocab_size() const override { return model_->config().tgt_vocab; }
  void start() override;
  Tensor step(const std::vector<int64_t>& rows, const std::vector<int64_t>& tokens) override;
  void record_attention(bool on) override { record_ = on; }
  Tensor last_attention() const override { return record_ ? attention_ : Tensor(); }  // α_t (N, Ts)

 private:
  const models::Seq2Seq* model_;
  int64_t sources_;
  models::Seq2SeqEncoded enc_;       // per source
  models::Seq2SeqEncoded row_enc_;   // gathered for row_source_
  std::vector<int64_t> row_source_, gathered_for_;
  models::Seq2SeqState state_;       // per current row
  bool record_ = false;
  Tensor attention_;
};

}  // namespace qkv::decode
