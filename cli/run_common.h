// Helpers shared by `qkv train`, `qkv eval` and `qkv translate`: reading a run directory (config, vocabulary,
// latest checkpoint into a model) and turning any exception into the one-line error of the command.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "qkv/core/io.h"
#include "qkv/data/vocab.h"
#include "run_config.h"
#include "run_model.h"

namespace qkv::cli {

// A model of the run's kind with the latest checkpoint's weights; step receives the checkpoint's step.
std::unique_ptr<train::TextModel> load_trained_model(const std::string& run_dir, const RunConfig& c,
                                             const data::Vocabulary& vocab, int64_t& step, const char* op);

// The tokens of `texts` that `vocab` lacks (encode() turns them into <unk>): named on one stderr line
// ("qkv: warning: [op] 2 tokens are not in the vocabulary and become <unk>: 'a', 'b'"), or, when strict, refused
// with invalid_argument naming them. Call before encoding user text with a run's vocabulary (translate, viz, serve).
void check_vocabulary(const data::Vocabulary& vocab, const std::vector<std::string>& texts, bool strict,
                      const char* op);

// Thrown (not a std::exception) to end the command with this exit status, after its own one-line message.
struct ExitStatus {
  int code;
};

// fflush(stdout); throws runtime_error "[op] cannot write to standard output: REASON" when it fails (full disk,
// closed pipe), so that lost output is never an exit 0.
void flush_stdout(const char* op);

// A CLI11 check for an integer option: refuses values below `lo` with a short message
// ("--beam: must be an integer >= 1, got '0'"), rather than CLI11's range with a 300-digit bound.
CLI::Validator at_least(int64_t lo);

// A CLI11 check for a seed (uint64): decimal digits only, so that "-1" is refused rather than wrapped to 2^64 - 1.
CLI::Validator seed_value();

// --precision fp32|bf16|int8 on `cmd` (default fp32) into *value; read it with parse_precision (qkv/core/precision.h)
// in the command, so that a bad value is the one-line "[precision] 'x' is not one of fp32, bf16, int8".
void add_precision_option(CLI::App* cmd, std::string& value);
// The --precision of the language-model commands (generate, chat): "stored" (default: the file's own types) or a
// Precision; parse_model_precision maps "stored" to std::nullopt.
void add_model_precision_option(CLI::App* cmd, std::string& value);
std::optional<Precision> parse_model_precision(const std::string& value);
// --kv-cache f32|bf16 (default f32) into *value: the KV cache's storage (decode::GenerateOptions::kv_cache), read
// with kv_cache_precision. A bad value is CLI11's one line "--kv-cache: x not in {f32,bf16}".
void add_kv_cache_option(CLI::App* cmd, std::string& value);
Precision kv_cache_precision(const std::string& value);

// e.what() with newlines folded, so that every failure is one line.
std::string one_line(const std::string& message);

}  // namespace qkv::cli
