// RunModel for the Transformers (transformer: encoder-decoder; decoder: GPT-style LM over source + BOS + target):
// training logits through train::*_logits, decoding through the KV-cached step models.
#include <memory>

#include "qkv/data/vocab.h"
#include "qkv/decode/transformer_step.h"
#include "qkv/models/transformer.h"
#include "run_model.h"

namespace qkv::cli {
namespace {

nn::TransformerLayerConfig layer_config(const RunConfig& c, nn::Activation act) {
  nn::TransformerLayerConfig l{};
  l.d_model = c.d_model;
  l.nhead = c.heads;
  l.dim_feedforward = c.ffn;
  l.dropout = static_cast<float>(c.dropout);
  l.activation = act;
  l.norm_first = !c.post_ln;
  return l;
}

class Seq2SeqTransformerRun : public RunModel {
 public:
  Seq2SeqTransformerRun(const RunConfig& c, int64_t vocab, Rng& rng) : model_(config(c, vocab), rng) {}
  nn::Module& module() override { return model_; }

  ad::Var logits(nn::Context& g, const std::vector<const data::Example*>& batch, std::vector<int64_t>& targets,
                    int64_t& num_target_tokens) override {
    const data::Seq2SeqBatch b = data::make_seq2seq_batch(batch);
    targets = b.tgt_out.ids.data;
    num_target_tokens = b.num_target_tokens;
    models::Seq2SeqMasks masks;
    masks.src.key_padding_mask = b.src.padding_mask;
    masks.memory.key_padding_mask = b.src.padding_mask;
    return model_.forward(g, b.src.ids, b.tgt_in.ids, masks);
  }

  std::unique_ptr<decode::StepModel> decoder(const std::vector<std::vector<int64_t>>& sources) override {
    const data::Padded p = data::pad_sequences(sources, data::Vocabulary::kPad, 1);
    return std::make_unique<decode::TransformerCachedStep>(model_, p.ids, data::Vocabulary::kPad);
  }

  bool has_attention() const override { return true; }

 private:
  static models::TransformerSeq2SeqConfig config(const RunConfig& c, int64_t vocab) {
    models::TransformerSeq2SeqConfig m{};
    m.src_vocab = vocab;
    m.tgt_vocab = vocab;
    m.transformer.layer = layer_config(c, nn::Activation::kRelu);
    m.transformer.num_encoder_layers = c.layers;
    m.transformer.num_decoder_layers = c.layers;
    m.scale_embeddings = c.scale_embeddings;
    return m;
  }
  models::Seq2SeqTransformer model_;
};

class DecoderOnlyRun : public RunModel {
 public:
  DecoderOnlyRun(const RunConfig& c, int64_t vocab, Rng& rng) : model_(config(c, vocab), rng) {}
  nn::Module& module() override { return model_; }

  ad::Var logits(nn::Context& g, const std::vector<const data::Example*>& batch, std::vector<int64_t>& targets,
                    int64_t& num_target_tokens) override {
    const data::LmBatch b = data::make_lm_batch(batch);
    targets = b.targets;
    num_target_tokens = b.num_target_tokens;
    return model_.forward(g, b.input.ids);
  }

  std::unique_ptr<decode::StepModel> decoder(const std::vector<std::vector<int64_t>>& sources) override {
    return std::make_unique<decode::DecoderOnlyCachedStep>(model_, sources);
  }

  bool has_attention() const override { return true; }

 private:
  static models::DecoderOnlyConfig config(const RunConfig& c, int64_t vocab) {
    models::DecoderOnlyConfig m{};
    m.vocab = vocab;
    m.max_len = c.max_positions;
    m.num_layers = c.layers;
    m.layer = layer_config(c, nn::Activation::kGelu);
    return m;
  }
  models::DecoderOnlyTransformer model_;
};

}  // namespace

std::unique_ptr<RunModel> make_transformer_model(const RunConfig& c, int64_t vocab, Rng& rng) {
  if (c.model == "decoder") return std::make_unique<DecoderOnlyRun>(c, vocab, rng);
  return std::make_unique<Seq2SeqTransformerRun>(c, vocab, rng);
}

std::unique_ptr<RunModel> make_run_model(const RunConfig& c, int64_t vocab, Rng& rng) {
  if (c.model == "rnn" || c.model == "rnn-attn") return make_rnn_model(c, vocab, rng);
  return make_transformer_model(c, vocab, rng);
}

}  // namespace qkv::cli
