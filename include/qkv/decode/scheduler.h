// Continuous batching: many requests continue their prompts together. Every step is one batched forward of all
// running sequences (one new token each) over one paged KV pool, so the weights are read once per step for all of
// them; requests join the batch as soon as their prompt is in the cache and leave it as soon as they finish. A prompt
// prefix that an earlier request already computed (the previous turns of a chat, a shared system prompt) is taken
// from the cache rather than recomputed. A request's tokens do not depend on who else is in the batch (the kernels'
// batch invariance): at temperature 0 a reply is the same alone or among others.
//
// The model must outlive the scheduler. All public member functions are thread-safe; the callbacks run on the
// scheduler's own thread, one request's in order, and must not call back into the scheduler (an exception thrown by
// on_token cancels its request; one thrown by on_done is dropped).
//
// How it runs: one thread loops. It first ends the cancelled requests, then admits queued requests in order (first
// come, first served) while fewer than max_batch run and the KV budget holds the head's worst case (its prompt and
// every new token it may get: ceil((P + min(max_new_tokens, context - P) - 1) / page_size) pages, less the pages
// of its cached prefix); each admitted prompt is prefilled alone and gives its first token. Then one batched forward
// advances every running request by one token. A request whose worst case does not fit waits at the head of the
// queue until running ones end (the prefix cache gives its pages back first, least recently used first). So a
// running request never runs out of pages and is never preempted. The same decoding step serves decode::generate
// (decode_batch.h), which is what makes a request's tokens the same alone and batched.
// Prefix cache (reuse_prefix): when a request ends, the whole pages of its prompt and reply stay in the pool, keyed
// by their token ids; a later prompt starts from its longest cached whole-page prefix (at most P - 1 positions: its
// last token is always computed), shared rather than copied.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "qkv/decode/generate.h"
#include "qkv/decode/sampling.h"
#include "qkv/models/llama.h"

namespace qkv::decode {

struct SchedulerOptions {
  int64_t max_batch = 8;      // sequences decoding at once (--parallel), >= 1
  int64_t page_size = 16;     // KV positions a page, >= 1
  int64_t kv_tokens = 0;      // positions the KV pool may hold for all sequences together (0: max_batch x context);
                              // the pool's memory grows as it fills, up to this budget
  int64_t max_queued = 64;    // requests waiting for a place in the batch; submit() refuses more (QueueFull);
                              // 0: none wait (a request is accepted only while the batch has a place for it)
  bool reuse_prefix = true;   // take a prompt's longest cached prefix from finished requests' pages
  int64_t threads = 0;        // OpenMP threads of the scheduler's forwards, >= 0 (0: omp_get_max_threads() of the
                              // thread that makes the scheduler, which a new thread would not inherit)
  Precision kv_cache = Precision::kFloat32;  // the KV pool's storage: kFloat32 or kBFloat16 (GenerateOptions)
};

struct RequestOptions {
  int64_t max_new_tokens = 256;   // >= 0; the context's end stops a reply earlier (FinishReason::kContext)
  SamplingOptions sampling;       // greedy by default; seed: this request's own random stream
  std::vector<int64_t> stop_ids;  // ids in [0, vocab_size) that end the reply (not part of it)
  int64_t top_logprobs = -1;      // -1: no log-probabilities; k >= 0: the chosen token's and the k most likely
};

// One new token as the request receives it.
struct TokenEvent {
  int64_t id = -1;
  float logprob = 0.0f;                           // log softmax of the logits at the chosen id (top_logprobs >= 0)
  std::vector<std::pair<int64_t, float>> top;     // the top_logprobs most likely ids and their log-probabilities
};

struct RequestResult {
  Generation generation;            // tokens (without the stop id), finish reason, stop id
  int64_t prompt_tokens = 0;        // the prompt's length
  int64_t cached_prompt_tokens = 0; // of them, taken from the cache rather than computed
};

// Thrown by submit() when max_queued requests are already waiting (an HTTP server answers 503).
class QueueFull : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct SchedulerStats {
  int64_t running = 0;       // sequences in the batch now
  int64_t queued = 0;        // requests waiting
  int64_t kv_pages_used = 0; // pages held by running sequences and the prefix cache (pages of one layer's pool)
  int64_t kv_pages_total = 0;  // ceil(kv_tokens / page_size)
  int64_t steps = 0;         // batched forwards so far (prefills not counted)
  int64_t tokens = 0;        // tokens handed to on_token so far, all requests
  // running, queued, kv_pages_used, steps and tokens are as of the end of the scheduler's last step (after
  // shutdown(): final).
};

class Scheduler {
 public:
  // on_token(event): false cancels the request (FinishReason::kCancelled). on_done(result): called exactly once per
  // accepted request, last, also when it was cancelled or the scheduler shut down.
  using OnToken = std::function<bool(const TokenEvent&)>;
  using OnDone = std::function<void(const RequestResult&)>;

  // Starts the scheduler's thread. std::invalid_argument "[scheduler] ..." for max_batch < 1, page_size < 1,
  // kv_tokens < 0, max_queued < 0 or threads < 0.
  Scheduler(const models::LlamaForCausalLM& model, const SchedulerOptions& options);
  ~Scheduler();  // shutdown(false)
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Queues a request and returns its id (ids start at 1). Checks everything before accepting: ids in
  // [0, vocab_size), a prompt of at least one token that leaves room for one new token in the context, options
  // (check_sampling, max_new_tokens >= 0, stop ids in [0, vocab_size), top_logprobs >= -1), and a worst case (see
  // above) within the whole KV budget: std::invalid_argument "[scheduler] ..." otherwise; QueueFull when the queue
  // is full; std::runtime_error after shutdown(). max_new_tokens 0: on_done comes with no token (kLength).
  uint64_t submit(std::vector<int64_t> prompt, const RequestOptions& options, OnToken on_token, OnDone on_done);
  // Ends a request (queued or running) at the next step: on_done follows with FinishReason::kCancelled (and the
  // tokens it got so far). Unknown or finished ids are ignored (a client that hung up may race with its request's
  // end): a request that ends by itself before the next step keeps its own finish reason.
  void cancel(uint64_t id);
  // finish_running true: no new requests; the queued and running ones run to their end. false: every request is
  // cancelled (a later call with false also cancels what a call with true left running). Returns when the
  // scheduler's thread has stopped; any later call returns at once.
  void shutdown(bool finish_running);
  SchedulerStats stats() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace qkv::decode
