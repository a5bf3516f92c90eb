// The one token-by-token continuation of a prompt (the decoding step of decode_batch.h with one row), and the step
// models that run a causal language model under greedy or beam search.
#include "qkv/decode/generate.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "decode_batch.h"
#include "qkv/core/error.h"

namespace qkv::decode {

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kContext: return "context";
    case FinishReason::kCancelled: return "cancelled";
  }
  return "?";
}

Generation generate(const models::LlamaForCausalLM& model, const std::vector<int64_t>& prompt,
                    const GenerateOptions& options, const TokenCallback& on_token) {
  check_sampling(options.sampling);
  QKV_CHECK_ARG(options.page_size >= 0, "[generate] page_size must be >= 0, got ", options.page_size);
  QKV_CHECK_ARG(options.max_new_tokens >= 0, "[generate] max_new_tokens must be >= 0, got ", options.max_new_tokens);
  QKV_CHECK_ARG(!prompt.empty(), "[generate] the prompt must hold at least one token");
  const int64_t v = model.config().vocab_size, context = model.config().max_position_embeddings;
  for (size_t i = 0; i < prompt.size(); ++i)
    QKV_CHECK_ARG(prompt[i] >= 0 && prompt[i] < v, "[generate] prompt id ", prompt[i], " at ", i,
                  " is outside [0, vocab_size = ", v, ")");
  for (int64_t id : options.stop_ids)
    QKV_CHECK_ARG(id >= 0 && id < v, "[generate] stop id ", id, " is outside [0, vocab_size = ", v, ")");
  const auto p = static_cast<int64_t>(prompt.size());
  QKV_CHECK_ARG(p < context, "[generate] the prompt of ", p, " tokens fills the model's context of ", context,
                " positions");
  auto cancelled = [&] { return options.cancel != nullptr && options.cancel->load(std::memory_order_relaxed); };
  detail::Reply reply(options.sampling, options.stop_ids, options.max_new_tokens, -1, p, context);
  if (reply.done()) return reply.generation();
  if (cancelled()) {
    reply.cancel();
    return reply.generation();
  }
  // The scheduler's step with a batch of one row.
  detail::Batch batch(model, options.page_size, reply.max_positions());
  Tensor logits = batch.add(prompt, {}, 0);
  const std::function<bool(const TokenEvent&)> each = [&](const TokenEvent& e) { return !on_token || on_token(e.id); };
  while (reply.advance(logits.data(), v, each)) {
    if (cancelled()) {
      reply.cancel();
      break;
    }
    logits = batch.step({reply.next_input()});
  }
  return reply.generation();
}

// --- CausalLmStep ----------------------------------------------------------------------------------------------

CausalLmStep::CausalLmStep(const models::LlamaForCausalLM& model, std::vector<std::vector<int64_t>> prompts,
                           int64_t page_size)
    : model_(&model), prompts_(std::move(prompts)), page_size_(page_size) {
  QKV_CHECK_ARG(page_size >= 0, "[CausalLmStep] page_size must be >= 0, got ", page_size);
  QKV_CHECK_ARG(!prompts_.empty(), "[CausalLmStep] no prompts");
  for (size_t s = 0; s < prompts_.size(); ++s) {
    QKV_CHECK_ARG(!prompts_[s].empty(), "[CausalLmStep] prompt ", s, " is empty: prompts must hold at least one token");
    longest_ = std::max(longest_, static_cast<int64_t>(prompts_[s].size()));
  }
}

int64_t CausalLmStep::vocab_size() const { return model_->config().vocab_size; }

int64_t CausalLmStep::row_bytes(int64_t steps) const {
  const models::LlamaConfig& c = model_->config();
  const int64_t positions = longest_ + std::max<int64_t>(steps, 0);
  const double bytes = 2.0 * static_cast<double>(c.num_hidden_layers) * static_cast<double>(c.num_key_value_heads) *
                       static_cast<double>(c.head_dim) * static_cast<double>(positions) * sizeof(float);
  return bytes >= 9.0e18 ? std::numeric_limits<int64_t>::max() : static_cast<int64_t>(bytes);
}

