// Reading a run directory back: config.json, vocab.txt and the newest checkpoint's weights into a fresh model.
#include "run_common.h"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "checkpoint.h"
#include "qkv/core/error.h"
#include "qkv/core/io.h"

namespace qkv::cli {

std::unique_ptr<train::TextModel> load_trained_model(const std::string& run_dir, const RunConfig& c,
                                             const data::Vocabulary& vocab, int64_t& step, const char* op) {
  LoadedCheckpoint loaded = load_latest_checkpoint(run_dir, c.model);
  const std::string& ckpt = loaded.path;
  QKV_CHECK_ARG(!ckpt.empty(), "[", op, "] '", run_dir, "' has no checkpoint yet");
  Rng rng(c.seed);
  std::unique_ptr<train::TextModel> model = make_run_model(c, vocab.size(), rng);
  try {
    model->module().load_state_dict(loaded.weights, true);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument("[checkpoint] " + ckpt + " does not fit a '" + c.model + "' model: " + e.what());
  }
  step = loaded.state.step;
  return model;
}

void check_vocabulary(const data::Vocabulary& vocab, const std::vector<std::string>& texts, bool strict,
                      const char* op) {
  std::vector<std::string> unknown;
  for (const std::string& text : texts)
    for (std::string& tok : vocab.unknown_tokens(text))
      if (std::find(unknown.begin(), unknown.end(), tok) == unknown.end()) unknown.push_back(std::move(tok));
  if (unknown.empty()) return;
  const size_t shown = std::min<size_t>(unknown.size(), 20);
  std::string names;
  for (size_t i = 0; i < shown; ++i) {
    names += i ? ", '" : "'";
    for (unsigned char ch : unknown[i]) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "\\x%02X", ch);
      names += ch < 0x20 || ch == 0x7F ? std::string(hex) : std::string(1, static_cast<char>(ch));
    }
    names += "'";
  }
  if (shown < unknown.size()) names += " and " + std::to_string(unknown.size() - shown) + " more";
  const std::string what = std::to_string(unknown.size()) + (unknown.size() == 1 ? " token is" : " tokens are") +
                           " not in the run's vocabulary";
  QKV_CHECK_ARG(!strict, "[", op, "] ", what, " (--strict): ", names);
  std::fprintf(stderr, "qkv: warning: [%s] %s and become <unk>: %s (--strict refuses them)\n", op, what.c_str(),
               names.c_str());
}

void flush_stdout(const char* op) {
  errno = 0;
  if (std::fflush(stdout) != 0 || std::ferror(stdout) != 0)
    throw std::runtime_error(std::string("[") + op + "] cannot write to standard output: " +
                             std::strerror(errno != 0 ? errno : EIO));
}

void add_precision_option(CLI::App* cmd, std::string& value) {
  value = "fp32";
  cmd->add_option("--precision", value,
                  "fp32 | bf16 | int8: how the linear layers (and, for bf16, attention) compute; docs/PRECISION.md")
      ->capture_default_str();
}

void add_model_precision_option(CLI::App* cmd, std::string& value) {
  value = "stored";
  cmd->add_option("--precision", value,
                  "stored | fp32 | bf16 | int8: stored runs the weights as the file stores them (a GGUF's quantized "
                  "blocks with int8 activations per 32; a folder's float32); fp32 dequantizes a GGUF once; "
                  "docs/PRECISION.md")
      ->capture_default_str();
}

std::optional<Precision> parse_model_precision(const std::string& value) {
  if (value == "stored") return std::nullopt;
  return parse_precision(value);
}

void add_kv_cache_option(CLI::App* cmd, std::string& value) {
  value = "f32";
  cmd->add_option("--kv-cache", value,
                  "f32 | bf16: the KV cache's storage; bf16 rounds keys and values to bfloat16 and reads half the "
                  "bytes a token (llama.cpp's --cache-type-k/v)")
      ->capture_default_str()
      ->check(CLI::IsMember({"f32", "bf16"}));
}

Precision kv_cache_precision(const std::string& value) {
  QKV_CHECK_ARG(value == "f32" || value == "bf16", "[kv-cache] '", value, "' is not one of f32, bf16");
  return value == "bf16" ? Precision::kBFloat16 : Precision::kFloat32;
}

CLI::Validator at_least(int64_t lo) {
  return CLI::Validator(
      [lo](std::string& text) -> std::string {
        int64_t v = 0;
        const auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
        if (ec != std::errc() || p != text.data() + text.size() || v < lo)
          return "must be an integer >= " + std::to_string(lo) + ", got '" + text + "'";
        return "";
      },
      "INT>=" + std::to_string(lo));
}

CLI::Validator seed_value() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        uint64_t v = 0;
        const auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
        if (text.empty() || text[0] == '-' || text[0] == '+' || ec != std::errc() || p != text.data() + text.size())
          return "must be an integer in [0, 2^64), got '" + text + "'";
        return "";
      },
      "UINT64");
}

std::string one_line(const std::string& m) {
  std::string out;
  for (char ch : m) out += (ch == '\n' || ch == '\r') ? ' ' : ch;
  while (!out.empty() && out.back() == ' ') out.pop_back();
  return out;
}

}  // namespace qkv::cli
