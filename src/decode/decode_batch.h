// The continuous-batching step of a Llama-style model, shared by decode::generate (a batch of one) and the
// Scheduler (a changing batch): rows of their own lengths over one paged KV pool per layer, joining and leaving at
// any step, each new prompt prefilled alone (after a cached prefix) and then all rows advanced by one batched
// forward a step; and the per-row decisions that follow each step (sampling, log-probabilities, stop ids, lengths,
// the context's end). The searches' fixed set of rows (greedy, beam, sampling) runs decode::CachedStep instead.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "qkv/core/rng.h"
#include "qkv/core/tensor.h"
#include "qkv/decode/generate.h"
#include "qkv/decode/scheduler.h"
#include "qkv/models/llama.h"
#include "qkv/models/outputs.h"
#include "qkv/nn/kv_cache.h"

namespace qkv::decode::detail {

// One reply's progress: the decisions every decoding loop takes on a row's logits.
class Reply {
 public:
  // prompt_len P >= 1 with P < context (checked by the caller); the reply ends by max_new_tokens, a stop id, the
  // context's end (P + n == context) or the callback.
  Reply(const SamplingOptions& sampling, std::vector<int64_t> stop_ids, int64_t max_new_tokens, int64_t top_logprobs,
        int64_t prompt_len, int64_t context);
  // logits (V) of the next position: samples the token (this reply's Rng), hands it to on_token (unless it is a
  // stop id) and decides whether the reply goes on. -> true while it does (next_input() is then fed next).
  bool advance(const float* logits, int64_t vocab, const std::function<bool(const TokenEvent&)>& on_token);
  void cancel() { finish(FinishReason::kCancelled); }
  bool done() const { return done_; }
  int64_t next_input() const { return generation_.tokens.back(); }
  const Generation& generation() const { return generation_; }
  // Positions the KV cache of this reply may come to hold: the prompt and every kept token but the last.
  int64_t max_positions() const { return prompt_len_ + room_ - 1; }

 private:
  void finish(FinishReason r) {
    generation_.finish = r;
    done_ = true;
  }
  SamplingOptions sampling_;
  std::vector<int64_t> stop_ids_;
  int64_t max_new_ = 0, top_logprobs_ = -1, prompt_len_ = 0, room_ = 0;
  Rng rng_;
  Generation generation_;
  bool done_ = false;
};

// log softmax(logits) in float64 at `id`, and the k most likely ids (decreasing, lower id first on ties) with theirs.
void log_probabilities(const float* logits, int64_t vocab, int64_t id, int64_t k, TokenEvent& event);

// What a forward of a Batch records when asked (a viewer's attention maps and logit lens).
struct Record {
  models::ForwardOptions options;  // in
  models::CausalLMOutput output;   // out: the forward's logits (N, T, V) and what options ask
};

// Rows decoding together: one KV cache per layer. page_size > 0: paged caches on one pool per layer, rows of
// their own lengths, joining and leaving at any step. page_size 0: contiguous caches of one row (generate()).
class Batch {
 public:
  // capacity: the positions the pool is first sized for (it grows as needed). kv_cache: the caches' storage
  // (nn::KvCache::reset).
  Batch(const models::LlamaForCausalLM& model, int64_t page_size, int64_t capacity,
        Precision kv_cache = Precision::kFloat32);
  int64_t rows() const { return rows_; }
  // Prefills prompt[prefix_len ..] as a new last row, its first prefix_len positions read from prefix_pages (one
  // list a layer, pages of this pool; prefix_len a multiple of page_size, < prompt.size()). -> the logits (V) of
  // the prompt's last position.
  // record non-null: the forward also computes the logits of every prefilled position and what record->options
  // asks (attentions over every cached key, hidden states) into record->output; null: logits of the last position
  // only, nothing recorded.
  Tensor add(const std::vector<int64_t>& prompt, const std::vector<std::vector<int32_t>>& prefix_pages,
             int64_t prefix_len, Record* record = nullptr);
  // One token a row, in row order -> logits (N, V): one forward for all rows. record: as add's, for the step.
  Tensor step(const std::vector<int64_t>& tokens, Record* record = nullptr);
  // Keeps rows keep[0], keep[1], ... (in that order); the others' pages no one else holds return to the pool.
  void keep(const std::vector<int64_t>& rows);
  int64_t row_length(int64_t row) const { return caches_.at(0).row_length(row); }
  // Per layer, the pages of the row's first `pages` pages.
  std::vector<std::vector<int32_t>> row_pages(int64_t row, int64_t pages) const;
  void retain(const std::vector<std::vector<int32_t>>& pages);
  void release(const std::vector<std::vector<int32_t>>& pages);
  int64_t pages_in_use() const { return caches_.empty() ? 0 : caches_[0].pages_in_use(); }
  int64_t page_size() const { return page_; }

 private:
  const models::LlamaForCausalLM* model_;
  int64_t page_ = 0, capacity_ = 0, rows_ = 0;
  Precision kv_cache_ = Precision::kFloat32;
  std::vector<nn::KvCache> caches_;  // the running rows
  std::vector<nn::KvCache> fresh_;   // a prompt being prefilled (paged: on caches_' pools)
};

}  // namespace qkv::decode::detail
