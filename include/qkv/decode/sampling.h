// Sampling the next token from logits (temperature, top-k, top-p, seeded) and continuing a prompt with a
// Llama-style model through its KV caches: greedy, sampled, or beam search (decode/search.h) over the same step.
#pragma once

#include <cstdint>
#include <vector>

#include "qkv/core/rng.h"
#include "qkv/decode/search.h"
#include "qkv/models/llama.h"
#include "qkv/nn/kv_cache.h"

namespace qkv::decode {

struct SamplingOptions {
  float temperature = 0.0f;  // 0: greedy (argmax, lowest id on ties); > 0: sample softmax(logits / temperature)
  int64_t top_k = 0;         // > 0: only the k most likely tokens (ties at the k-th broken by lower id); 0: all
  float top_p = 1.0f;        // in (0, 1]: the smallest most-likely set whose probability reaches top_p (nucleus)
  uint64_t seed = 0;         // the one random stream of a generate() call
};

// Throws std::invalid_argument "[sampling] ..." for a negative or non-finite temperature, top_k < 0 or top_p
// outside (0, 1].
void check_sampling(const SamplingOptions& options);

// One token from logits (V), V >= 1, as options says; draws one uniform number from rng when temperature > 0.
// Filters apply in HF's order: temperature, then top-k, then top-p.
int64_t sample_token(const float* logits, int64_t vocab, const SamplingOptions& options, Rng& rng);

// A models::LlamaForCausalLM continuing S prompts of one length P >= 1 with one KV cache per layer: start()
// feeds prompt[0 .. P-2] at once, and the search's first token (SearchOptions::bos) must be the prompts' last
// token (so greedy_search and beam_search continue them). page_size > 0: paged caches (new_caches). The model must
// outlive this object.
class CausalLmStep : public StepModel {
 public:
  CausalLmStep(const models::LlamaForCausalLM& model, std::vector<std::vector<int64_t>> prompts,
               int64_t page_size = 0);
  int64_t num_sources() const override { return static_cast<int64_t>(prompts_.size()); }
  int64_t vocab_size() const override;
  int64_t row_bytes(int64_t steps) const override;  // float32 K and V of every layer over prompt + steps
  void start() override;
  Tensor step(const std::vector<int64_t>& rows, const std::vector<int64_t>& tokens) override;

 private:
  const models::LlamaForCausalLM* model_;
  std::vector<std::vector<int64_t>> prompts_;
  std::vector<nn::KvCache> caches_;
  int64_t rows_ = 0;
  int64_t page_size_ = 0;
};

// The same model over prompts of any lengths (empty allowed), recomputing prompt + prefix each step, one row at a
// time (no cache, no padding): for searches over unequal prompts (qkv train's evaluation). SearchOptions::bos is
// fed first, as to any StepModel.
class CausalLmRecomputeStep : public StepModel {
 public:
  CausalLmRecomputeStep(const models::LlamaForCausalLM& model, std::vector<std::vector<int64_t>> prompts);
  int64_t num_sources() const override { return static_cast<int64_t>(prompts_.size()); }
  int64_t vocab_size() const override;
  void start() override;
  Tensor step(const std::vector<int64_t>& rows, const std::vector<int64_t>& tokens) override;

 private:
  const models::LlamaForCausalLM* model_;
  std::vector<std::vector<int64_t>> prompts_;
  std::vector<std::vector<int64_t>> rows_;  // per row: prompt + tokens so far
};

// The prompt (P >= 1 ids in [0, V), P below the context) continued by max_new_tokens >= 0 tokens, greedy or sampled
// as options says: decode::generate (generate.h) with eos as its one stop id, which is kept as the last token here.
// Stops early after eos when eos >= 0, or at the end of the context; eos is -1 (never) or an id in [0, vocab_size).
// page_size > 0: paged caches of that many positions a page (new_caches). -> the new tokens only.
std::vector<int64_t> generate(const models::LlamaForCausalLM& model, const std::vector<int64_t>& prompt,
                              int64_t max_new_tokens, const SamplingOptions& options = {}, int64_t eos = -1,
                              int64_t page_size = 0);

}  // namespace qkv::decode
