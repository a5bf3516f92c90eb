// The sampling options, the context cap and the streamed reply that `qkv generate --prompt` and `qkv chat` share.
#include "lm_common.h"

#include <algorithm>
#include <cstdio>
#include <string>

#include "qkv/core/error.h"
#include "qkv/text/tokenizer.h"
#include "run_common.h"

namespace qkv::cli {

SamplingFlags add_sampling_options(CLI::App* cmd, decode::SamplingOptions& sampling) {
  SamplingFlags f;
  cmd->add_option("--temperature", sampling.temperature,
                  "0: greedy; > 0: sample softmax(logits / T) (--top-k and --top-p need it; llama.cpp's usual 0.8)")
      ->capture_default_str();
  f.top_k = cmd->add_option("--top-k", sampling.top_k,
                            "With --temperature: sample among the k most likely tokens (0: all)")
                ->capture_default_str()
                ->check(at_least(0));
  f.top_p = cmd->add_option("--top-p", sampling.top_p,
                            "With --temperature: sample within the smallest set of probability >= p")
                ->capture_default_str();
  cmd->add_option("--seed", sampling.seed, "Seed of the sampling stream")->capture_default_str()->check(seed_value());
  return f;
}

void check_sampling_given(const decode::SamplingOptions& sampling, bool top_k_given, bool top_p_given,
                          const char* op) {
  QKV_CHECK_ARG(sampling.temperature > 0.0f || (!top_k_given && !top_p_given), "[", op,
                "] --top-k and --top-p filter sampling, which needs --temperature > 0 (e.g. 0.8, as llama.cpp; 1.0 "
                "is HF's); without it the search is greedy and they would do nothing");
}

void add_ctx_option(CLI::App* cmd, int64_t& ctx) {
  // Hidden (no group): a testing and memory knob, not part of the documented interface.
  cmd->add_option("--ctx", ctx, "Cap the context at N positions (0: the model's max_position_embeddings)")
      ->check(at_least(0))
      ->group("");
}

int64_t context_of(const models::LanguageModel& lm, int64_t ctx) {
  const int64_t model_ctx = lm.model->config().max_position_embeddings;
  return ctx > 0 ? std::min(ctx, model_ctx) : model_ctx;
}

Reply stream_reply(const models::LanguageModel& lm, const std::vector<int64_t>& prompt, decode::GenerateOptions options,
                   int64_t context, bool print_ids, const char* op) {
  const auto p = static_cast<int64_t>(prompt.size());
  QKV_CHECK_ARG(p < context, "[", op, "] the prompt of ", p, " tokens fills the context of ", context, " positions");
  const int64_t wanted = options.max_new_tokens;
  options.max_new_tokens = std::min(wanted, context - p);
  text::StreamDecoder stream(*lm.tokenizer, /*skip_special_tokens=*/true);
  Reply r;
  size_t printed = 0;
  r.generation = decode::generate(*lm.model, prompt, options, [&](int64_t id) {
    std::string piece;
    if (print_ids) {
      piece = (printed++ ? "," : "") + std::to_string(id);
    } else {
      piece = stream.push(id);
      r.text += piece;
    }
    if (!piece.empty()) {
      std::fwrite(piece.data(), 1, piece.size(), stdout);
      flush_stdout(op);
    }
    return true;
  });
  if (!print_ids) {
    const std::string rest = stream.flush();
    r.text += rest;
    std::fwrite(rest.data(), 1, rest.size(), stdout);
    flush_stdout(op);
  }
  // The cap below the model's own context ends the reply as the model's end would.
  if (r.generation.finish == decode::FinishReason::kLength && options.max_new_tokens < wanted)
    r.generation.finish = decode::FinishReason::kContext;
  return r;
}

}  // namespace qkv::cli
