// The one KV-cached decoding step (a StepModel for greedy_search / beam_search / sample_search / forced_attention)
// of every model:
// CachedStep owns the prompts, their left padding, the per-row positions and the rows' reordering; each model plugs
// in through a small CachedModel (its forward with caches). The recomputing references are the tests' oracles
// (tests/cpp/recompute_steps.h).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "qkv/core/ids.h"
#include "qkv/core/tensor.h"
#include "qkv/decode/search.h"
#include "qkv/nn/kv_cache.h"

namespace qkv::models {
class LlamaForCausalLM;
class DecoderOnlyTransformer;
class Seq2SeqTransformer;
}  // namespace qkv::models

namespace qkv::decode {

// What differs per model under CachedStep: its sizes, its caches and one forward through them. Rows are numbered as
// CachedStep numbers them: after start(), row s is source (prompt) s.
class CachedModel {
 public:
  virtual ~CachedModel() = default;
  virtual int64_t vocab_size() const = 0;
  // Positions one row can hold, prompt included (a learned position table's length); INT64_MAX: unlimited.
  virtual int64_t context() const = 0;
  // Bytes one row's caches hold with `positions` cached positions (and whatever the row keeps besides, such as an
  // encoder-decoder model's memory keys and values). Saturates at INT64_MAX.
  virtual int64_t row_bytes(int64_t positions) const = 0;
  // One empty cache per layer (its self-attention) for `rows` rows, room for `capacity` positions (they grow).
  virtual std::vector<nn::KvCache> new_caches(int64_t rows, int64_t capacity) const = 0;
  // Every row back to its source (row s = source s), before a new search; the caches are CachedStep's.
  virtual void start() {}
  // Row i of the model's own per-row state becomes row rows[i] (beams fork and drop rows); the caches are
  // CachedStep's.
  virtual void reorder(const std::vector<int64_t>& rows) { (void)rows; }
  // ids (N, T): positions [cached, cached + T) of every row, after the `cached` ones the caches hold.
  // positions: null (every row's are cached .. cached + T - 1), or N·T, row n's at [n·T, (n + 1)·T).
  // key_padding: undefined (every key takes part), or (N, cached + T), nonzero at keys that are padding.
  // attention: null, or where the last layer's attention weights (N, H, T, K) go (the keys over which
  // CachedStep::last_attention reports). -> logits (N, T', V), T' >= 1, the last one at the last position.
  virtual Tensor forward(const Ids& ids, const std::vector<int64_t>* positions, const Tensor& key_padding,
                         std::vector<nn::KvCache>& caches, int64_t cached, Tensor* attention) = 0;
  // The recorded attention is over an encoded source (K = its Ts), not over the cached positions.
  virtual bool attends_to_source() const { return false; }
};

// S prompts (possibly empty, each shorter than the model's context) continued one token per row per step: start()
// runs the prompts at once (left-padded to the longest, P; the padding masked out as keys; each row's positions
// start at its first real token, as transformers' generate: cumsum(attention_mask) - 1), filling the caches; the
// search's first token (SearchOptions::bos) then follows each prompt. Beams reorder the caches, the padding and the
// positions with the model's own per-row state. Prompts of one length run without a mask or positions.
// record_attention(true): last_attention() is the last layer's attention of the newest token, heads averaged, over
// the source (an encoder-decoder model: (N, Ts)) or over the prompt's P columns, left padding included ((N,
// max(P, 1)); a causal model). The model must outlive this object.
class CachedStep : public StepModel {
 public:
  // Throws std::invalid_argument "[CachedStep] ..." on no prompts, a prompt token outside [0, V) or a prompt that
  // fills the model's context.
  CachedStep(std::unique_ptr<CachedModel> model, std::vector<std::vector<int64_t>> prompts);
  int64_t num_sources() const override { return static_cast<int64_t>(prompts_.size()); }
  int64_t vocab_size() const override { return model_->vocab_size(); }
  int64_t capacity() const override;               // context - P
  int64_t row_bytes(int64_t steps) const override;  // the caches over P + steps positions
  void start() override;
  Tensor step(const std::vector<int64_t>& rows, const std::vector<int64_t>& tokens) override;
  void record_attention(bool on) override { record_ = on; }
  Tensor last_attention() const override { return attention_; }

 private:
  // ids (N, T) after the cached positions, with each row's padding and positions -> logits (N, T', V).
  Tensor forward(const Ids& ids, bool record);
  std::unique_ptr<CachedModel> model_;
  std::vector<std::vector<int64_t>> prompts_;
  int64_t prompt_len_ = 0;         // P: the longest prompt
  std::vector<nn::KvCache> caches_;
  int64_t cached_ = 0;             // positions the caches hold
  std::vector<int64_t> pad_left_;  // per row: its left padding positions (empty before start())
  bool record_ = false;
  Tensor attention_;
};

// A models::LlamaForCausalLM (a Mistral / Qwen 2 / Gemma 2 one too) continuing prompts: the attention mask and
// positions as transformers' generate passes them; page_size > 0: paged caches (new_caches); recording through
// ForwardOptions (output_attentions for the last layer). No context limit (rotary positions have no table; a beam
// search's BeamOptions::max_bytes bounds its caches). kv_cache: the caches' storage (kFloat32 or kBFloat16,
// nn::KvCache::reset). Throws "[CachedStep] page_size must be >= 0".
CachedStep cached_step(const models::LlamaForCausalLM& model, std::vector<std::vector<int64_t>> prompts,
                       int64_t page_size = 0, Precision kv_cache = Precision::kFloat32);
// A models::DecoderOnlyTransformer continuing prompts (learned positions: context = max_len). The model is switched
// to eval mode (no dropout).
CachedStep cached_step(models::DecoderOnlyTransformer& model, std::vector<std::vector<int64_t>> prompts);
// A models::Seq2SeqTransformer decoding the S sources of src, ids (S, Ts) (positions equal to pad_id are masked out
// as keys, as in training), from empty target prompts: the sources encoded once; the memory's keys and values
// projected into the cross-attention caches on the first step and reordered only when the rows' sources change.
// Records the last layer's cross-attention (N, Ts). The model is switched to eval mode (no dropout).
CachedStep cached_step(models::Seq2SeqTransformer& model, const Ids& src, int64_t pad_id);

}  // namespace qkv::decode
