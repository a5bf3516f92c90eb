// Checkpoint directories: temporary directory + fsync + rename for atomicity, pruning of old ones after the new
// one is durable, and strict loading (model kind recorded in the weights' metadata).
#include "checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "qkv/core/error.h"
#include "qkv/core/io.h"
#include "qkv/core/safetensors.h"
#include "run_config.h"

namespace qkv::cli {
namespace fs = std::filesystem;
namespace {

const char* const kPrefix = "step-";

std::string step_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step-%08lld", static_cast<long long>(step));
  return buf;
}

// step of "step-NNNNNNNN", or -1.
int64_t parse_step(const std::string& name) {
  if (name.rfind(kPrefix, 0) != 0 || name.size() <= 5) return -1;
  int64_t v = 0;
  for (size_t i = 5; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return -1;
    v = v * 10 + (name[i] - '0');
  }
  return v;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  QKV_CHECK_RUNTIME(in.good(), "[checkpoint] cannot open '", path, "'");
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string state_json(const TrainerState& s) {
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "{\n  \"format\": \"qkv-trainer-state 1\",\n  \"step\": %lld,\n  \"epoch\": %lld,\n"
                "  \"position\": %lld,\n  \"dropout_rng_state\": \"%llu\",\n  \"last_loss\": %.17g,\n"
                "  \"elapsed_s\": %.17g\n}\n",
                static_cast<long long>(s.step), static_cast<long long>(s.epoch), static_cast<long long>(s.position),
                static_cast<unsigned long long>(s.dropout_rng_state), s.last_loss, s.elapsed_s);
  return buf;
}

TrainerState parse_state(const std::string& text, const std::string& name) {
  auto kv = parse_flat_json(text, name);
  QKV_CHECK_ARG(kv["format"] == "qkv-trainer-state 1", "[checkpoint] ", name, ": not a qkv trainer state");
  TrainerState s;
  try {
    s.step = std::stoll(kv.at("step"));
    s.epoch = std::stoll(kv.at("epoch"));
    s.position = std::stoll(kv.at("position"));
    s.dropout_rng_state = std::stoull(kv.at("dropout_rng_state"));
    s.last_loss = std::stod(kv.at("last_loss"));
    s.elapsed_s = std::stod(kv.at("elapsed_s"));
  } catch (const std::exception&) {
    throw std::invalid_argument("[checkpoint] " + name + ": missing or bad trainer state fields");
  }
  return s;
}

}  // namespace

void fsync_directory(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  QKV_CHECK_RUNTIME(fd >= 0, "[checkpoint] cannot open directory '", dir, "'");
  const int rc = ::fsync(fd);
  ::close(fd);
  QKV_CHECK_RUNTIME(rc == 0, "[checkpoint] cannot fsync directory '", dir, "'");
}

std::string save_checkpoint(const std::string& run_dir, const std::string& model_kind, const nn::StateDict& weights,
                            const nn::StateDict& optimizer, const TrainerState& state, int64_t keep) {
  QKV_CHECK_ARG(keep >= 1, "[checkpoint] keep must be >= 1, got ", keep);
  const fs::path root = fs::path(run_dir) / "checkpoints";
  std::error_code ec;
  fs::create_directories(root, ec);
  QKV_CHECK_RUNTIME(!ec, "[checkpoint] cannot create '", root.string(), "': ", ec.message());
  const std::string name = step_name(state.step);
  const fs::path final_dir = root / name;
  const fs::path tmp = root / (".tmp-" + name + "-" + std::to_string(::getpid()));
  fs::remove_all(tmp, ec);
  fs::create_directory(tmp, ec);
  QKV_CHECK_RUNTIME(!ec, "[checkpoint] cannot create '", tmp.string(), "': ", ec.message());
  const std::map<std::string, std::string> meta = {{"qkv_model", model_kind},
                                                    {"step", std::to_string(state.step)}};
  save_safetensors((tmp / "model.safetensors").string(), weights, meta);
  save_safetensors((tmp / "optimizer.safetensors").string(), optimizer, meta);
  write_file_atomic((tmp / "trainer.json").string(), state_json(state));
  fsync_directory(tmp.string());
  if (fs::exists(final_dir)) {  // a rerun of the same step (resumed run): replace it
    const fs::path old = root / (".old-" + name + "-" + std::to_string(::getpid()));
    fs::rename(final_dir, old, ec);
    QKV_CHECK_RUNTIME(!ec, "[checkpoint] cannot move '", final_dir.string(), "' aside: ", ec.message());
    fs::rename(tmp, final_dir, ec);
    QKV_CHECK_RUNTIME(!ec, "[checkpoint] cannot rename '", tmp.string(), "': ", ec.message());
    fsync_directory(root.string());
    fs::remove_all(old, ec);
  } else {
    fs::rename(tmp, final_dir, ec);
    QKV_CHECK_RUNTIME(!ec, "[checkpoint] cannot rename '", tmp.string(), "': ", ec.message());
    fsync_directory(root.string());
  }
  // Prune: older complete checkpoints beyond `keep`, and leftovers of killed runs (.tmp-*, .old-*).
  std::vector<fs::path> entries;
  for (const auto& e : fs::directory_iterator(root, ec)) entries.push_back(e.path());
  std::vector<std::pair<int64_t, fs::path>> found;
  for (const fs::path& p : entries) {
    const std::string n = p.filename().string();
    const int64_t s = parse_step(n);
    if (s >= 0) found.emplace_back(s, p);
    else if (n.rfind(".tmp-", 0) == 0 || n.rfind(".old-", 0) == 0) fs::remove_all(p, ec);
  }
  std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  for (size_t i = static_cast<size_t>(keep); i < found.size(); ++i) {
    // Move aside first so that a kill during the deletion never leaves a partial "step-*" directory.
    const fs::path trash = root / (".old-" + found[i].second.filename().string());
    fs::rename(found[i].second, trash, ec);
    if (!ec) fs::remove_all(trash, ec);
  }
  return final_dir.string();
}

std::string latest_checkpoint(const std::string& run_dir) {
  const fs::path root = fs::path(run_dir) / "checkpoints";
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return "";
  int64_t best = -1;
  fs::path best_path;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    const int64_t s = parse_step(e.path().filename().string());
    if (s > best && fs::exists(e.path() / "trainer.json")) {
      best = s;
      best_path = e.path();
    }
  }
  return best < 0 ? "" : best_path.string();
}

LoadedCheckpoint load_checkpoint(const std::string& path, const std::string& model_kind) {
  LoadedCheckpoint c;
  c.path = path;
  SafeTensorsFile w = load_safetensors((fs::path(path) / "model.safetensors").string());
  const auto kind = w.metadata.find("qkv_model");
  QKV_CHECK_ARG(kind != w.metadata.end(), "[checkpoint] ", path, " has no model kind in its weights' metadata");
  QKV_CHECK_ARG(kind->second == model_kind, "[checkpoint] ", path, " holds a '", kind->second, "' model, not '",
                model_kind, "'");
  c.weights = std::move(w.tensors);
  c.optimizer = load_safetensors((fs::path(path) / "optimizer.safetensors").string()).tensors;
  const std::string sp = (fs::path(path) / "trainer.json").string();
  c.state = parse_state(read_text(sp), sp);
  return c;
}

}  // namespace qkv::cli
