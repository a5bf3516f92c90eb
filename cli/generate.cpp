// `qkv generate --model PATH --prompt TEXT [--chat] [--system TEXT] [--print-ids]` or `--prompt-ids 5,17,42`,
// with [--max-new-tokens 64] [--temperature T --top-k K --top-p P --seed S] [--beam N] [--eos ID] [--page-size N]:
// continues a prompt with a Llama / Mistral / Qwen 2 / Gemma 2 model (a .gguf file or a folder written by
// transformers' save_pretrained). --prompt: the reply streamed as text (stopping at the model's end-of-generation
// tokens); --prompt-ids: the new token ids on one line, comma-separated. Greedy by default.
#include <cstdio>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <unistd.h>

#include "commands.h"
#include "lm_common.h"
#include "run_common.h"
#include "qkv/core/error.h"
#include "qkv/core/json.h"
#include "qkv/decode/cached_step.h"
#include "qkv/decode/generate.h"
#include "qkv/decode/sampling.h"
#include "qkv/decode/search.h"
#include "qkv/models/language_model.h"
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
  std::string model, prompt, precision, kv_cache;
  std::string text, system;  // --prompt, --system
  int64_t max_new_tokens = 64, beam = 0, eos = -1, page_size = 0, ctx = 0;
  decode::SamplingOptions sampling;
  bool chat = false, print_ids = false;
  bool text_given = false, eos_given = false, top_k_given = false, top_p_given = false;
};

// Half of the machine's physical memory: the most a beam search may plan to take.
int64_t beam_memory_limit() {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || page <= 0) return 0;
  return static_cast<int64_t>(static_cast<double>(pages) * static_cast<double>(page) / 2);
}

// --prompt TEXT: the model's tokenizer, chat template and stop ids; the reply streamed as text (or ids).
void run_generate_text(const GenerateArgs& a, std::optional<Precision> precision) {
  QKV_CHECK_ARG(a.beam == 0, "[generate] --beam takes --prompt-ids; with --prompt the search is greedy or sampled");
  const models::LanguageModel lm = models::LanguageModel::load(a.model, precision);
  const int64_t vocab = lm.model->config().vocab_size;
  QKV_CHECK_ARG(a.eos >= -1 && a.eos < vocab, "[generate] --eos ", a.eos, " is not a token id of this model (in [0, ",
                vocab, ")) nor -1 (never)");
  std::vector<int64_t> prompt;
  if (a.chat) {
    json::Value messages = json::Value::array();
    if (!a.system.empty()) messages.push(json::Value::object().set("role", "system").set("content", a.system));
    messages.push(json::Value::object().set("role", "user").set("content", a.text));
    prompt = lm.encode_chat(messages, /*add_generation_prompt=*/true);
  } else {
    prompt = lm.tokenizer->encode(a.text, /*add_special_tokens=*/true);
  }
  QKV_CHECK_ARG(!prompt.empty(), "[generate] --prompt '", a.text, "' encodes to no token; give some text");
  decode::GenerateOptions o;
  o.max_new_tokens = a.max_new_tokens;
  o.sampling = a.sampling;
  o.page_size = a.page_size;
  o.kv_cache = kv_cache_precision(a.kv_cache);
  if (!a.eos_given) {
    o.stop_ids = lm.stop_ids;
  } else if (a.eos >= 0) {
    o.stop_ids = {a.eos};
  }
  const int64_t context = context_of(lm, a.ctx);
  const Reply reply = stream_reply(lm, prompt, o, context, a.print_ids, "generate");
  std::printf("\n");
  flush_stdout("generate");
  if (reply.generation.finish == decode::FinishReason::kContext)
    std::fprintf(stderr, "qkv: warning: [generate] the reply was cut at the end of the context (%lld positions)\n",
                 static_cast<long long>(context));
}

