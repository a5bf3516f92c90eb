// `qkv viz`: writes one self-contained HTML page (the viewer of web/viewer.html, no network) with the attention
// maps of every layer and head: of a BERT model folder on a sentence or a pair (--model), or of the article's §5
// example (`qkv viz demo`), or of a `qkv train` run on one input (--run, at its latest checkpoint or at every kept
// checkpoint with a slider).
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "commands.h"
#include "demo.h"
#include "qkv/core/error.h"
#include "qkv/core/io.h"
#include "qkv/decode/search.h"
#include "checkpoint.h"
#include "run_common.h"
#include "viz_page.h"

namespace qkv::cli {
namespace {

void write_page(const std::string& out, const std::vector<VizSnapshot>& snapshots, const std::string& title) {
  const std::string page = viz_page(viz_data(snapshots, title));
  const std::filesystem::path parent = std::filesystem::path(out).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent);
  write_file_atomic(out, page);
  std::printf("wrote %s (%.1f kB)\n", out.c_str(), static_cast<double>(page.size()) / 1000.0);
}

void run_model(const std::string& model, const std::vector<std::string>& texts, const std::string& out) {
  QKV_CHECK_ARG(!texts.empty() && texts.size() <= 2, "[viz] --model takes one sentence or two (a pair), got ",
                texts.size());
  const models::SentenceEncoder enc(model);
  const std::string* second = texts.size() == 2 ? &texts[1] : nullptr;
  std::string title = short_model_name(model) + ": \"" + texts[0] + "\"";
  if (second) title += " / \"" + *second + "\"";
  write_page(out, {bert_snapshot(enc, texts[0], second)}, title);
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

// Kept checkpoints of a run, oldest first: RUN/checkpoints/step-N holding trainer.json.
std::vector<std::string> run_checkpoints(const std::string& run_dir) {
  namespace fs = std::filesystem;
  std::vector<std::pair<int64_t, std::string>> found;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(fs::path(run_dir) / "checkpoints", ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("step-", 0) != 0 || !fs::exists(e.path() / "trainer.json")) continue;
    try {
      found.emplace_back(std::stoll(name.substr(5)), e.path().string());
    } catch (const std::exception&) {
    }
  }
  std::sort(found.begin(), found.end());
  std::vector<std::string> out;
  for (auto& f : found) out.push_back(f.second);
  return out;
}

// The attention of the run's model over `input` while it emits `output` (teacher-forced): one (Tout + 1, Tk) map.
Tensor run_attention(RunModel& model, const std::vector<int64_t>& source, const std::vector<int64_t>& output) {
  std::vector<int64_t> toks = output;
  toks.push_back(data::Vocabulary::kEos);
  auto step_model = model.decoder({source});
  const std::vector<Tensor> att = decode::forced_attention(*step_model, {toks}, data::Vocabulary::kBos);
  QKV_CHECK_ARG(att[0].defined(), "[viz] the model reported no attention");
  return att[0].contiguous();
}

void run_run(const std::string& run_dir, const std::string& input, bool all_checkpoints, const std::string& out) {
  const RunConfig c = load_run_config(run_dir, "viz");
  const data::Vocabulary vocab = data::Vocabulary::load(run_dir + "/vocab.txt");
  int64_t step = 0;
  std::unique_ptr<RunModel> latest = load_trained_model(run_dir, c, vocab, step, "viz");
  QKV_CHECK_ARG(latest->has_attention(), "[viz] a '", c.model,
                "' model has no attention to show (use rnn-attn, transformer or decoder)");
  const std::vector<int64_t> source = vocab.encode(input);
  QKV_CHECK_ARG(!source.empty(), "[viz] --input is empty after tokenization");
  // Every checkpoint is shown emitting the latest checkpoint's output, so that all maps share their axes.
  const std::vector<int64_t> output =
      decode_all(*latest, {source}, DecodeSettings{c.max_decode_len, 1, 0.6, 1}).at(0);
  std::vector<std::string> q = vocab.tokens_of(output);
  q.push_back("<eos>");
  std::vector<std::string> k = vocab.tokens_of(source);

  auto snapshot = [&](RunModel& m, const std::string& label) {
    Tensor att = run_attention(m, source, output);
    const auto tk = att.size(1);
    std::vector<std::string> keys = k;
    for (int64_t j = static_cast<int64_t>(keys.size()); j < tk; ++j)
      keys.push_back(j == static_cast<int64_t>(k.size()) && tk == j + 1 ? "<eos>" : "#" + std::to_string(j));
    keys.resize(static_cast<size_t>(tk));
    VizGroup g;
    g.name = c.model + " attention (target x source)";
    g.cross = true;
    g.q_tokens = q;
    g.k_tokens = keys;
    g.layers.push_back(att.unsqueeze(0));  // one layer, one head
    VizSnapshot s;
    s.label = label;
    s.groups.push_back(std::move(g));
    return s;
  };
  std::vector<VizSnapshot> snaps;
  if (all_checkpoints) {
    for (const std::string& path : run_checkpoints(run_dir)) {
      LoadedCheckpoint loaded = load_checkpoint(path, c.model);
      Rng rng(c.seed);
      std::unique_ptr<RunModel> m = make_run_model(c, vocab.size(), rng);
      m->module().load_state_dict(loaded.weights, true);
      snaps.push_back(snapshot(*m, "step " + std::to_string(loaded.state.step)));
    }
  } else {
    snaps.push_back(snapshot(*latest, "step " + std::to_string(step)));
  }
  write_page(out, snaps, run_dir + " (" + c.model + "): \"" + input + "\"");
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
  cmd->add_option("--run", *run, "A `qkv train --out` directory (rnn-attn, transformer, decoder)");
  cmd->add_option("--input", *input, "With --run: the source text");
  cmd->add_option("--checkpoints", *checkpoints, "With --run: 'latest' or 'all' (a slider over the kept ones)")
      ->check(CLI::IsMember({"latest", "all"}))
      ->capture_default_str();
  cmd->add_option("--model", *model, "sentence-transformers BERT folder (e.g. all-MiniLM-L6-v2)");
  cmd->add_option("--out", *out, "The HTML page to write")->capture_default_str();
  cmd->add_option("texts", *texts, "With --model: a sentence, or two for a sentence pair");
  auto* demo = cmd->add_subcommand("demo", "The article's §5 example: 2 samples x 4 heads over 10 tokens");
  demo->add_option("--out", *out, "The HTML page to write")->capture_default_str();
  demo->add_option("--seed", *seed, "Seed of the random weights and input")->capture_default_str();
  demo->callback([=]() { run_demo_page(*seed, *out); });
  cmd->callback([=, cmd_ptr = cmd]() {
    if (cmd_ptr->got_subcommand("demo")) return;
    if (!run->empty()) {
      QKV_CHECK_ARG(model->empty() && texts->empty(), "[viz] --run takes --input, not --model or sentences");
      try {
        run_run(*run, *input, *checkpoints == "all", *out);
      } catch (const std::exception& e) {
        throw std::runtime_error(one_line(e.what()));
      }
      return;
    }
    if (model->empty())
      throw CLI::ValidationError("viz", "give --model DIR \"sentence\", --run DIR --input TEXT, or `demo`");
    run_model(*model, *texts, *out);
  });
}

}  // namespace qkv::cli
