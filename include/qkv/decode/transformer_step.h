// Step models for the Transformers: incremental decoding with a KV cache per layer (new query rows attend with
// Causal::kBottomRight). The references that recompute the whole prefix every step are the tests' oracles
// (tests/cpp/recompute_steps.h).
#pragma once

#include <cstdint>
#include <vector>

#include "qkv/nn/kv_cache.h"
#include "qkv/decode/search.h"
#include "qkv/models/transformer.h"
#include "qkv/ops/embedding.h"

namespace qkv::decode {

// models::Seq2SeqTransformer with cached decoder self-attention keys/values and cross-attention keys/values
// computed once per source. The model is switched to eval mode (no dropout) and must outlive this object.
class TransformerCachedStep : public StepModel {
 public:
  // src: ids (S, Ts); positions equal to pad_id are masked out as keys (key padding), as in training.
  TransformerCachedStep(models::Seq2SeqTransformer& model, const Ids& src, int64_t pad_id);
  int64_t num_sources() const override { return sources_; }
  int64_t vocab_size() const override;
  void start() override;
  Tensor step(const std::vector<int64_t>& rows, const std::vector<int64_t>& tokens) override;
  void record_attention(bool on) override { record_ = on; }
  Tensor last_attention() const override { return attention_; }  // last layer's cross-attention (N, Ts)

 private:
  void ensure_memory_rows();
  models::Seq2SeqTransformer* model_;
  int64_t sources_;
  std::vector<Tensor> layer_mem_k_, layer_mem_v_;  // per layer (S, H, Ts, D)
  Tensor src_block_;        // (S, Ts) 1 at padding
  Tensor row_block_;        // (N, Ts) for the current rows
  std::vector<int64_t> row_source_, gathered_for_;
  std::vector<nn::LayerCache> caches_;  // per layer: self-attention cache, the rows' memory keys/values
  int64_t t_ = 0;
  bool record_ = false;
  Tensor attention_;
};

// models::DecoderOnlyTransformer continuing prompts. start() runs the prompts through the layers at once
// (left-padded to the longest; padding is masked out as keys and the positions of each row start at its first
// real token), filling the caches; every step() then appends one token per row.
class DecoderOnlyCachedStep : public StepModel {
 public:
  // prompts: S token sequences (may be empty), each shorter than the model's max_len.
  DecoderOnlyCachedStep(models::DecoderOnlyTransformer& model, std::vector<std::vector<int64_t>> prompts);
  int64_t num_sources() const override { return static_cast<int64_t>(prompts_.size()); }
  int64_t vocab_size() const override;
  int64_t capacity() const override;  // max_len - longest prompt
  void start() override;
  Tensor step(const std::vector<int64_t>& rows, const std::vector<int64_t>& tokens) override;
  void record_attention(bool on) override { record_ = on; }
  // Last layer's self-attention of the new token over the prompt positions (N, longest prompt), heads averaged.
  Tensor last_attention() const override { return attention_; }

 private:
  // x: (N, Tq, E) new rows at cache positions [len, len + Tq) -> hidden states (N, Tq, E)
  Tensor run_layers(Tensor x);
  models::DecoderOnlyTransformer* model_;
  std::vector<std::vector<int64_t>> prompts_;
  int64_t prompt_len_ = 0;         // P: longest prompt
  std::vector<int64_t> pad_left_;  // per row: number of left padding positions
  std::vector<nn::LayerCache> caches_;
  bool record_ = false;
  Tensor attention_;
};

}  // namespace qkv::decode
