// The TextModel kinds: the RNN Seq2Seq (decoding through decode::RnnStep), the encoder-decoder Transformer, the
// decoder-only Transformer and the Llama decoder (decoding through decode::cached_step, KV caches, in eval mode).
// Each forwards to its model's one forward on the Context.
#include "qkv/train/text_model.h"

#include <memory>
#include <vector>

#include "qkv/core/error.h"
#include "qkv/data/vocab.h"
#include "qkv/decode/cached_step.h"
#include "qkv/decode/rnn_step.h"

namespace qkv::train {
namespace {

// The sources as the encoder reads them: reversed and / or with EOS appended, as configured.
std::vector<std::vector<int64_t>> encoder_order(const TextModelConfig& c,
                                                const std::vector<std::vector<int64_t>>& sources) {
  std::vector<std::vector<int64_t>> out;
  out.reserve(sources.size());
  for (const auto& s : sources) {
    out.push_back(c.reverse_source ? std::vector<int64_t>(s.rbegin(), s.rend()) : s);
    if (c.source_eos) out.back().push_back(data::Vocabulary::kEos);
  }
  return out;
}

// The batch with its sources reversed when configured (the EOS is appended by make_seq2seq_batch).
data::Seq2SeqBatch seq2seq_batch(const TextModelConfig& c, const std::vector<const data::Example*>& batch) {
  if (!c.reverse_source) return data::make_seq2seq_batch(batch, c.source_eos);
  std::vector<data::Example> reversed;
  reversed.reserve(batch.size());
  for (const data::Example* e : batch) {
    QKV_CHECK_ARG(e != nullptr, "[TextModel] null example");
    reversed.push_back({std::vector<int64_t>(e->src.rbegin(), e->src.rend()), e->tgt});
  }
  std::vector<const data::Example*> order;
  for (const data::Example& e : reversed) order.push_back(&e);
  return data::make_seq2seq_batch(order, c.source_eos);
}

TeacherForced targets_of(const data::Seq2SeqBatch& b, ad::Var logits) {
  return {std::move(logits), b.tgt_out.ids.data, b.num_target_tokens};
}

class RnnSeq2Seq : public TextModel {
 public:
  RnnSeq2Seq(const TextModelConfig& c, Rng& rng) : TextModel(c), model_(c.rnn, rng) {}
  nn::Module& module() override { return model_; }

  TeacherForced teacher_forced(const nn::Context& c, const std::vector<const data::Example*>& batch) override {
    const data::Seq2SeqBatch b = seq2seq_batch(config_, batch);
    return targets_of(b, model_.forward(c, b.src.ids, b.src.lengths, b.tgt_in.ids).logits);
  }

  std::unique_ptr<decode::StepModel> decoder(const std::vector<std::vector<int64_t>>& sources) override {
    model_.eval();
    const data::Padded p = data::pad_sequences(encoder_order(config_, sources), data::Vocabulary::kPad, 1);
    return std::make_unique<decode::RnnStep>(model_, p.ids, p.lengths);
  }

  bool has_attention() const override { return model_.config().attention != models::Seq2SeqAttention::kNone; }

 private:
  models::Seq2Seq model_;
};

class TransformerSeq2Seq : public TextModel {
 public:
  TransformerSeq2Seq(const TextModelConfig& c, Rng& rng) : TextModel(c), model_(c.transformer, rng) {
    QKV_CHECK_ARG(!c.reverse_source, "[TextModel] reverse_source is for the RNN Seq2Seq only");
  }
  nn::Module& module() override { return model_; }

  TeacherForced teacher_forced(const nn::Context& c, const std::vector<const data::Example*>& batch) override {
    const data::Seq2SeqBatch b = seq2seq_batch(config_, batch);
    models::Seq2SeqMasks masks;
    masks.src.key_padding_mask = b.src.padding_mask;
    masks.memory.key_padding_mask = b.src.padding_mask;
    if (config_.mask_target_padding) masks.tgt.key_padding_mask = b.tgt_in.padding_mask;
    return targets_of(b, model_.forward(c, b.src.ids, b.tgt_in.ids, masks));
  }

  std::unique_ptr<decode::StepModel> decoder(const std::vector<std::vector<int64_t>>& sources) override {
    const data::Padded p = data::pad_sequences(encoder_order(config_, sources), data::Vocabulary::kPad, 1);
    return std::make_unique<decode::CachedStep>(decode::cached_step(model_, p.ids, data::Vocabulary::kPad));
  }

  bool has_attention() const override { return true; }

