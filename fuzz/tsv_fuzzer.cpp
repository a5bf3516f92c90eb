// libFuzzer target for the TSV parallel-corpus reader: any bytes either parse or throw std::invalid_argument
// "[tsv] fuzz.tsv..."; what parses is one (source, target) pair per non-blank line, with no tab or newline inside
// either side, and re-serialised as TSV it parses back to the same pairs.
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>

#include "fuzz_check.h"
#include "qkv/data/tsv.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  std::vector<qkv::data::TextPair> pairs;
  try {
    pairs = qkv::data::parse_tsv(text, "fuzz.tsv");
  } catch (const std::invalid_argument& e) {
    FUZZ_CHECK(fuzz_message_starts_with(e.what(), "[tsv] fuzz.tsv"));
    return 0;
  }
  FUZZ_CHECK(!pairs.empty());
  std::string again;
  for (const auto& p : pairs) {
    FUZZ_CHECK(p.src.find('\t') == std::string::npos && p.tgt.find('\t') == std::string::npos);
    FUZZ_CHECK(p.src.find('\n') == std::string::npos && p.tgt.find('\n') == std::string::npos);
    again += p.src + "\t" + p.tgt + "\n";
  }
  // A pair whose text ends in '\r' or is all blanks could legitimately read back differently; skip those.
  bool plain = true;
  for (const auto& p : pairs) {
    const std::string line = p.src + "\t" + p.tgt;
    if ((!p.tgt.empty() && p.tgt.back() == '\r')) plain = false;
    if (line.find_first_not_of(" \t") == std::string::npos) plain = false;
  }
  if (plain) FUZZ_CHECK(qkv::data::parse_tsv(again, "again.tsv") == pairs);
  return 0;
}
