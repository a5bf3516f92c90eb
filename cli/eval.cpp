// `qkv eval DIR [--json]`: scores the latest checkpoint of a training run on its test split (greedy or beam):
// exact match and token accuracy, as text or as one JSON object.
#include <cstdio>
#include <memory>
#include <string>

#include "commands.h"
#include "qkv/core/error.h"
#include "qkv/core/json.h"
#include "run_common.h"
#include "run_data.h"

namespace qkv::cli {
namespace {

struct EvalArgs {
  std::string dir;
  bool json = false;
  std::string split = "test";
  int64_t beam = 1;
  double alpha = 0.6;
  int64_t limit = 0;
};

void run_eval(const EvalArgs& a) {
  RunConfig c = load_run_config(a.dir, "eval");
  const data::Vocabulary vocab = data::Vocabulary::load(a.dir + "/vocab.txt");
  const RunData d = load_run_data(c, &vocab);
  const auto& examples = a.split == "train" ? d.train : d.test;
  QKV_CHECK_ARG(!examples.empty(), "[eval] the run's ", a.split, " split is empty");
  int64_t step = 0;
  std::unique_ptr<train::TextModel> model = load_trained_model(a.dir, c, vocab, step, "eval");
  const EvalResult r = evaluate(*model, examples, a.limit, DecodeSettings{c.max_decode_len, a.beam, a.alpha, 64});
  if (a.json) {
    std::string out = "{\"exact_match\": ";
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.6f", r.exact_match);
    out += buf;
    std::snprintf(buf, sizeof buf, "%.6f", r.token_accuracy);
    out += std::string(", \"token_accuracy\": ") + buf;
    out += ", \"examples\": " + std::to_string(r.examples) + ", \"tokens\": " + std::to_string(r.tokens);
    out += ", \"step\": " + std::to_string(step) + ", \"split\": ";
    json::append_quoted(out, a.split);
    out += ", \"model\": ";
    json::append_quoted(out, c.model);
    out += ", \"beam\": " + std::to_string(a.beam) + "}";
    std::printf("%s\n", out.c_str());
  } else {
    std::printf("%s step %lld, %s split (%lld examples, %s): exact_match %.4f token_accuracy %.4f\n", c.model.c_str(),
                static_cast<long long>(step), a.split.c_str(), static_cast<long long>(r.examples),
                a.beam == 1 ? "greedy" : ("beam " + std::to_string(a.beam)).c_str(), r.exact_match,
                r.token_accuracy);
  }
}

}  // namespace

void add_eval(CLI::App& app) {
  auto* cmd = app.add_subcommand("eval", "Score a training run's latest checkpoint on its test split");
  auto a = std::make_shared<EvalArgs>();
  cmd->add_option("dir", a->dir, "Run directory written by `qkv train --out`")->required();
  cmd->add_flag("--json", a->json, "Print one JSON object with exact_match and token_accuracy");
  cmd->add_option("--split", a->split, "test | train")->capture_default_str()->check(CLI::IsMember({"test", "train"}));
  cmd->add_option("--beam", a->beam, "Beam size (1 = greedy)")->capture_default_str()->check(at_least(1));
  cmd->add_option("--alpha", a->alpha, "GNMT length-penalty exponent for beam search")->capture_default_str();
  cmd->add_option("--limit", a->limit, "Score only the first N examples (0 = all)")->capture_default_str();
  cmd->callback([a]() {
    try {
      run_eval(*a);
    } catch (const CLI::Error&) {
      throw;
    } catch (const std::exception& e) {
      throw std::runtime_error(one_line(e.what()));
    }
  });
}

}  // namespace qkv::cli
