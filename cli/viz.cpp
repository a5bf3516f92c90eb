// `qkv viz`: writes one self-contained HTML page (the viewer of web/viewer.html, no network) with the attention
// maps of every layer and head: of a BERT model folder on a sentence or a pair (--model), of a language model on a
// text and its greedy reply with a logit lens (--model FILE.gguf or a Llama-family folder), or of the article's §5
// example (`qkv viz demo`), or of a `qkv train` run on one input (--run, at its latest checkpoint or at every kept
// checkpoint with a slider).
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "commands.h"
#include "demo.h"
#include "qkv/core/error.h"
#include "qkv/core/io.h"
#include "run_common.h"
#include "viz_llm.h"
#include "viz_page.h"
#include "viz_run.h"

namespace qkv::cli {
namespace {

// Writes the page to `out` ("-": stdout). An existing file is replaced only when the viewer wrote it, so a mistyped
// --out cannot destroy a run's config.json or a checkpoint.
void write_data(const std::string& out, const json::Value& data) {
  const std::string page = viz_page(data);
  if (out == "-") {
    std::fwrite(page.data(), 1, page.size(), stdout);
    std::fflush(stdout);
    return;
  }
  QKV_CHECK_ARG(is_viewer_page_or_absent(out), "[viz] --out ", out,
                " exists and is not a viewer page; refusing to overwrite it (choose another path)");
  const std::filesystem::path parent = std::filesystem::path(out).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent);
  write_file_atomic(out, page);
  std::printf("wrote %s (%.1f kB)\n", out.c_str(), static_cast<double>(page.size()) / 1000.0);
}

void write_page(const std::string& out, const std::vector<VizSnapshot>& snapshots, const std::string& title,
                const std::string& note = "") {
  json::Value data = viz_data(snapshots, title);
  if (!note.empty()) data.set("note", note);
  write_data(out, data);
}

// Options of a language model's page.
struct LlmOptions {
  int64_t generate = 0;
  int64_t lens_positions = 32;
  int64_t lens_top = 5;
};

void run_model(const std::string& model, const std::vector<std::string>& texts, const std::string& out,
               const LlmOptions& llm) {
  if (is_language_model(model)) {
    QKV_CHECK_ARG(texts.size() == 1, "[viz] --model with a language model takes one text, got ", texts.size());
    write_data(out, llm_viz_data(model, texts[0], llm.generate, llm.lens_positions, llm.lens_top));
    return;
  }
  QKV_CHECK_ARG(llm.generate == 0, "[viz] --generate goes with a language model (a GGUF file or a Llama-family "
                "folder), not a BERT encoder");
  QKV_CHECK_ARG(!texts.empty() && texts.size() <= 2, "[viz] --model takes one sentence or two (a pair), got ",
                texts.size());
  const std::unique_ptr<models::SentenceEncoder> enc = load_viewer_encoder(model, "viz");
  const std::string* second = texts.size() == 2 ? &texts[1] : nullptr;
  std::string title = short_model_name(model) + ": \"" + texts[0] + "\"";
  if (second) title += " / \"" + *second + "\"";
  const std::string note = truncation_note(*enc, texts[0], second);
  if (!note.empty()) std::fprintf(stderr, "[viz] warning: %s\n", note.c_str());
  write_page(out, {bert_snapshot(*enc, texts[0], second)}, title, note);
}

void run_demo_page(uint64_t seed, const std::string& out) {
  const DemoAttention d = demo_attention(seed);
  const int64_t b = d.weights.size(0), t = d.weights.size(2);
  VizSnapshot s;
  for (int64_t i = 0; i < b; ++i) {
    VizGroup g;
    g.name = "sample " + std::to_string(i);
    for (int64_t k = 0; k < t; ++k) g.q_tokens.push_back("x" + std::to_string(k));
    g.k_tokens = g.q_tokens;
    g.layers.push_back(d.weights.select(0, i).contiguous());  // one layer of H = 4 heads
    s.groups.push_back(std::move(g));
  }
  write_page(out, {s}, "the article's multi-head self-attention example (B = 2, T = 10, E = 64, H = 4, seed " +
                           std::to_string(seed) + ")");
}

void run_run(const std::string& run_dir, const std::string& input, bool all_checkpoints, bool strict,
             const std::string& out) {
  RunViewer viewer(run_dir, "viz");
  check_vocabulary(viewer.vocab(), {input}, strict, "viz");  // characters the run never saw become <unk>: say so
  write_page(out, viewer.snapshots(input, all_checkpoints), viewer.title(input));
}

}  // namespace

void add_viz(CLI::App& app) {
  auto* cmd = app.add_subcommand("viz", "Write one self-contained HTML page with every attention map (no network)");
  auto model = std::make_shared<std::string>();
  auto texts = std::make_shared<std::vector<std::string>>();
  auto out = std::make_shared<std::string>("attention.html");
  auto seed = std::make_shared<uint64_t>(0);
  auto run = std::make_shared<std::string>();
  auto input = std::make_shared<std::string>();
  auto checkpoints = std::make_shared<std::string>("latest");
  auto strict = std::make_shared<bool>(false);
  cmd->add_option("--run", *run, "A `qkv train --out` directory (rnn-attn, transformer, decoder)");
  cmd->add_option("--input", *input, "With --run: the source text");
  cmd->add_option("--checkpoints", *checkpoints, "With --run: 'latest' or 'all' (a slider over the kept ones)")
      ->check(CLI::IsMember({"latest", "all"}))
      ->capture_default_str();
  cmd->add_flag("--strict", *strict, "With --run: refuse an input with characters outside the run's vocabulary "
                                     "(without it they become <unk>, named on stderr)");
  cmd->add_option("--model", *model, "sentence-transformers BERT folder (e.g. all-MiniLM-L6-v2), or a language "
                                     "model: a GGUF file or a Llama / Mistral / Qwen 2 / Gemma 2 folder");
  auto llm = std::make_shared<LlmOptions>();
  cmd->add_option("--generate", llm->generate, "With a language model: also draw a greedy reply of up to N tokens")
      ->capture_default_str();
  cmd->add_option("--lens-positions", llm->lens_positions,
                  "With a language model: the logit lens at the last N positions")->capture_default_str();
  cmd->add_option("--lens-top", llm->lens_top, "With a language model: the logit lens's top tokens per layer")
      ->capture_default_str();
  cmd->add_option("--out", *out, "The HTML page to write (-: stdout)")->capture_default_str();
  cmd->add_option("texts", *texts, "With --model: a sentence, or two for a sentence pair");
  auto* demo = cmd->add_subcommand("demo", "The article's §5 example: 2 samples x 4 heads over 10 tokens");
  demo->add_option("--out", *out, "The HTML page to write (-: stdout)")->capture_default_str();
  demo->add_option("--seed", *seed, "Seed of the random weights and input")->capture_default_str()->check(seed_value());
  demo->callback([=]() { run_demo_page(*seed, *out); });
  cmd->callback([=, cmd_ptr = cmd]() {
    if (cmd_ptr->got_subcommand("demo")) return;
    if (!run->empty()) {
      QKV_CHECK_ARG(model->empty() && texts->empty(), "[viz] --run takes --input, not --model or sentences");
      try {
        run_run(*run, *input, *checkpoints == "all", *strict, *out);
      } catch (const std::exception& e) {
        throw std::runtime_error(one_line(e.what()));
      }
      return;
    }
    if (model->empty())
      throw CLI::ValidationError("viz", "give --model DIR \"sentence\", --run DIR --input TEXT, or `demo`");
    run_model(*model, *texts, *out, *llm);
  });
}

}  // namespace qkv::cli
