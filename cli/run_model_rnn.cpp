// RunModel for the RNN Seq2Seq (rnn: GRU/LSTM without attention; rnn-attn: Bahdanau or Luong): training logits
// through models::Seq2Seq::forward on the training Context and decoding through decode::RnnStep.
#include <memory>
#include <vector>

#include "qkv/data/vocab.h"
#include "qkv/decode/rnn_step.h"
#include "qkv/models/seq2seq.h"
#include "run_model.h"

namespace qkv::cli {
namespace {

models::Seq2SeqConfig rnn_config(const RunConfig& c, int64_t vocab) {
  models::Seq2SeqConfig m{};
  m.src_vocab = vocab;
  m.tgt_vocab = vocab;
  m.embed_dim = c.d_model;
  m.hidden_size = c.hidden;
  m.num_layers = c.layers;
  m.cell = c.cell == "lstm" ? models::RnnCell::kLSTM : models::RnnCell::kGRU;
  m.attention = models::Seq2SeqAttention::kNone;
  if (c.model == "rnn-attn") {
    m.attention = c.attention == "luong-dot"       ? models::Seq2SeqAttention::kLuongDot
                  : c.attention == "luong-general" ? models::Seq2SeqAttention::kLuongGeneral
                                                   : models::Seq2SeqAttention::kBahdanau;
  }
  return m;
}

// The source as the encoder reads it: reversed with --reverse-source (rnn only).
std::vector<int64_t> encoder_order(const std::vector<int64_t>& src, bool reverse) {
  return reverse ? std::vector<int64_t>(src.rbegin(), src.rend()) : src;
}

class RnnRunModel : public RunModel {
 public:
  RnnRunModel(const RunConfig& c, int64_t vocab, Rng& rng)
      : model_(rnn_config(c, vocab), rng), reverse_(c.reverse_source) {}
  nn::Module& module() override { return model_; }

  ad::Var logits(nn::Context& g, const std::vector<const data::Example*>& batch, std::vector<int64_t>& targets,
                    int64_t& num_target_tokens) override {
    std::vector<data::Example> reversed;
    std::vector<const data::Example*> order = batch;
    if (reverse_) {
      for (const data::Example* e : batch) reversed.push_back({encoder_order(e->src, true), e->tgt});
      for (size_t i = 0; i < batch.size(); ++i) order[i] = &reversed[i];
    }
    const data::Seq2SeqBatch b = data::make_seq2seq_batch(order);
    targets = b.tgt_out.ids.data;
    num_target_tokens = b.num_target_tokens;
    return model_.forward(g, b.src.ids, b.src.lengths, b.tgt_in.ids).logits;
  }

  std::unique_ptr<decode::StepModel> decoder(const std::vector<std::vector<int64_t>>& sources) override {
    model_.eval();
    std::vector<std::vector<int64_t>> src;
    for (const auto& s : sources) src.push_back(encoder_order(s, reverse_));
    const data::Padded p = data::pad_sequences(src, data::Vocabulary::kPad, 1);
    return std::make_unique<decode::RnnStep>(model_, p.ids, p.lengths);
  }

  bool has_attention() const override { return model_.config().attention != models::Seq2SeqAttention::kNone; }

 private:
  models::Seq2Seq model_;
  bool reverse_;
};

}  // namespace

std::unique_ptr<RunModel> make_rnn_model(const RunConfig& c, int64_t vocab, Rng& rng) {
  return std::make_unique<RnnRunModel>(c, vocab, rng);
}

}  // namespace qkv::cli
