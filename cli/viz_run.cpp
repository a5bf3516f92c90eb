// RunViewer: a training run's attention maps for the viewer (see viz_run.h).
#include "viz_run.h"

#include <algorithm>
#include <filesystem>
#include <utility>

#include "checkpoint.h"
#include "qkv/core/error.h"
#include "qkv/decode/search.h"
#include "run_common.h"

namespace qkv::cli {
namespace {

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

// The attention of the run's model over `source` while it emits `output` (teacher-forced): one (Tout + 1, Tk) map.
Tensor run_attention(train::TextModel& model, const std::vector<int64_t>& source, const std::vector<int64_t>& output,
                     const std::string& op) {
  std::vector<int64_t> toks = output;
  toks.push_back(data::Vocabulary::kEos);
  auto step_model = model.decoder({source});
  const std::vector<Tensor> att = decode::forced_attention(*step_model, {toks}, data::Vocabulary::kBos);
  QKV_CHECK_ARG(att[0].defined(), "[", op, "] the model reported no attention");
  return att[0].contiguous();
}

}  // namespace

RunViewer::RunViewer(const std::string& run_dir, const char* op)
    : run_dir_(run_dir), op_(op), config_(load_run_config(run_dir, op)),
      vocab_(data::Vocabulary::load(run_dir + "/vocab.txt")) {
  latest_ = load_trained_model(run_dir, config_, vocab_, step_, op);
  QKV_CHECK_ARG(latest_->has_attention(), "[", op, "] a '", config_.model,
                "' model has no attention to show (use rnn-attn, transformer, decoder or llama)");
}

RunViewer::~RunViewer() = default;

int64_t RunViewer::source_length(const std::string& input) const {
  return static_cast<int64_t>(vocab_.encode(input).size());
}

std::string RunViewer::title(const std::string& input) const {
  return std::filesystem::path(run_dir_).lexically_normal().filename().string() + " (" + config_.model + "): \"" +
         input + "\"";
}

std::vector<VizSnapshot> RunViewer::snapshots(const std::string& input, bool all_checkpoints) {
  const std::vector<int64_t> source = vocab_.encode(input);
  QKV_CHECK_ARG(!source.empty(), "[", op_, "] the input is empty after tokenization");
  // Every checkpoint is shown emitting the latest checkpoint's output, so that all maps share their axes.
  const std::vector<int64_t> output =
      decode_all(*latest_, {source}, DecodeSettings{config_.max_decode_len, 1, 0.6, 1}).at(0);
  std::vector<std::string> q = vocab_.tokens_of(output);
  q.push_back("<eos>");
  const std::vector<std::string> k = vocab_.tokens_of(source);

  auto snapshot = [&](train::TextModel& m, const std::string& label) {
    const Tensor att = run_attention(m, source, output, op_);
    const int64_t tk = att.size(1), ts = static_cast<int64_t>(k.size());
    std::vector<std::string> keys = k;
    for (int64_t j = ts; j < tk; ++j) keys.push_back(j == ts && tk == ts + 1 ? "<eos>" : "#" + std::to_string(j));
    keys.resize(static_cast<size_t>(tk));
    VizGroup g;
    g.name = config_.model + " attention (target x source)";
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
  if (!all_checkpoints) {
    snaps.push_back(snapshot(*latest_, "step " + std::to_string(step_)));
    return snaps;
  }
  for (const std::string& path : run_checkpoints(run_dir_)) {
    LoadedCheckpoint loaded = load_checkpoint(path, config_.model);
    Rng rng(config_.seed);
    std::unique_ptr<train::TextModel> m = make_run_model(config_, vocab_.size(), rng);
    m->module().load_state_dict(loaded.weights, true);
    snaps.push_back(snapshot(*m, "step " + std::to_string(loaded.state.step)));
  }
  return snaps;
}

}  // namespace qkv::cli
