// `qkv embed --model DIR [--json] [TEXT ...]`: sentence embeddings of the texts (or of each stdin line) with a
// sentence-transformers BERT folder such as all-MiniLM-L6-v2; one line of numbers per text, or JSON.
#include <cstdio>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "commands.h"
#include "qkv/core/json.h"
#include "run_common.h"
#include "qkv/models/bert.h"

namespace qkv::cli {
namespace {

// A JSON string literal: quotes, backslashes and control characters escaped, UTF-8 kept as is.
void put_json_string(const std::string& s) {
  std::string out;
  json::append_quoted(out, s);
  std::fputs(out.c_str(), stdout);
}

std::vector<std::string> stdin_lines() {
  std::vector<std::string> lines;
  std::string line;
  while (std::getline(std::cin, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    lines.push_back(line);
  }
  return lines;
}

int run_embed(const std::string& model, std::vector<std::string> texts, bool json, int64_t batch_size,
              const std::string& precision) {
  const models::SentenceEncoder enc(model, parse_precision(precision));  // first, so that a broken folder fails before stdin is read
  if (texts.empty()) texts = stdin_lines();
  const Tensor e = enc.encode(texts, batch_size);
  const int64_t n = e.size(0), d = e.size(1);
  const float* p = e.data();
  if (json) std::fputs("[\n", stdout);
  for (int64_t i = 0; i < n; ++i) {
    if (json) {
      std::fputs("  {\"text\": ", stdout);
      put_json_string(texts[static_cast<size_t>(i)]);
      std::fputs(", \"embedding\": [", stdout);
    }
    for (int64_t j = 0; j < d; ++j) std::printf("%s%.9g", j ? (json ? ", " : " ") : "", p[i * d + j]);
    if (json) std::fputs(i + 1 < n ? "]},\n" : "]}\n", stdout);
    else std::fputs("\n", stdout);
  }
  if (json) std::fputs("]\n", stdout);
  flush_stdout("embed");
  return 0;
}

}  // namespace

void add_embed(CLI::App& app) {
  auto* cmd = app.add_subcommand("embed", "Sentence embeddings with a BERT model folder (e.g. all-MiniLM-L6-v2)");
  auto model = std::make_shared<std::string>();
  auto texts = std::make_shared<std::vector<std::string>>();
  auto json = std::make_shared<bool>(false);
  auto batch = std::make_shared<int64_t>(32);
  auto precision = std::make_shared<std::string>();
  cmd->add_option("--model", *model, "sentence-transformers folder (config.json, vocab.txt, model.safetensors)")
      ->required();
  cmd->add_flag("--json", *json, "Print a JSON array of {\"text\", \"embedding\"} instead of one line per text");
  cmd->add_option("--batch-size", *batch, "Texts per forward pass")->capture_default_str()->check(at_least(1));
  cmd->add_option("texts", *texts, "Texts to embed; without any, each line of stdin is one text");
  add_precision_option(cmd, *precision);
  cmd->callback([=]() {
    run_embed(*model, *texts, *json, *batch, *precision);
  });
}

}  // namespace qkv::cli
