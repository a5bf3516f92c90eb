// The one cached decoding step (decode_batch.h): rows over per-layer KV caches, prefill, batched step, and the
// per-row sampling and stop decisions.
#include "decode_batch.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "qkv/core/error.h"

namespace qkv::decode::detail {

Reply::Reply(const SamplingOptions& sampling, std::vector<int64_t> stop_ids, int64_t max_new_tokens,
             int64_t top_logprobs, int64_t prompt_len, int64_t context)
    : sampling_(sampling),
      stop_ids_(std::move(stop_ids)),
      max_new_(max_new_tokens),
      top_logprobs_(top_logprobs),
      prompt_len_(prompt_len),
      // Positions P .. P + n - 1 hold the new tokens that are fed back: at most context - P of them.
      room_(std::min(max_new_tokens, context - prompt_len)),
      rng_(sampling.seed) {
  if (max_new_ == 0) finish(FinishReason::kLength);
}

void log_probabilities(const float* logits, int64_t vocab, int64_t id, int64_t k, TokenEvent& event) {
  double top = -INFINITY;
  for (int64_t i = 0; i < vocab; ++i) top = std::max(top, static_cast<double>(logits[i]));
  double sum = 0.0;
  for (int64_t i = 0; i < vocab; ++i) sum += std::exp(static_cast<double>(logits[i]) - top);
  const double lse = top + std::log(sum);
  event.logprob = static_cast<float>(static_cast<double>(logits[id]) - lse);
  event.top.clear();
  const int64_t n = std::min(k, vocab);
  if (n <= 0) return;
  std::vector<int64_t> order(static_cast<size_t>(vocab));
  std::iota(order.begin(), order.end(), int64_t{0});
  std::partial_sort(order.begin(), order.begin() + n, order.end(), [&](int64_t a, int64_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  });
  for (int64_t i = 0; i < n; ++i) {
    const int64_t t = order[static_cast<size_t>(i)];
    event.top.emplace_back(t, static_cast<float>(static_cast<double>(logits[t]) - lse));
  }
}

bool Reply::advance(const float* logits, int64_t vocab, const std::function<bool(const TokenEvent&)>& on_token) {
  QKV_ASSERT(!done_);
  TokenEvent event;
  event.id = sample_token(logits, vocab, sampling_, rng_);
  if (std::find(stop_ids_.begin(), stop_ids_.end(), event.id) != stop_ids_.end()) {
    generation_.stop_id = event.id;
    finish(FinishReason::kStop);
    return false;
  }
  if (top_logprobs_ >= 0) log_probabilities(logits, vocab, event.id, top_logprobs_, event);
  generation_.tokens.push_back(event.id);
  if (on_token && !on_token(event)) {
    finish(FinishReason::kCancelled);
    return false;
  }
  const auto n = static_cast<int64_t>(generation_.tokens.size());
  if (n == max_new_) {
    finish(FinishReason::kLength);
  } else if (n == room_) {  // the next token would have no position left
    finish(FinishReason::kContext);
  }
  return !done_;
}

Batch::Batch(const models::LlamaForCausalLM& model, int64_t page_size, int64_t capacity, Precision kv_cache)
    : model_(&model), page_(page_size), capacity_(std::max<int64_t>(capacity, 1)), kv_cache_(kv_cache) {
  QKV_CHECK_ARG(page_size >= 0, "[decode] page_size must be >= 0, got ", page_size);
  if (page_ > 0) {
    caches_ = model.new_caches(0, page_, page_, kv_cache_);
    fresh_.resize(caches_.size());
    for (size_t l = 0; l < caches_.size(); ++l) {
      caches_[l].reserve_pages((capacity_ + page_ - 1) / page_);
      fresh_[l].reset_shared(caches_[l]);
    }
  }
}

Tensor Batch::add(const std::vector<int64_t>& prompt, const std::vector<std::vector<int32_t>>& prefix_pages,
                  int64_t prefix_len, Record* record) {
  const auto p = static_cast<int64_t>(prompt.size());
  QKV_CHECK_ARG(prefix_len >= 0 && prefix_len < p, "[decode] a cached prefix of ", prefix_len,
                " positions for a prompt of ", p);
  std::vector<nn::KvCache>* target = &fresh_;
  if (page_ == 0) {
    QKV_CHECK_ARG(rows_ == 0 && prefix_len == 0, "[decode] contiguous KV caches hold one row and no cached prefix");
    caches_ = model_->new_caches(1, std::max(capacity_, p), 0, kv_cache_);
    target = &caches_;
  } else {
    QKV_CHECK_ARG(prefix_len % page_ == 0 && (prefix_len == 0 || prefix_pages.size() == caches_.size()),
                  "[decode] a cached prefix of ", prefix_len, " positions in ", prefix_pages.size(),
                  " layers' pages of ", page_);
    for (size_t l = 0; l < fresh_.size(); ++l) {
      fresh_[l].reset_shared(caches_[l]);
      if (prefix_len > 0)
        fresh_[l].add_row(prefix_pages[l], prefix_len);
      else
        fresh_[l].add_row({}, 0);
    }
  }
  const Ids rest{{prompt.begin() + prefix_len, prompt.end()}, {1, p - prefix_len}};
  Tensor logits;  // (1, T, V)
  if (record != nullptr) {
    record->output = model_->forward(rest, record->options, target);
    logits = record->output.logits.select(1, rest.shape[1] - 1).contiguous();
  } else {
    logits = model_->forward(nn::Context(), rest, target, /*logits_to_keep=*/1).value;
  }
  if (page_ > 0)
    for (size_t l = 0; l < caches_.size(); ++l) caches_[l].take_rows(fresh_[l]);
  ++rows_;
  return logits.reshape({logits.size(-1)});
}

Tensor Batch::step(const std::vector<int64_t>& tokens, Record* record) {
  const auto n = static_cast<int64_t>(tokens.size());
  QKV_CHECK_ARG(n == rows_ && n >= 1, "[decode] ", n, " tokens for a step of ", rows_, " rows");
  const Ids ids{tokens, {n, 1}};
  if (record != nullptr) record->output = model_->forward(ids, record->options, &caches_);
  const Tensor logits =
      record != nullptr ? record->output.logits : model_->forward(nn::Context(), ids, &caches_).value;  // (N, 1, V)
  return logits.reshape({n, logits.size(2)});
}

void Batch::keep(const std::vector<int64_t>& rows) {
  if (rows_ == 0) return;
  for (nn::KvCache& c : caches_) c.reorder(rows);
  rows_ = static_cast<int64_t>(rows.size());
}

std::vector<std::vector<int32_t>> Batch::row_pages(int64_t row, int64_t pages) const {
  std::vector<std::vector<int32_t>> out;
  for (const nn::KvCache& c : caches_) {
    std::vector<int32_t> p = c.row_pages(row);
    QKV_ASSERT(static_cast<int64_t>(p.size()) >= pages);
    p.resize(static_cast<size_t>(pages));
    out.push_back(std::move(p));
  }
  return out;
}

void Batch::retain(const std::vector<std::vector<int32_t>>& pages) {
  for (size_t l = 0; l < caches_.size(); ++l) caches_[l].retain_pages(pages[l]);
}

void Batch::release(const std::vector<std::vector<int32_t>>& pages) {
  for (size_t l = 0; l < caches_.size(); ++l) caches_[l].release_pages(pages[l]);
}

}  // namespace qkv::decode::detail
