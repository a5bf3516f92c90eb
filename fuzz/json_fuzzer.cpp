// libFuzzer target for the run directory's JSON files: config.json (RunConfig::from_json, then resolve_and_check)
// and a checkpoint's trainer.json (parse_trainer_state), both over the one flat JSON reader. Any bytes either parse
// or throw std::invalid_argument naming the file ("[config] fuzz.json: ...", "[checkpoint] fuzz.json: ...",
// "[train] ..." for a readable config with a bad value); a config that reads back writes the same text again.
#include <cstdint>
#include <stdexcept>
#include <string>

#include "qkv/train/checkpoint.h"
#include "fuzz_check.h"
#include "qkv/train/run_config.h"

namespace {

bool named_error(const char* what) {
  return std::strncmp(what, "[config] fuzz.json: ", 20) == 0 || std::strncmp(what, "[checkpoint] fuzz.json: ", 24) == 0 ||
         fuzz_message_starts_with(what, "[train] ");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    (void)qkv::train::parse_flat_json(text, "fuzz.json");
  } catch (const std::invalid_argument& e) {
    FUZZ_CHECK(named_error(e.what()));
  }
  try {
    (void)qkv::train::parse_trainer_state(text, "fuzz.json");
  } catch (const std::invalid_argument& e) {
    FUZZ_CHECK(named_error(e.what()));
  }
  try {
    qkv::train::RunConfig c = qkv::train::RunConfig::from_json(text, "fuzz.json");
    const std::string once = c.to_json();
    FUZZ_CHECK(qkv::train::RunConfig::from_json(once, "again.json").to_json() == once);
    c.resolve_and_check();
  } catch (const std::invalid_argument& e) {
    FUZZ_CHECK(named_error(e.what()));
  }
  return 0;
}
