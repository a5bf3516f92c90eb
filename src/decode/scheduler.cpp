// Continuous batching (scheduler.h): one thread admits queued requests into the running batch while the KV budget
// and max_batch allow (each prompt prefilled alone after its longest cached prefix), then advances every running
// row by one batched forward (decode_batch.h's step), samples each row, and retires the rows that end; the pages of
// finished replies stay in a small prefix cache, evicted least recently used first when the pool needs them.
#include "qkv/decode/scheduler.h"

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <omp.h>
#include <set>
#include <thread>

#include "decode_batch.h"
#include "qkv/core/error.h"

namespace qkv::decode {
namespace {

struct Request {
  uint64_t id = 0;
  std::vector<int64_t> prompt;
  RequestOptions options;
  Scheduler::OnToken on_token;
  Scheduler::OnDone on_done;
};

// The pages of a token sequence's whole-page prefix that a finished reply computed.
struct PrefixEntry {
  std::vector<int64_t> tokens;                // a multiple of page_size
  std::vector<std::vector<int32_t>> pages;    // per layer, tokens.size() / page_size pages
  uint64_t used = 0;                          // the clock of its last use (LRU)
};

struct Row {
  Request request;
  detail::Reply reply;
  int64_t cached = 0;        // prompt positions taken from the prefix cache
  int64_t shared_pages = 0;  // the pages of those positions (not this row's own)
  int64_t budget_pages = 0;  // the pages of its own it may come to hold
  bool cancel = false;
};

}  // namespace

struct Scheduler::Impl {
  const models::LlamaForCausalLM* model;
  SchedulerOptions options;
  int64_t total_pages = 0, context = 0, vocab = 0;

  // Shared with the callers' threads, under mu.
  mutable std::mutex mu;
  std::condition_variable wake;
  std::deque<Request> queue;
  std::set<uint64_t> cancels;
  uint64_t next_id = 1;
  bool accepting = true, stop = false, finish_running = true;
  SchedulerStats stats;
  std::mutex join_mu;
  std::thread worker;

  // The worker's own.
  detail::Batch batch;
  std::vector<Row> rows;
  std::vector<PrefixEntry> prefixes;
  uint64_t clock = 0;
  int64_t tokens_made = 0, steps_made = 0;

  Impl(const models::LlamaForCausalLM& m, const SchedulerOptions& o, int64_t pages)
      : model(&m),
        options(o),
        total_pages(pages),
        context(m.config().max_position_embeddings),
        vocab(m.config().vocab_size),
        batch(m, o.page_size, std::min<int64_t>(pages * o.page_size, 1024), o.kv_cache) {}  // the pool grows as needed

  int64_t pages_of(int64_t positions) const { return (positions + options.page_size - 1) / options.page_size; }
  // Pages the pool holds plus those the running rows may still take.
  int64_t committed() const {
    int64_t n = batch.pages_in_use();
    for (size_t i = 0; i < rows.size(); ++i) {
      const int64_t own = pages_of(batch.row_length(static_cast<int64_t>(i))) - rows[i].shared_pages;
      n += std::max<int64_t>(0, rows[i].budget_pages - own);
    }
    return n;
  }
  // The longest whole-page prefix of `prompt` (leaving its last token to compute) in the prefix cache.
  PrefixEntry* match(const std::vector<int64_t>& prompt, int64_t& pages) {
    pages = 0;
    if (!options.reuse_prefix) return nullptr;
    const int64_t page = options.page_size, most = (static_cast<int64_t>(prompt.size()) - 1) / page;
    PrefixEntry* best = nullptr;
    for (PrefixEntry& e : prefixes) {
      const int64_t n = std::min<int64_t>(most, static_cast<int64_t>(e.tokens.size()) / page);
      int64_t same = 0;
      while (same < n && std::equal(e.tokens.begin() + same * page, e.tokens.begin() + (same + 1) * page,
                                    prompt.begin() + same * page))
        ++same;
      if (same > pages || (same == pages && same > 0 && best != nullptr && e.used > best->used)) {
        pages = same;
        best = &e;
      }
    }
    return best;
  }
  bool evict_one() {
    if (prefixes.empty()) return false;
    auto lru = std::min_element(prefixes.begin(), prefixes.end(),
                                [](const PrefixEntry& a, const PrefixEntry& b) { return a.used < b.used; });
    batch.release(lru->pages);
    prefixes.erase(lru);
    return true;
  }
  // Keeps the whole pages of a finishing row (prompt and reply) in the prefix cache.
  void remember(int64_t row, const Row& r) {
    if (!options.reuse_prefix) return;
    const int64_t page = options.page_size, pages = batch.row_length(row) / page;
    if (pages == 0) return;
    std::vector<int64_t> tokens = r.request.prompt;
    const std::vector<int64_t>& reply = r.reply.generation().tokens;
    tokens.insert(tokens.end(), reply.begin(), reply.end());
    tokens.resize(static_cast<size_t>(pages * page));
    for (auto it = prefixes.begin(); it != prefixes.end();) {
      const size_t n = std::min(it->tokens.size(), tokens.size());
      if (std::equal(tokens.begin(), tokens.begin() + static_cast<std::ptrdiff_t>(n), it->tokens.begin())) {
        if (it->tokens.size() >= tokens.size()) {  // already held
          it->used = ++clock;
          return;
        }
        batch.release(it->pages);  // a shorter prefix of this one
        it = prefixes.erase(it);
      } else {
        ++it;
      }
    }
    PrefixEntry e;
    e.tokens = std::move(tokens);
    e.pages = batch.row_pages(row, pages);
    e.used = ++clock;
    batch.retain(e.pages);
    prefixes.push_back(std::move(e));
    while (static_cast<int64_t>(prefixes.size()) > 4 * options.max_batch + 4) evict_one();
  }

