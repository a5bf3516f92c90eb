// `qkv translate DIR [--beam N] [--strict] [--show-attention out.png]`: reads lines on stdin, writes one
// translation per line with the run's latest checkpoint; optionally draws the attention of each output token
// over its source.
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "commands.h"
#include "qkv/core/error.h"
#include "qkv/plot/image.h"
#include "run_common.h"

namespace qkv::cli {
namespace {

struct TranslateArgs {
  std::string dir;
  int64_t beam = 1;
  double alpha = 0.6;
  int64_t max_len = 0;
  std::string attention_png;
  bool strict = false;
};

void run_translate(const TranslateArgs& a) {
  const RunConfig c = load_run_config(a.dir, "translate");
  const data::Vocabulary vocab = data::Vocabulary::load(a.dir + "/vocab.txt");
  int64_t step = 0;
  std::unique_ptr<train::TextModel> model = load_trained_model(a.dir, c, vocab, step, "translate");
  QKV_CHECK_ARG(a.attention_png.empty() || model->has_attention(), "[translate] a '", c.model,
                "' model has no attention to show (use rnn-attn, transformer, decoder or llama)");
  std::vector<std::string> lines;
  std::string line;
  while (std::getline(std::cin, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    lines.push_back(line);
  }
  check_vocabulary(vocab, lines, a.strict, "translate");
  std::vector<std::vector<int64_t>> sources;
  for (const std::string& l : lines) sources.push_back(vocab.encode(l));
  if (sources.empty()) return;
  const DecodeSettings settings{a.max_len > 0 ? a.max_len : c.max_decode_len, a.beam, a.alpha, 64};
  const auto outputs = decode_all(*model, sources, settings);
  for (const auto& out : outputs) std::printf("%s\n", vocab.decode(out).c_str());
  flush_stdout("translate");
  if (a.attention_png.empty()) return;
  std::vector<Tensor> maps;
  const size_t shown = std::min<size_t>(sources.size(), 16);
  for (size_t i = 0; i < shown; ++i) {
    if (sources[i].empty()) continue;  // nothing to attend to
    std::vector<int64_t> toks = outputs[i];
    toks.push_back(data::Vocabulary::kEos);
    auto step_model = model->decoder({sources[i]});
    const std::vector<Tensor> att = decode::forced_attention(*step_model, {toks}, data::Vocabulary::kBos);
    if (att[0].defined()) maps.push_back(att[0].slice(1, 0, static_cast<int64_t>(sources[i].size())).contiguous());
  }
  QKV_CHECK_ARG(!maps.empty(), "[translate] no attention to draw (every input line is empty)");
  write_png(a.attention_png, heatmap_grid(maps, 16, static_cast<int>(std::min<size_t>(maps.size(), 4)), 1.0f));
  std::fprintf(stderr, "attention of %zu line(s) (rows: output tokens + EOS, columns: source tokens) -> %s\n",
               maps.size(), a.attention_png.c_str());
}

}  // namespace

void add_translate(CLI::App& app) {
  auto* cmd = app.add_subcommand("translate", "Translate stdin lines with a training run's latest checkpoint");
  auto a = std::make_shared<TranslateArgs>();
  cmd->add_option("dir", a->dir, "Run directory written by `qkv train --out`")->required();
  cmd->add_option("--beam", a->beam, "Beam size (1 = greedy)")->capture_default_str()->check(at_least(1));
  cmd->add_option("--alpha", a->alpha, "GNMT length-penalty exponent for beam search")->capture_default_str();
  cmd->add_option("--max-len", a->max_len, "Longest output (default: the run's --max-decode-len)");
  cmd->add_option("--show-attention", a->attention_png, "Write the attention heatmap of each line to this PNG");
  cmd->add_flag("--strict", a->strict,
                "Refuse input with tokens outside the run's vocabulary (default: they become <unk>, with a warning)");
  cmd->callback([a]() {
    try {
      run_translate(*a);
    } catch (const CLI::Error&) {
      throw;
    } catch (const std::exception& e) {
      throw std::runtime_error(one_line(e.what()));
    }
  });
}

}  // namespace qkv::cli
