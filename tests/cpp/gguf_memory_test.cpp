// Peak memory of a loaded GGUF's model (issue 37's target: at most 1.3x the file plus the KV cache):
// SmolLM2-135M-Instruct's Q4_1 file loaded with its weights as stored (LlamaForCausalLM::from_pretrained(path,
// std::nullopt): the products' repacked copy, no float32 copy), then 32 greedy tokens after a 33-token prompt. The
// growth of this process's peak resident memory (VmHWM) over its peak before the load stays within 1.3x the file's
// size plus the float32 K and V of every layer over the positions used. The only test of its binary, so that the
// peak is this load's. The model alone: tests/python/test_gguf_memory.py measures qkv.CausalLM, tokenizer included.
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "qkv/decode/generate.h"
#include "qkv/models/llama.h"
#include "smollm2.h"

namespace qkv {
namespace {

// A "Key:   N kB" line of /proc/self/status, in bytes.
int64_t status_bytes(const std::string& key) {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind(key + ":", 0) == 0) return std::stoll(line.substr(key.size() + 1)) * 1024;
  ADD_FAILURE() << key << " is not in /proc/self/status";
  return 0;
}

TEST(GgufMemory, PeakOfALoadedModelIsWithinTheFileTimes1_3PlusTheKvCache) {
  const std::string path = testing::smollm2_gguf();
  const int64_t base = status_bytes("VmHWM");
  const auto model = models::LlamaForCausalLM::from_pretrained(path, std::nullopt);
  const models::LlamaConfig& c = model->config();
  std::vector<int64_t> prompt;
  for (int64_t i = 1; i <= 33; ++i) prompt.push_back(i * 37 % c.vocab_size);
  decode::GenerateOptions o;
  o.max_new_tokens = 32;  // no stop ids: all 32 come
  const decode::Generation g = decode::generate(*model, prompt, o);
  ASSERT_EQ(g.tokens.size(), 32u);
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  // A sanitized build's resident memory is mostly the sanitizer's (shadow memory, redzones, the quarantine): the
  // load and the reply are checked there, the bound in the unsanitized build that `make test` runs first.
  (void)base;
  return;
#endif
  const int64_t peak = status_bytes("VmHWM") - base;
  const auto file = static_cast<double>(std::filesystem::file_size(path));
  const int64_t positions = static_cast<int64_t>(prompt.size() + g.tokens.size());
  const double kv = 2.0 * static_cast<double>(c.num_hidden_layers * c.num_key_value_heads * c.head_dim * positions) *
                    sizeof(float);
  EXPECT_LE(static_cast<double>(peak), 1.3 * file + kv)
      << "peak growth " << peak / 1e6 << " MB = " << peak / file << "x the file (" << file / 1e6 << " MB); KV cache "
      << kv / 1e6 << " MB over " << positions << " positions";
}

}  // namespace
}  // namespace qkv
