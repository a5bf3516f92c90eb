// train::TextModel: every sequence-to-sequence model the library trains, behind one face whatever its family
// (RNN Seq2Seq with or without attention, encoder-decoder Transformer, decoder-only Transformer, Llama): built from one
// config, the teacher-forced logits of a batch on a Context (the Trainer's loss), a step model for greedy / beam
// decoding, and save/load through the module's state dict. `qkv train/eval/translate/viz` and the experiments both
// use it.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "qkv/core/rng.h"
#include "qkv/data/batch.h"
#include "qkv/decode/search.h"
#include "qkv/models/llama.h"
#include "qkv/models/seq2seq.h"
#include "qkv/models/transformer.h"
#include "qkv/nn/context.h"
#include "qkv/nn/module.h"
#include "qkv/ops/autograd.h"

namespace qkv::train {

enum class TextModelKind {
  kRnnSeq2Seq,          // models::Seq2Seq (none / Bahdanau / Luong, GRU or LSTM)
  kTransformerSeq2Seq,  // models::Seq2SeqTransformer
  kDecoderOnly,         // models::DecoderOnlyTransformer over  source + BOS + target
  kLlama,               // models::LlamaForCausalLM over the same sequences
};

struct TextModelConfig {
  TextModelKind kind = TextModelKind::kTransformerSeq2Seq;
  models::Seq2SeqConfig rnn;                   // kRnnSeq2Seq
  models::TransformerSeq2SeqConfig transformer;  // kTransformerSeq2Seq
  models::DecoderOnlyConfig decoder_only;      // kDecoderOnly
  models::LlamaConfig llama;                   // kLlama
  // Sequence-to-sequence kinds: the encoder reads each source reversed (RNN only) / with EOS appended.
  bool reverse_source = false;
  bool source_eos = false;
  // kTransformerSeq2Seq: the decoder's self-attention also gets the target key-padding mask.
  bool mask_target_padding = false;
};

// Teacher-forced logits of a batch and what they predict.
struct TeacherForced {
  ad::Var logits;                // (..., V) on the Context's tape when it trains
  std::vector<int64_t> targets;  // flat, one per logits row; PAD (data::Vocabulary::kPad) = ignored
  int64_t num_target_tokens = 0;
};

class TextModel {
 public:
  virtual ~TextModel() = default;
  const TextModelConfig& config() const { return config_; }
  virtual nn::Module& module() = 0;
  // Teacher forcing on examples (token ids without specials; B >= 1).
  virtual TeacherForced teacher_forced(const nn::Context& c, const std::vector<const data::Example*>& batch) = 0;
  // A decoder over these sources (ids without specials) for decode::greedy_search / beam_search; puts the module
  // in eval mode.
  virtual std::unique_ptr<decode::StepModel> decoder(const std::vector<std::vector<int64_t>>& sources) = 0;
  // Whether the step model reports attention (an RNN without attention does not).
  virtual bool has_attention() const = 0;

 protected:
  explicit TextModel(const TextModelConfig& c) : config_(c) {}
  TextModelConfig config_;
};

// Builds the configured kind; init draws from rng.
std::unique_ptr<TextModel> make_text_model(const TextModelConfig& config, Rng& rng);

}  // namespace qkv::train
