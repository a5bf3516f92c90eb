// Step models for the Transformers: incremental decoding through the models' own forward with a KV cache per layer
// (new query rows attend with Causal::kBottomRight). The references that recompute the whole prefix every step are
// the tests' oracles (tests/cpp/recompute_steps.h).
#pragma once

#include <cstdint>
#include <vector>

#include "qkv/nn/kv_cache.h"
#include "qkv/decode/search.h"
#include "qkv/models/transformer.h"
#include "qkv/ops/embedding.h"

namespace qkv::decode {

// models::Seq2SeqTransformer: the source encoded once; each step one Seq2SeqTransformer::decode call with the
// nn::DecoderCache (self-attention keys/values appended per step, the memory's keys/values projected on the first
// step and reordered only when the rows' sources change). The model is switched to eval mode (no dropout) and must
// outlive this object.
class TransformerCachedStep : public StepModel {
 public:
  // src: ids (S, Ts); positions equal to pad_id are masked out as keys (key padding), as in training.
  TransformerCachedStep(models::Seq2SeqTransformer& model, const Ids& src, int64_t pad_id);
  int64_t num_sources() const override { return sources_; }
  int64_t vocab_size() const override;
  // float32 K and V of every decoder layer: self-attention over `steps` target positions, cross-attention over Ts.
  int64_t row_bytes(int64_t steps) const override;
  void start() override;
  Tensor step(const std::vector<int64_t>& rows, const std::vector<int64_t>& tokens) override;
  void record_attention(bool on) override { record_ = on; }
  Tensor last_attention() const override { return attention_; }  // last layer's cross-attention (N, Ts)

 private:
  models::Seq2SeqTransformer* model_;
  int64_t sources_;
  Tensor memory_;            // (S, Ts, E): the encoder's output per source
  Tensor src_block_;         // (S, Ts) 1 at padding
  Tensor row_block_;         // (N, Ts) for the current rows
  std::vector<int64_t> row_source_;
  nn::DecoderCache cache_;
  bool record_ = false;
  Tensor attention_;
};

// models::DecoderOnlyTransformer continuing prompts through its forward with one KvCache per layer. start() runs
// the prompts at once (left-padded to the longest; padding is masked out as keys and the positions of each row start
// at its first real token), filling the caches; every step() then appends one token per row.
class DecoderOnlyCachedStep : public StepModel {
 public:
  // prompts: S token sequences (may be empty), each shorter than the model's max_len.
  DecoderOnlyCachedStep(models::DecoderOnlyTransformer& model, std::vector<std::vector<int64_t>> prompts);
  int64_t num_sources() const override { return static_cast<int64_t>(prompts_.size()); }
  int64_t vocab_size() const override;
  int64_t capacity() const override;  // max_len - longest prompt
  int64_t row_bytes(int64_t steps) const override;  // float32 K and V of every layer over longest prompt + steps
  void start() override;
  Tensor step(const std::vector<int64_t>& rows, const std::vector<int64_t>& tokens) override;
  void record_attention(bool on) override { record_ = on; }
  // Last layer's self-attention of the new token over the prompt positions (N, longest prompt), heads averaged.
  Tensor last_attention() const override { return attention_; }

 private:
  // ids (N, T) at cache positions [len, len + T), `positions` their N*T learned positions -> logits (N, T, V);
  // with `record`, the last layer's attention of the last row goes to attention_.
  Tensor forward(const Ids& ids, const std::vector<int64_t>& positions, bool record);
  models::DecoderOnlyTransformer* model_;
  std::vector<std::vector<int64_t>> prompts_;
  int64_t prompt_len_ = 0;         // P: longest prompt
  std::vector<int64_t> pad_left_;  // per row: number of left padding positions
  std::vector<nn::KvCache> caches_;
  bool record_ = false;
  Tensor attention_;
};

}  // namespace qkv::decode
