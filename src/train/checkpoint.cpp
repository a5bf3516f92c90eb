// Checkpoint directories: temporary directory + fsync + rename for atomicity, pruning of old ones after the new
// one is durable, and strict loading (model kind recorded in the weights' metadata).
#include "qkv/train/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <map>
#include <cstdio>
#include <filesystem>
#include <vector>

#include "qkv/core/error.h"
#include "qkv/core/io.h"
#include "qkv/core/safetensors.h"
#include "qkv/nn/serialize.h"
#include "qkv/train/run_config.h"

namespace qkv::train {
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

}  // namespace

TrainerState parse_trainer_state(const std::string& text, const std::string& name) {
  std::map<std::string, std::string> kv = parse_flat_json(text, name);
  auto take = [&](const char* k) {
    const auto it = kv.find(k);
    QKV_CHECK_ARG(it != kv.end(), "[checkpoint] ", name, ": missing key '", k, "'");
    std::string v = it->second;
    kv.erase(it);
    return v;
  };
  QKV_CHECK_ARG(take("format") == "qkv-trainer-state 1", "[checkpoint] ", name,
                ": not a qkv trainer state (format 'qkv-trainer-state 1' expected)");
  auto bad = [&](const char* k, const std::string& v, const char* expected) {
    return std::invalid_argument("[checkpoint] " + name + ": bad value '" + v + "' for '" + k + "' (expected " +
                                 expected + ")");
  };
  auto count = [&](const char* k) {
    const std::string v = take(k);
    int64_t x = 0;
    const auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
    if (ec != std::errc() || p != v.data() + v.size() || x < 0) throw bad(k, v, "an integer >= 0");
    return x;
  };
  auto real = [&](const char* k) {
    const std::string v = take(k);
    double x = 0;
    const auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
    if (ec != std::errc() || p != v.data() + v.size()) throw bad(k, v, "a number");
    return x;
  };
  TrainerState s;
  s.step = count("step");
  s.epoch = count("epoch");
  s.position = count("position");
  {
    const std::string v = take("dropout_rng_state");
    const auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), s.dropout_rng_state);
    if (ec != std::errc() || p != v.data() + v.size()) throw bad("dropout_rng_state", v, "an unsigned 64-bit integer");
  }
  s.last_loss = real("last_loss");
  s.elapsed_s = real("elapsed_s");
  if (!std::isfinite(s.elapsed_s) || s.elapsed_s < 0) throw bad("elapsed_s", std::to_string(s.elapsed_s), "a finite number >= 0");
  QKV_CHECK_ARG(kv.empty(), "[checkpoint] ", name, ": unexpected key '", kv.begin()->first, "'");
  return s;
}

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
  // Non-throwing iteration: entries may be renamed away by a concurrent save while this lists them.
  for (fs::directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
    const fs::path p = it->path();
    const int64_t s = parse_step(p.filename().string());
    std::error_code ec2;
    if (s > best && fs::exists(p / "trainer.json", ec2)) {
      best = s;
      best_path = p;
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
  // A diverged or damaged run must not evaluate to 0 or translate to empty lines with exit 0.
  nn::check_finite(c.weights, "[checkpoint] " + path + "/model.safetensors: ");
  nn::check_finite(c.optimizer, "[checkpoint] " + path + "/optimizer.safetensors: ");
  const std::string sp = (fs::path(path) / "trainer.json").string();
  c.state = parse_trainer_state(read_file_text(sp, "checkpoint"), sp);
  return c;
}

LoadedCheckpoint load_latest_checkpoint(const std::string& run_dir, const std::string& model_kind) {
  // A reader racing a training run: the writer may prune the checkpoint picked here (renamed to .old-* first)
  // before its files are read. A checkpoint that vanished is not damage: pick the newest one again.
  constexpr int kAttempts = 20;
  for (int attempt = 1;; ++attempt) {
    const std::string ckpt = latest_checkpoint(run_dir);
    if (ckpt.empty()) return {};
    try {
      return load_checkpoint(ckpt, model_kind);
    } catch (const std::runtime_error&) {
      std::error_code ec;
      if (attempt >= kAttempts || fs::exists(ckpt, ec)) throw;
    }
  }
}

}  // namespace qkv::train