void CausalLmStep::start() {
  const auto s = static_cast<int64_t>(prompts_.size());
  const int64_t p = longest_;
  caches_ = model_->new_caches(s, p + 16, page_size_);
  rows_ = s;
  padded_ = std::any_of(prompts_.begin(), prompts_.end(),
                        [p](const std::vector<int64_t>& x) { return static_cast<int64_t>(x.size()) != p; });
  keys_ = p - 1;
  mask_.clear();
  next_.clear();
  if (p == 1) return;
  // Every prompt but its last token, left-padded to p - 1 columns (transformers' generate): the padding masked, each
  // row's tokens at positions 0, 1, ... (cumsum(mask) - 1; the padding's positions are never seen).
  Ids ids{{}, {s, p - 1}};
  std::vector<int64_t> positions;
  for (const auto& prompt : prompts_) {
    const int64_t pads = p - static_cast<int64_t>(prompt.size());
    for (int64_t j = 0; j < p - 1; ++j) {
      const bool token = j >= pads;
      ids.data.push_back(token ? prompt[static_cast<size_t>(j - pads)] : 0);
      mask_.push_back(token ? 1 : 0);
      positions.push_back(token ? j - pads : 0);
    }
    next_.push_back(static_cast<int64_t>(prompt.size()) - 1);
  }
  if (!padded_) {
    model_->forward(nn::Context(), ids, &caches_, /*logits_to_keep=*/1);  // only the caches are kept
    return;
  }
  model_->forward(nn::Context(), ids, &caches_, /*logits_to_keep=*/1, &positions, Ids{mask_, {s, p - 1}});
}

Tensor CausalLmStep::step(const std::vector<int64_t>& rows, const std::vector<int64_t>& tokens) {
  const auto n = static_cast<int64_t>(rows.size());
  QKV_CHECK_ARG(n >= 1 && tokens.size() == rows.size(), "[CausalLmStep] ", rows.size(), " rows and ",
                tokens.size(), " tokens");
  for (int64_t r : rows)
    QKV_CHECK_ARG(r >= 0 && r < rows_, "[CausalLmStep] row ", r, " is outside [0, ", rows_, ")");
  if (!nn::is_identity(rows, rows_))
    for (nn::KvCache& c : caches_) c.reorder(rows);
  rows_ = n;
  const Ids ids{tokens, {n, 1}};
  Tensor logits;  // (N, 1, V)
  if (!padded_) {
    logits = model_->forward(nn::Context(), ids, &caches_).value;
  } else {
    // The rows' masks and positions follow them (beams fork and drop rows), each extended by the new token.
    std::vector<int64_t> mask, positions, next;
    mask.reserve(static_cast<size_t>(n * (keys_ + 1)));
    for (int64_t r : rows) {
      const auto from = mask_.begin() + r * keys_;
      mask.insert(mask.end(), from, from + keys_);
      mask.push_back(1);
      positions.push_back(next_[static_cast<size_t>(r)]);
      next.push_back(next_[static_cast<size_t>(r)] + 1);
    }
    mask_ = std::move(mask);
    next_ = std::move(next);
    ++keys_;
    logits = model_->forward(nn::Context(), ids, &caches_, 0, &positions, Ids{mask_, {n, keys_}}).value;
  }
  return logits.reshape({n, logits.size(2)});
}

std::vector<int64_t> generate(const models::LlamaForCausalLM& model, const std::vector<int64_t>& prompt,
                              int64_t max_new_tokens, const SamplingOptions& options, int64_t eos,
                              int64_t page_size) {
  check_sampling(options);
  QKV_CHECK_ARG(page_size >= 0, "[generate] page_size must be >= 0, got ", page_size);
  QKV_CHECK_ARG(!prompt.empty(), "[generate] the prompt must hold at least one token");
  QKV_CHECK_ARG(max_new_tokens >= 0, "[generate] max_new_tokens must be >= 0, got ", max_new_tokens);
  const int64_t v = model.config().vocab_size;
  QKV_CHECK_ARG(eos >= -1 && eos < v, "[generate] eos ", eos, " must be in [0, vocab_size = ", v, ") or -1 (never)");
  for (size_t i = 0; i < prompt.size(); ++i)
    QKV_CHECK_ARG(prompt[i] >= 0 && prompt[i] < v, "[generate] prompt id ", prompt[i], " at ", i,
                  " is outside [0, vocab_size = ", v, ")");
  GenerateOptions o;
  o.max_new_tokens = max_new_tokens;
  o.sampling = options;
  if (eos >= 0) o.stop_ids = {eos};
  o.page_size = page_size;
  Generation g = generate(model, prompt, o);
  if (g.finish == FinishReason::kStop) g.tokens.push_back(g.stop_id);
  return g.tokens;
}

}  // namespace qkv::decode
