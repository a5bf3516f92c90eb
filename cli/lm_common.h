// Helpers shared by `qkv generate` (text mode) and `qkv chat`: the sampling options, a context cap, and a reply
// streamed to stdout token by token as text (or ids).
#pragma once

#include <atomic>
#include <cstdint>
#include <vector>

#include <CLI/CLI.hpp>

#include "qkv/decode/generate.h"
#include "qkv/decode/sampling.h"
#include "qkv/models/language_model.h"

namespace qkv::cli {

// --temperature, --top-k, --top-p and --seed on `cmd` into *sampling. Returned: the --top-k and --top-p options, so
// that the command can tell whether they were given (check_sampling_given).
struct SamplingFlags {
  CLI::Option* top_k = nullptr;
  CLI::Option* top_p = nullptr;
};
SamplingFlags add_sampling_options(CLI::App* cmd, decode::SamplingOptions& sampling);

// --top-k or --top-p without --temperature > 0 would do nothing (the search is greedy): invalid_argument "[op] ...".
void check_sampling_given(const decode::SamplingOptions& sampling, bool top_k_given, bool top_p_given,
                          const char* op);

// The hidden --ctx N option (0: the model's own context): caps the positions a conversation may take below the
// model's max_position_embeddings, as llama.cpp's -c does. Tests use it to reach the end of the context quickly.
void add_ctx_option(CLI::App* cmd, int64_t& ctx);
// The context in positions: the model's max_position_embeddings, or ctx when 0 < ctx < it.
int64_t context_of(const models::LanguageModel& lm, int64_t ctx);

struct Reply {
  decode::Generation generation;  // tokens without the stop id; finish kContext also when the cap `context` is hit
  std::string text;               // what was printed of the tokens, as text (skip_special_tokens)
};

// Continues `prompt` (P ids, P < context) with at most max_new_tokens tokens (and never past `context` positions),
// printing each token to stdout as it comes and flushing: as text through a text::StreamDecoder (special tokens
// skipped, partial UTF-8 held back until complete), or with print_ids as comma-separated ids. No newline at the
// end. options.max_new_tokens is the caller's bound; options.cancel stops the reply between tokens.
Reply stream_reply(const models::LanguageModel& lm, const std::vector<int64_t>& prompt, decode::GenerateOptions options,
                   int64_t context, bool print_ids, const char* op);

}  // namespace qkv::cli
