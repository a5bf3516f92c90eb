// Continuing a prompt with a language model, token by token: greedy or sampled (decode/sampling.h), stopping at the
// model's end-of-generation tokens, at a length, at the end of the context, or when the caller cancels; each new
// token is handed to a callback as it comes (streaming). And the step models that run a Llama-style model under
// greedy or beam search (decode/search.h).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <vector>

#include "qkv/decode/sampling.h"
#include "qkv/decode/search.h"
#include "qkv/models/llama.h"
#include "qkv/nn/kv_cache.h"

namespace qkv::decode {

enum class FinishReason {
  kStop,       // a stop id came (it is not part of the tokens)
  kLength,     // max_new_tokens were generated
  kContext,    // the model's context (max_position_embeddings) is full
  kCancelled,  // `cancel` was set, or the callback returned false
};
const char* finish_reason_name(FinishReason r);  // "stop", "length", "context", "cancelled"

struct GenerateOptions {
  int64_t max_new_tokens = 256;           // >= 0
  SamplingOptions sampling;               // greedy by default
  std::vector<int64_t> stop_ids;          // ids in [0, vocab_size) that end the reply
  int64_t page_size = 0;                  // > 0: paged KV caches: the step (and the bits) of a Scheduler with
                                          // this page_size; 0: contiguous ones (another attention kernel, whose
                                          // last bits, amplified by quantized weights, can change a reply)
  const std::atomic<bool>* cancel = nullptr;  // read before every step: true ends the reply (Ctrl-C)
};

struct Generation {
  std::vector<int64_t> tokens;  // the new tokens, without the stop id
  FinishReason finish = FinishReason::kLength;
  int64_t stop_id = -1;         // the stop id that came, for kStop
};

// on_token(id) is called for every new token that is kept (not for a stop id), in order; returning false cancels.
using TokenCallback = std::function<bool(int64_t)>;

// prompt: P >= 1 ids in [0, V); the prompt must leave room for one new token in the model's context
// (std::invalid_argument "[generate] the prompt of P tokens fills the context of N" otherwise). The prompt runs at
// once through the KV caches, then one token per step: the Scheduler's decoding step (src/decode/decode_batch.h)
// with a batch of one row.
Generation generate(const models::LlamaForCausalLM& model, const std::vector<int64_t>& prompt,
                    const GenerateOptions& options, const TokenCallback& on_token = {});

// A models::LlamaForCausalLM continuing S prompts of lengths P_s >= 1 with one KV cache per layer: start() feeds
// each prompt but its last token at once, and the search's first token (SearchOptions::bos) must be the prompts'
// last token (so greedy_search and beam_search continue them; to continue prompts after a bos, as qkv train's
// evaluation does, append it to each). Prompts of different lengths run as transformers' generate runs
// them: left-padded to the longest, with an attention_mask over the padding and per-row positions cumsum(mask) - 1,
// so that each row's tokens sit at the positions they have alone; each step extends the mask and each row's
// positions (beams reorder both with the caches). Prompts of one length run without mask or positions.
// page_size > 0: paged caches (new_caches). The model must outlive this object.
class CausalLmStep : public StepModel {
 public:
  CausalLmStep(const models::LlamaForCausalLM& model, std::vector<std::vector<int64_t>> prompts,
               int64_t page_size = 0);
  int64_t num_sources() const override { return static_cast<int64_t>(prompts_.size()); }
  int64_t vocab_size() const override;
  int64_t row_bytes(int64_t steps) const override;  // float32 K and V of every layer over the longest prompt + steps
  void start() override;
  Tensor step(const std::vector<int64_t>& rows, const std::vector<int64_t>& tokens) override;

 private:
  const models::LlamaForCausalLM* model_;
  std::vector<std::vector<int64_t>> prompts_;
  int64_t longest_ = 0;  // the longest prompt's length
  std::vector<nn::KvCache> caches_;
  int64_t rows_ = 0;
  int64_t page_size_ = 0;
  // Unequal prompts only: the attention mask (rows_, keys_) over every cached position (0 = left padding) and each
  // row's next position (its count of tokens so far).
  bool padded_ = false;
  std::vector<int64_t> mask_;
  int64_t keys_ = 0;
  std::vector<int64_t> next_;
};

// The prompt (P >= 1 ids in [0, V), P below the context) continued by max_new_tokens >= 0 tokens, greedy or sampled
// as options says: the generate() above with eos as its one stop id, which is kept as the last token here.
// Stops early after eos when eos >= 0, or at the end of the context; eos is -1 (never) or an id in [0, vocab_size).
// page_size > 0: paged caches of that many positions a page (new_caches). -> the new tokens only.
std::vector<int64_t> generate(const models::LlamaForCausalLM& model, const std::vector<int64_t>& prompt,
                              int64_t max_new_tokens, const SamplingOptions& options = {}, int64_t eos = -1,
                              int64_t page_size = 0);

}  // namespace qkv::decode