void run_generate(const GenerateArgs& a) {
  const std::optional<Precision> precision = parse_model_precision(a.precision);
  check_sampling_given(a.sampling, a.top_k_given, a.top_p_given, "generate");
  if (a.text_given) return run_generate_text(a, precision);
  const std::vector<int64_t> prompt = parse_ids(a.prompt);
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
    // the prompt but its last token runs at once; the search feeds that token first
    decode::CachedStep step = decode::cached_step(*model, {{prompt.begin(), prompt.end() - 1}}, a.page_size,
                                                  kv_cache_precision(a.kv_cache));
    decode::SearchOptions o;
    o.max_len = a.max_new_tokens;
    o.bos = prompt.back();
    o.eos = a.eos_given ? a.eos : model->config().eos_token_id;  // -1: never
    decode::BeamOptions b;
    b.beam_size = a.beam;
    b.max_bytes = beam_memory_limit();
    if (a.max_new_tokens > 0) out = decode::beam_search(step, o, b).at(0).at(0).tokens;
  } else {
    decode::GenerateOptions o;
    o.max_new_tokens = a.max_new_tokens;
    o.sampling = a.sampling;
    if (a.eos >= 0) o.stop_ids = {a.eos};
    o.page_size = a.page_size;
    o.kv_cache = kv_cache_precision(a.kv_cache);
    decode::Generation g = decode::generate(*model, prompt, o);
    if (g.finish == decode::FinishReason::kStop) g.tokens.push_back(g.stop_id);  // --prompt-ids prints the eos
    out = std::move(g.tokens);
  }
  std::string line;
  for (size_t i = 0; i < out.size(); ++i) line += (i ? "," : "") + std::to_string(out[i]);
  std::printf("%s\n", line.c_str());
  flush_stdout("generate");
}

}  // namespace

void add_generate(CLI::App& app) {
  auto* cmd = app.add_subcommand("generate", "Continue a prompt with a Llama / Mistral / Qwen 2 / Gemma 2 model");
  auto a = std::make_shared<GenerateArgs>();
  cmd->add_option("--model", a->model,
                  "A .gguf file, or transformers' save_pretrained folder (config.json, model.safetensors, "
                  "tokenizer.json)")
      ->required();
  CLI::Option* text = cmd->add_option("--prompt", a->text,
                                      "Prompt text: the reply is printed as text as it comes, and ends at the "
                                      "model's end-of-generation tokens");
  CLI::Option* ids = cmd->add_option("--prompt-ids", a->prompt,
                                     "Prompt token ids, comma-separated (e.g. 5,17,42): prints the new ids");
  text->excludes(ids);
  CLI::Option* chat = cmd->add_flag("--chat", a->chat,
                                    "With --prompt: the prompt is a user message in the model's chat template, and "
                                    "the reply the assistant's")
                          ->needs(text);
  cmd->add_option("--system", a->system, "With --chat: a system message before the prompt")->needs(chat);
  cmd->add_flag("--print-ids", a->print_ids, "With --prompt: print the new token ids instead of the text")
      ->needs(text);
  cmd->add_option("--max-new-tokens", a->max_new_tokens, "Tokens to generate")
      ->capture_default_str()
      ->check(at_least(0));
  const SamplingFlags sampling = add_sampling_options(cmd, a->sampling);
  cmd->add_option("--beam", a->beam,
                  "Beam search with this many beams (0: off; at most the vocabulary, and half of the memory)")
      ->capture_default_str()
      ->check(at_least(0));
  CLI::Option* eos = cmd->add_option("--eos", a->eos,
                                     "Stop after this token (-1: never); without --eos, --prompt stops at the "
                                     "model's end-of-generation tokens, --prompt-ids with greedy and sampling never "
                                     "stops early and --beam stops at the config's eos_token_id")
                         ->capture_default_str()
                         ->check(at_least(-1));
  cmd->add_option("--page-size", a->page_size,
                  "KV cache in pages of this many positions, read in place by the attention (0: contiguous)")
      ->capture_default_str()
      ->check(at_least(0));
  add_kv_cache_option(cmd, a->kv_cache);
  add_model_precision_option(cmd, a->precision);
  add_ctx_option(cmd, a->ctx);
  cmd->callback([a, sampling, text, ids, eos]() {
    QKV_CHECK_ARG(text->count() > 0 || ids->count() > 0,
                  "[generate] give the prompt: --prompt TEXT, or --prompt-ids 5,17,42");
    a->text_given = text->count() > 0;
    a->top_k_given = sampling.top_k->count() > 0;
    a->top_p_given = sampling.top_p->count() > 0;
    a->eos_given = eos->count() > 0;
    run_generate(*a);
  });
}

}  // namespace qkv::cli