  static void done(Request& request, const Generation& g, int64_t cached) {
    RequestResult result;
    result.generation = g;
    result.prompt_tokens = static_cast<int64_t>(request.prompt.size());
    result.cached_prompt_tokens = cached;
    if (request.on_done) {
      try {
        request.on_done(result);
      } catch (...) {  // a callback's failure is its own; the other requests go on
      }
    }
  }
  static void cancelled(Request& request) {
    Generation g;
    g.finish = FinishReason::kCancelled;
    done(request, g, 0);
  }
  bool deliver(Row& r, const float* logits) {
    return r.reply.advance(logits, vocab, [&](const TokenEvent& e) {
      ++tokens_made;
      if (!r.request.on_token) return true;
      try {
        return r.request.on_token(e);
      } catch (...) {
        return false;
      }
    });
  }

  // Takes the queue's head into the batch when it fits: prefill, first token. false: nothing to admit now.
  bool admit() {
    Request request;
    int64_t budget = 0;
    {
      std::lock_guard<std::mutex> lock(mu);
      if (queue.empty() || static_cast<int64_t>(rows.size()) >= options.max_batch || (stop && !finish_running))
        return false;
      Request& head = queue.front();
      detail::Reply probe(head.options.sampling, {}, head.options.max_new_tokens, -1,
                          static_cast<int64_t>(head.prompt.size()), context);
      if (!probe.done()) {
        budget = pages_of(probe.max_positions());
        for (;;) {  // the prefix's pages are shared, not the row's own
          int64_t shared = 0;
          match(head.prompt, shared);
          if (committed() + budget - shared <= total_pages) break;
          if (!evict_one()) return false;  // waits for running rows to end
        }
      }
      request = std::move(head);
      queue.pop_front();
    }
    detail::Reply reply(request.options.sampling, request.options.stop_ids, request.options.max_new_tokens,
                        request.options.top_logprobs, static_cast<int64_t>(request.prompt.size()), context);
    Row r{std::move(request), std::move(reply)};
    if (r.reply.done()) {  // max_new_tokens 0
      done(r.request, r.reply.generation(), 0);
      return true;
    }
    int64_t shared = 0;
    PrefixEntry* prefix = match(r.request.prompt, shared);
    r.shared_pages = shared;
    r.cached = shared * options.page_size;
    r.budget_pages = budget - shared;
    std::vector<std::vector<int32_t>> pages;  // per layer, the matched ones of the entry's pages
    if (prefix != nullptr) {
      prefix->used = ++clock;
      for (const std::vector<int32_t>& layer : prefix->pages) pages.emplace_back(layer.begin(), layer.begin() + shared);
    }
    Tensor logits;
    try {
      logits = batch.add(r.request.prompt, pages, r.cached);
    } catch (...) {  // the request ends here; the running ones end in run()
      cancelled(r.request);
      throw;
    }
    rows.push_back(std::move(r));
    {
      std::lock_guard<std::mutex> lock(mu);  // submit() counts the places left in the batch
      stats.running = static_cast<int64_t>(rows.size());
    }
    if (!deliver(rows.back(), logits.data())) retire({static_cast<int64_t>(rows.size()) - 1});
    return true;
  }

