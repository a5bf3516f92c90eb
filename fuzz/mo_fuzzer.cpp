// libFuzzer target for the GNU gettext .mo reader: any bytes either parse or throw std::invalid_argument "[mo] ...";
// whatever parses gives pairs with no empty translation, no duplicate and (by default) no newline.
#include <cstdint>
#include <set>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

#include "fuzz_check.h"
#include "qkv/corpus/mo.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  qkv::data::MoCatalog catalog;
  try {
    catalog = qkv::data::parse_mo(bytes, "fuzz.mo");
  } catch (const std::invalid_argument& e) {
    FUZZ_CHECK(fuzz_message_starts_with(e.what(), "[mo] fuzz.mo"));
    return 0;
  }
  FUZZ_CHECK(size >= 28);  // the fixed header alone is 28 bytes
  for (const auto& e : catalog.entries) FUZZ_CHECK(!e.msgstr.empty());
  (void)catalog.charset();
  (void)catalog.nplurals();
  qkv::data::MoPairOptions options;
  options.max_chars = 40;
  try {
    const auto pairs = qkv::data::mo_to_pairs(catalog, options);
    std::set<std::pair<std::string, std::string>> seen;
    for (const auto& p : pairs) {
      FUZZ_CHECK(!p.tgt.empty());
      FUZZ_CHECK(p.src.find('\n') == std::string::npos && p.tgt.find('\n') == std::string::npos);
      FUZZ_CHECK(seen.emplace(p.src, p.tgt).second);
    }
  } catch (const std::invalid_argument& e) {
    // Counting code points needs valid UTF-8; anything else must say where it went wrong.
    FUZZ_CHECK(std::strchr(e.what(), '[') == e.what());
  }
  return 0;
}
