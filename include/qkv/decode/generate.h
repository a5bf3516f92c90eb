// Continuing a prompt with a language model, token by token: greedy or sampled (decode/sampling.h), stopping at the
// model's end-of-generation tokens, at a length, at the end of the context, or when the caller cancels; each new
// token is handed to a callback as it comes (streaming). Greedy and beam search over such a model run its
// decode::cached_step (decode/cached_step.h).
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
  // The KV caches' storage (llama.cpp's --cache-type-k/v, vLLM's kv_cache_dtype): kFloat32, or kBFloat16 (keys
  // and values rounded to bfloat16, half the cache bytes read a token; nn::KvCache::reset). kInt8 is refused.
  Precision kv_cache = Precision::kFloat32;
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

// The prompt (P >= 1 ids in [0, V), P below the context) continued by max_new_tokens >= 0 tokens, greedy or sampled
// as options says: the generate() above with eos as its one stop id, which is kept as the last token here.
// Stops early after eos when eos >= 0, or at the end of the context; eos is -1 (never) or an id in [0, vocab_size).
// page_size > 0: paged caches of that many positions a page (new_caches). -> the new tokens only.
std::vector<int64_t> generate(const models::LlamaForCausalLM& model, const std::vector<int64_t>& prompt,
                              int64_t max_new_tokens, const SamplingOptions& options = {}, int64_t eos = -1,
                              int64_t page_size = 0);

}  // namespace qkv::decode