 private:
  models::Seq2SeqTransformer model_;
};

// The language-model kinds (decoder-only Transformer, Llama) share the config check and the LM batches; they
// differ in how they decode. Both report the last layer's attention (heads averaged) over the source.
template <class Model>
class LanguageModel : public TextModel {
 public:
  template <class ModelConfig>
  LanguageModel(const TextModelConfig& c, const ModelConfig& model_config, Rng& rng)
      : TextModel(c), model_(model_config, rng) {
    QKV_CHECK_ARG(!c.reverse_source && !c.source_eos,
                  "[TextModel] reverse_source and source_eos are for the encoder-decoder kinds");
  }
  nn::Module& module() override { return model_; }
  bool has_attention() const override { return true; }

  // Under context parallelism (c.sequence_shard()) the batch is right-padded to the shard's length (causal rows
  // never see the padding, whose targets are ignored) and the model runs on this process's positions of it.
  TeacherForced teacher_forced(const nn::Context& c, const std::vector<const data::Example*>& batch) override {
    const data::LmBatch b = data::make_lm_batch(batch);
    const nn::SequenceShard* shard = c.sequence_shard();
    if (shard == nullptr) return {forward(c, b.input.ids, nullptr), b.targets, b.num_target_tokens};
    const int64_t B = b.input.ids.shape[0], T = b.input.ids.shape[1];
    const std::vector<int64_t> positions = shard->positions(shard->padded_length(T));
    const int64_t L = static_cast<int64_t>(positions.size());
    Ids ids{std::vector<int64_t>(static_cast<size_t>(B * L), data::Vocabulary::kPad), Shape{B, L}};
    std::vector<int64_t> targets(static_cast<size_t>(B * L), data::Vocabulary::kPad);
    int64_t count = 0;
    for (int64_t r = 0; r < B; ++r)
      for (int64_t j = 0; j < L; ++j) {
        const int64_t p = positions[static_cast<size_t>(j)];
        if (p >= T) continue;
        const size_t dst = static_cast<size_t>(r * L + j), src = static_cast<size_t>(r * T + p);
        ids.data[dst] = b.input.ids.data[src];
        targets[dst] = b.targets[src];
        count += targets[dst] != data::Vocabulary::kPad ? 1 : 0;
      }
    return {forward(c, ids, &positions), std::move(targets), count};
  }

 protected:
  // The model's forward on ids whose columns are at these global positions (nullptr: 0 .. T-1).
  virtual ad::Var forward(const nn::Context& c, const Ids& ids, const std::vector<int64_t>* positions) = 0;
  Model model_;
};

class DecoderOnly : public LanguageModel<models::DecoderOnlyTransformer> {
 public:
  DecoderOnly(const TextModelConfig& c, Rng& rng) : LanguageModel(c, c.decoder_only, rng) {}

  std::unique_ptr<decode::StepModel> decoder(const std::vector<std::vector<int64_t>>& sources) override {
    return std::make_unique<decode::CachedStep>(decode::cached_step(model_, sources));
  }


 protected:
  ad::Var forward(const nn::Context& c, const Ids& ids, const std::vector<int64_t>* positions) override {
    return model_.forward(c, ids, {}, positions);
  }
};

// The Llama decoder on the LM batches of kDecoderOnly (right-padded: causal rows never see their padding);
// decoding runs its decode::cached_step (sources of different lengths left-padded, each followed by BOS, the
// search's first token). Under context parallelism the rotary angles are the shard's global positions and every
// attention (GQA included) runs around the ring.
class Llama : public LanguageModel<models::LlamaForCausalLM> {
 public:
  Llama(const TextModelConfig& c, Rng& rng) : LanguageModel(c, c.llama, rng) {}

  std::unique_ptr<decode::StepModel> decoder(const std::vector<std::vector<int64_t>>& sources) override {
    model_.eval();
    return std::make_unique<decode::CachedStep>(decode::cached_step(model_, sources));
  }


 protected:
  ad::Var forward(const nn::Context& c, const Ids& ids, const std::vector<int64_t>* positions) override {
    return model_.forward(c, ids, nullptr, 0, positions);
  }
};

}  // namespace

std::unique_ptr<TextModel> make_text_model(const TextModelConfig& config, Rng& rng) {
  switch (config.kind) {
    case TextModelKind::kRnnSeq2Seq: return std::make_unique<RnnSeq2Seq>(config, rng);
    case TextModelKind::kTransformerSeq2Seq: return std::make_unique<TransformerSeq2Seq>(config, rng);
    case TextModelKind::kDecoderOnly: return std::make_unique<DecoderOnly>(config, rng);
    case TextModelKind::kLlama: return std::make_unique<Llama>(config, rng);
  }
  QKV_CHECK_ARG(false, "[TextModel] unknown model kind");
  return nullptr;
}

}  // namespace qkv::train
