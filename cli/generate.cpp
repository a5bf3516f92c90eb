// `qkv generate --model DIR --prompt-ids 5,17,42 [--max-new-tokens 64] [--temperature T --top-k K --top-p P
// --seed S] [--beam N] [--eos ID] [--page-size N]`: continues a prompt with a Llama / Mistral / Gemma 2 folder written by
// transformers' save_pretrained and prints the new token ids on one line, comma-separated. Greedy by default.
#include <cstdio>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

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
};

void run_generate(const GenerateArgs& a) {
  const Precision precision = parse_precision(a.precision);
  const std::vector<int64_t> prompt = parse_ids(a.prompt);
  const std::unique_ptr<models::LlamaForCausalLM> model =
      models::LlamaForCausalLM::from_pretrained(a.model, precision);
  std::vector<int64_t> out;
  if (a.beam > 0) {
    QKV_CHECK_ARG(a.sampling.temperature == 0.0f, "[generate] --beam searches; it does not sample (--temperature)");
    const int64_t eos = a.eos >= 0 ? a.eos : model->config().eos_token_id;
    QKV_CHECK_ARG(eos >= 0, "[generate] --beam needs an end token: the config has no eos_token_id; pass --eos");
    decode::CausalLmStep step(*model, {prompt}, a.page_size);
    decode::SearchOptions o;
    o.max_len = a.max_new_tokens;
    o.bos = prompt.back();
    o.eos = eos;
    decode::BeamOptions b;
    b.beam_size = a.beam;
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
  cmd->add_option("--temperature", a->sampling.temperature, "0: greedy; > 0: sample softmax(logits / T)")
      ->capture_default_str();
  cmd->add_option("--top-k", a->sampling.top_k, "Sample among the k most likely tokens (0: all)")
      ->capture_default_str()
      ->check(at_least(0));
  cmd->add_option("--top-p", a->sampling.top_p, "Sample within the smallest set of probability >= p")
      ->capture_default_str();
  cmd->add_option("--seed", a->sampling.seed, "Seed of the sampling stream")->capture_default_str();
  cmd->add_option("--beam", a->beam, "Beam search with this many beams (0: off); stops at the end token")
      ->capture_default_str()
      ->check(at_least(0));
  cmd->add_option("--eos", a->eos, "Stop after this token (-1: never; --beam defaults to the config's)")
      ->capture_default_str();
  cmd->add_option("--page-size", a->page_size,
                  "KV cache in pages of this many positions, read in place by the attention (0: contiguous)")
      ->capture_default_str()
      ->check(at_least(0));
  add_precision_option(cmd, a->precision);
  cmd->callback([a]() { run_generate(*a); });
}

}  // namespace qkv::cli
