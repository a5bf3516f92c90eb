// The one token-by-token continuation of a prompt (the decoding step of decode_batch.h with one row).
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
  QKV_CHECK_ARG(options.kv_cache == Precision::kFloat32 || options.kv_cache == Precision::kBFloat16,
                "[generate] kv_cache ", precision_name(options.kv_cache), " is not one of fp32, bf16");
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
  detail::Batch batch(model, options.page_size, reply.max_positions(), options.kv_cache);
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