  // Ends the given rows (their replies done or cancelled) and drops them from the batch.
  void retire(const std::vector<int64_t>& ended) {
    if (ended.empty()) return;
    std::vector<int64_t> keep;
    std::vector<Row> kept;
    for (int64_t i = 0; i < static_cast<int64_t>(rows.size()); ++i) {
      if (std::find(ended.begin(), ended.end(), i) == ended.end()) {
        keep.push_back(i);
        continue;
      }
      Row& r = rows[static_cast<size_t>(i)];
      if (!r.reply.done()) r.reply.cancel();
      remember(i, r);
    }
    for (int64_t i : ended) {
      Row& r = rows[static_cast<size_t>(i)];
      done(r.request, r.reply.generation(), r.cached);
    }
    batch.keep(keep);
    for (int64_t i : keep) kept.push_back(std::move(rows[static_cast<size_t>(i)]));
    rows = std::move(kept);
  }

  void publish() {
    std::lock_guard<std::mutex> lock(mu);
    stats.running = static_cast<int64_t>(rows.size());
    stats.queued = static_cast<int64_t>(queue.size());
    stats.kv_pages_used = batch.pages_in_use();
    stats.steps = steps_made;
    stats.tokens = tokens_made;
  }

  void run() {
    for (;;) {
      std::set<uint64_t> cancel_ids;
      std::vector<Request> dropped;
      bool cancel_all = false;
      {
        std::unique_lock<std::mutex> lock(mu);
        wake.wait(lock, [&] { return stop || !queue.empty() || !rows.empty() || !cancels.empty(); });
        cancel_ids.swap(cancels);
        cancel_all = stop && !finish_running;
        for (auto it = queue.begin(); it != queue.end();) {
          if (cancel_all || cancel_ids.count(it->id) != 0) {
            dropped.push_back(std::move(*it));
            it = queue.erase(it);
          } else {
            ++it;
          }
        }
        if (stop && queue.empty() && rows.empty() && dropped.empty()) break;
      }
      for (Request& r : dropped) cancelled(r);
      std::vector<int64_t> ended;
      for (int64_t i = 0; i < static_cast<int64_t>(rows.size()); ++i)
        if (cancel_all || cancel_ids.count(rows[static_cast<size_t>(i)].request.id) != 0) ended.push_back(i);
      retire(ended);
      try {
        while (admit()) {
        }
        if (!rows.empty()) {
          std::vector<int64_t> tokens;
          for (const Row& r : rows) tokens.push_back(r.reply.next_input());
          const Tensor logits = batch.step(tokens);  // (N, V)
          ended.clear();
          for (int64_t i = 0; i < static_cast<int64_t>(rows.size()); ++i)
            if (!deliver(rows[static_cast<size_t>(i)], logits.data() + i * vocab)) ended.push_back(i);
          ++steps_made;
          retire(ended);
        }
      } catch (...) {  // the model failed (out of memory, ...): every running request ends, cancelled
        std::vector<int64_t> all(rows.size());
        for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<int64_t>(i);
        for (Row& r : rows)
          if (!r.reply.done()) r.reply.cancel();
        retire(all);
      }
      publish();
    }
    publish();
  }
};

Scheduler::Scheduler(const models::LlamaForCausalLM& model, const SchedulerOptions& o) {
  const int64_t context = model.config().max_position_embeddings;
  QKV_CHECK_ARG(o.max_batch >= 1, "[scheduler] max_batch must be >= 1, got ", o.max_batch);
  QKV_CHECK_ARG(o.page_size >= 1, "[scheduler] page_size must be >= 1, got ", o.page_size);
  QKV_CHECK_ARG(o.kv_tokens >= 0, "[scheduler] kv_tokens must be >= 0, got ", o.kv_tokens);
  QKV_CHECK_ARG(o.max_queued >= 0, "[scheduler] max_queued must be >= 0, got ", o.max_queued);
  QKV_CHECK_ARG(o.threads >= 0, "[scheduler] threads must be >= 0, got ", o.threads);
  QKV_CHECK_ARG(o.kv_cache == Precision::kFloat32 || o.kv_cache == Precision::kBFloat16, "[scheduler] kv_cache ",
                precision_name(o.kv_cache), " is not one of fp32, bf16");
  const int64_t tokens = o.kv_tokens > 0 ? o.kv_tokens : o.max_batch * context;
  const int64_t pages = (tokens + o.page_size - 1) / o.page_size;
  impl_ = std::make_unique<Impl>(model, o, pages);
  impl_->stats.kv_pages_total = pages;
  const int threads = o.threads > 0 ? static_cast<int>(o.threads) : omp_get_max_threads();
  impl_->worker = std::thread([this, threads] {
    omp_set_num_threads(threads);  // a thread's own setting: the caller's does not carry over
    impl_->run();
  });
}

Scheduler::~Scheduler() { shutdown(false); }

uint64_t Scheduler::submit(std::vector<int64_t> prompt, const RequestOptions& o, OnToken on_token, OnDone on_done) {
  Impl& s = *impl_;
  check_sampling(o.sampling);
  QKV_CHECK_ARG(o.max_new_tokens >= 0, "[scheduler] max_new_tokens must be >= 0, got ", o.max_new_tokens);
  QKV_CHECK_ARG(o.top_logprobs >= -1, "[scheduler] top_logprobs must be -1 (none) or >= 0, got ", o.top_logprobs);
  QKV_CHECK_ARG(!prompt.empty(), "[scheduler] the prompt must hold at least one token");
  for (size_t i = 0; i < prompt.size(); ++i)
    QKV_CHECK_ARG(prompt[i] >= 0 && prompt[i] < s.vocab, "[scheduler] prompt id ", prompt[i], " at ", i,
                  " is outside [0, vocab_size = ", s.vocab, ")");
  for (int64_t id : o.stop_ids)
    QKV_CHECK_ARG(id >= 0 && id < s.vocab, "[scheduler] stop id ", id, " is outside [0, vocab_size = ", s.vocab, ")");
  const auto p = static_cast<int64_t>(prompt.size());
  QKV_CHECK_ARG(p < s.context, "[scheduler] the prompt of ", p, " tokens fills the model's context of ", s.context,
                " positions");
  const detail::Reply probe(o.sampling, {}, o.max_new_tokens, -1, p, s.context);
  const int64_t need = probe.done() ? 0 : s.pages_of(probe.max_positions());
  QKV_CHECK_ARG(need <= s.total_pages, "[scheduler] the prompt of ", p, " tokens and up to ", o.max_new_tokens,
                " new ones need ", need, " KV pages of ", s.options.page_size, " positions; the pool holds ",
                s.total_pages);
  std::lock_guard<std::mutex> lock(s.mu);
  QKV_CHECK_RUNTIME(s.accepting, "[scheduler] submit after shutdown");
  // Queued requests for which the batch has a place now are not waiting for one.
  const int64_t places = std::max<int64_t>(0, s.options.max_batch - s.stats.running);
  if (static_cast<int64_t>(s.queue.size()) >= s.options.max_queued + places)
    throw QueueFull(::qkv::detail::concat("[scheduler] ", s.queue.size(), " requests are queued for ", places,
                                          " places in the batch already (max_queued ", s.options.max_queued, ")"));
  Request r;
  r.id = s.next_id++;
  r.prompt = std::move(prompt);
  r.options = o;
  r.on_token = std::move(on_token);
  r.on_done = std::move(on_done);
  const uint64_t id = r.id;
  s.queue.push_back(std::move(r));
  s.stats.queued = static_cast<int64_t>(s.queue.size());
  s.wake.notify_one();
  return id;
}

void Scheduler::cancel(uint64_t id) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->cancels.insert(id);
  impl_->wake.notify_one();
}

void Scheduler::shutdown(bool finish_running) {
  Impl& s = *impl_;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    s.accepting = false;
    if (!s.stop) {
      s.stop = true;
      s.finish_running = finish_running;
    } else if (!finish_running) {
      s.finish_running = false;
    }
    s.wake.notify_one();
  }
  std::lock_guard<std::mutex> join(s.join_mu);
  if (s.worker.joinable()) s.worker.join();
}

SchedulerStats Scheduler::stats() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->stats;
}

}  // namespace qkv::decode
