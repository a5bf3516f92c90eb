// Internal: the per-code-point tables of BERT's uncased tokenizer (generated into unicode_tables.cpp).
// Lookups are binary searches over sorted ranges/entries; code points absent from a table have the default.
#pragma once

#include <cstddef>
#include <cstdint>

namespace qkv::models::unicode {

enum Flag : uint8_t {
  kControl = 1,     // removed by clean-up (Cc/Cf/Co/Cs as the reference knows them, NUL, U+FFFD)
  kSpace = 2,       // becomes ' ' in clean-up
  kMn = 4,          // non-spacing mark: dropped after NFD when stripping accents
  kPunct = 8,       // split off as its own word by the pre-tokenizer
  kSplitSpace = 16  // separates words in the pre-tokenizer
};

struct FlagRange { char32_t lo, hi; uint8_t flags; };
struct ClassRange { char32_t lo, hi; uint8_t ccc; };
struct Mapping { char32_t cp; uint32_t start, len; };  // into the matching *Data array

extern const FlagRange kFlagRanges[];
extern const size_t kFlagRangesSize;
extern const ClassRange kCombiningClassRanges[];
extern const size_t kCombiningClassRangesSize;
extern const char32_t kDecompositionsData[];
extern const size_t kDecompositionsDataSize;
extern const Mapping kDecompositions[];  // full canonical decomposition (NFD), Hangul syllables excluded
extern const size_t kDecompositionsSize;
extern const char32_t kLowercaseData[];
extern const size_t kLowercaseDataSize;
extern const Mapping kLowercase[];       // char-wise lower-casing (one code point may become several)
extern const size_t kLowercaseSize;

}  // namespace qkv::models::unicode
