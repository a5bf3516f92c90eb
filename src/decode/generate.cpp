// The one token-by-token continuation of a prompt: prefill through the KV caches, then sample, stop, stream.
#include "qkv/decode/generate.h"

#include <algorithm>

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
  Generation g;
  if (options.max_new_tokens == 0) return g;
  auto cancelled = [&] { return options.cancel != nullptr && options.cancel->load(std::memory_order_relaxed); };
  if (cancelled()) {
    g.finish = FinishReason::kCancelled;
    return g;
  }
  // Positions p .. p + n - 1 hold the new tokens that are fed back: at most context - p of them.
  const int64_t room = std::min(options.max_new_tokens, context - p);
  Rng rng(options.sampling.seed);
  std::vector<nn::KvCache> caches = model.new_caches(1, p + room, options.page_size);
  Tensor logits = model.forward(nn::Context(), Ids{prompt, {1, p}}, &caches, 1).value;
  for (;;) {
    const Tensor last = logits.select(1, logits.size(1) - 1).contiguous();  // (1, V)
    const int64_t token = sample_token(last.data(), v, options.sampling, rng);
    if (std::find(options.stop_ids.begin(), options.stop_ids.end(), token) != options.stop_ids.end()) {
      g.finish = FinishReason::kStop;
      g.stop_id = token;
      return g;
    }
    g.tokens.push_back(token);
    if (on_token && !on_token(token)) {
      g.finish = FinishReason::kCancelled;
      return g;
    }
    const auto n = static_cast<int64_t>(g.tokens.size());
    if (n == options.max_new_tokens) {
      g.finish = FinishReason::kLength;
      return g;
    }
    if (n == room) {  // the next token would have no position left
      g.finish = FinishReason::kContext;
      return g;
    }
    if (cancelled()) {
      g.finish = FinishReason::kCancelled;
      return g;
    }
    logits = model.forward(nn::Context(), Ids{{token}, {1, 1}}, &caches).value;
  }
}

}  // namespace qkv::decode
