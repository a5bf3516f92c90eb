// `qkv generate --model DIR --prompt-ids 5,17,42 [--max-new-tokens 64] [--temperature T --top-k K --top-p P
// --seed S] [--beam N] [--eos ID] [--page-size N]`: continues a prompt with a Llama / Mistral / Gemma 2 folder written by
// transformers' save_pretrained and prints the new token ids on one line, comma-separated. Greedy by default.
#include <cstdio>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <unistd.h>

#include "commands.h"
#include "run_common.h"
#include "qkv/core/error.h"
#include "qkv/decode/sampling.h"
#include "qkv/decode/search.h"
#include "qkv/models/llama.h"

namespace qkv::cli {
namespace {

// "5,17,42" -> {5, 17, 42}; every item a non-negative decimal integer.
std::vector<int64_t> parse_ids(const std::string& text) {
  std::vector<int64_t> ids;
  size_t start = 0;
  for (;;) {
    const size_t comma = text.find(',', start);
    const std::string item = text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    size_t used = 0;
    int64_t v = -1;
    try {
      if (!item.empty() && item.find_first_not_of("0123456789") == std::string::npos) v = std::stoll(item, &used);
    } catch (const std::out_of_range&) {
      used = 0;
    }
    if (used == 0 || used != item.size())
      throw std::invalid_argument("[generate] --prompt-ids: '" + item + "' is not a token id (want e.g. 5,17,42)");
    ids.push_back(v);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return ids;
}

struct GenerateArgs {
  std::string model, prompt, precision;
  int64_t max_new_tokens = 64, beam = 0, eos = -1, page_size = 0;
  decode::SamplingOptions sampling;
  bool eos_given = false, top_k_given = false, top_p_given = false;
};

// Half of the machine's physical memory: the most a beam search may plan to take.
int64_t beam_memory_limit() {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || page <= 0) return 0;
  return static_cast<int64_t>(static_cast<double>(pages) * static_cast<double>(page) / 2);
}

void run_generate(const GenerateArgs& a) {
  const Precision precision = parse_precision(a.precision);
  const std::vector<int64_t> prompt = parse_ids(a.prompt);
  QKV_CHECK_ARG(a.sampling.temperature > 0.0f || (!a.top_k_given && !a.top_p_given),
                "[generate] --top-k and --top-p filter sampling, which needs --temperature > 0 (e.g. 0.8, as "
                "llama.cpp; 1.0 is HF's); without it the search is greedy and they would do nothing");
  const std::unique_ptr<models::LlamaForCausalLM> model =
      models::LlamaForCausalLM::from_pretrained(a.model, precision);
  const int64_t vocab = model->config().vocab_size;
  QKV_CHECK_ARG(a.eos >= -1 && a.eos < vocab, "[generate] --eos ", a.eos, " is not a token id of this model (in [0, ",
                vocab, ")) nor -1 (never)");
  std::vector<int64_t> out;
  if (a.beam > 0) {
    QKV_CHECK_ARG(a.sampling.temperature == 0.0f, "[generate] --beam searches; it does not sample (--temperature)");
    QKV_CHECK_ARG(a.beam <= vocab, "[generate] --beam ", a.beam, " is wider than the vocabulary (", vocab,
                  " tokens)");
    decode::CausalLmStep step(*model, {prompt}, a.page_size);
    decode::SearchOptions o;
    o.max_len = a.max_new_tokens;
    o.bos = prompt.back();
    o.eos = a.eos_given ? a.eos : model->config().eos_token_id;  // -1: never
    decode::BeamOptions b;
    b.beam_size = a.beam;
    b.max_bytes = beam_memory_limit();
    if (a.max_new_tokens > 0) out = decode::beam_search(step, o, b).at(0).at(0).tokens;
  } else {
    out = decode::generate(*model, prompt, a.max_new_tokens, a.sampling, a.eos, a.page_size);
  }
  std::string line;
  for (size_t i = 0; i < out.size(); ++i) line += (i ? "," : "") + std::to_string(out[i]);
  std::printf("%s\n", line.c_str());
  flush_stdout("generate");
}

}  // namespace

void add_generate(CLI::App& app) {
  auto* cmd = app.add_subcommand("generate", "Continue a prompt with a Llama / Mistral / Gemma 2 model folder");
  auto a = std::make_shared<GenerateArgs>();
  cmd->add_option("--model", a->model, "transformers' save_pretrained folder (config.json, model.safetensors)")
      ->required();
  cmd->add_option("--prompt-ids", a->prompt, "Prompt token ids, comma-separated (e.g. 5,17,42)")->required();
  cmd->add_option("--max-new-tokens", a->max_new_tokens, "Tokens to generate")
      ->capture_default_str()
      ->check(at_least(0));
  cmd->add_option("--temperature", a->sampling.temperature,
                  "0: greedy; > 0: sample softmax(logits / T) (--top-k and --top-p need it; llama.cpp's usual 0.8)")
      ->capture_default_str();
  CLI::Option* top_k = cmd->add_option("--top-k", a->sampling.top_k,
                                       "With --temperature: sample among the k most likely tokens (0: all)")
                           ->capture_default_str()
                           ->check(at_least(0));
  CLI::Option* top_p = cmd->add_option("--top-p", a->sampling.top_p,
                                       "With --temperature: sample within the smallest set of probability >= p")
                           ->capture_default_str();
  cmd->add_option("--seed", a->sampling.seed, "Seed of the sampling stream")->capture_default_str()->check(seed_value());
  cmd->add_option("--beam", a->beam,
                  "Beam search with this many beams (0: off; at most the vocabulary, and half of the memory)")
      ->capture_default_str()
      ->check(at_least(0));
  CLI::Option* eos = cmd->add_option("--eos", a->eos,
                                     "Stop after this token (-1: never); without --eos, greedy and sampling never "
                                     "stop early and --beam stops at the config's eos_token_id")
                         ->capture_default_str()
                         ->check(at_least(-1));
  cmd->add_option("--page-size", a->page_size,
                  "KV cache in pages of this many positions, read in place by the attention (0: contiguous)")
      ->capture_default_str()
      ->check(at_least(0));
  add_precision_option(cmd, a->precision);
  cmd->callback([a, top_k, top_p, eos]() {
    a->top_k_given = top_k->count() > 0;
    a->top_p_given = top_p->count() > 0;
    a->eos_given = eos->count() > 0;
    run_generate(*a);
  });
}

}  // namespace qkv::cli
