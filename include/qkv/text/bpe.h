// The plain description of a BPE tokenizer (vocabulary, ranked merges, added tokens, and the normalizer,
// pre-tokenizer, post-processor and decoder steps in HF tokenizers' terms), and the pieces tests reach directly:
// the GPT-2 byte <-> unicode map, the regex pre-tokenizers, the added-token split.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace qkv::text {

// GPT-2's byte <-> unicode map: byte b -> the code point standing for it in byte-level vocabularies ('Ġ' for ' ').
char32_t byte_to_unicode(uint8_t b);
// The inverse; -1 when cp stands for no byte.
int unicode_to_byte(char32_t cp);
// Every byte of `bytes` as its code point, UTF-8 encoded ("a b" -> "aĠb").
std::string bytes_to_unicode(std::string_view bytes);

// U+FFFD for each maximal ill-formed subpart (Unicode 3.9; Rust's String::from_utf8_lossy, Python's
// errors="replace"); valid UTF-8 comes back unchanged.
std::string lossy_utf8(std::string_view bytes);
// The length (0..3) of the unfinished UTF-8 sequence that ends `bytes`: a lead byte and continuation bytes that
// a later byte could still complete.
size_t unfinished_utf8_tail(std::string_view bytes);

// The pre-tokenizer regexes of the byte-level models, as written in their tokenizer.json files.
extern const char* const kGpt2Pattern;    // GPT-2, SmolLM2 (after the digit split)
extern const char* const kLlama3Pattern;  // Llama 3
extern const char* const kQwen2Pattern;   // Qwen 2 (single digits)

struct AddedToken {
  int64_t id = -1;
  std::string content;
  bool special = false;
  bool lstrip = false;      // the match takes the whitespace before it
  bool rstrip = false;      // the match takes the whitespace after it
  bool normalized = false;  // matched after the normalizer (refused when the spec has a normalizer)
  bool single_word = false; // refused (no common model uses it)
};

// One normalizer step: Prepend(content) or Replace(pattern -> content), pattern a plain string.
struct NormalizerStep {
  enum class Kind { kPrepend, kReplace } kind = Kind::kReplace;
  std::string pattern, content;
};

// One pre-tokenizer step (HF's pre_tokenizers.*).
struct PreTokenizerStep {
  enum class Kind { kSplit, kByteLevel, kDigits, kMetaspace } kind = Kind::kSplit;
  // kSplit: a regex (Oniguruma syntax as in tokenizer.json: \s, \p{L}, \p{N}, (?i:...), lookahead) or a plain
  // string; behavior "Isolated" | "Removed" | "MergedWithPrevious" | "MergedWithNext" | "Contiguous"; invert.
  std::string pattern;
  bool pattern_is_regex = true;
  std::string behavior = "Isolated";
  bool invert = false;
  // kByteLevel: split with kGpt2Pattern first when use_regex; a space before the text when add_prefix_space.
  bool use_regex = true;
  bool add_prefix_space = false;
  // kDigits: each digit alone (true) or runs of digits.
  bool individual_digits = false;
  // kMetaspace: ' ' -> replacement, then prepend it ("always", "first", "never"), and split before each one.
  std::string replacement = "\xE2\x96\x81";  // ▁
  std::string prepend_scheme = "always";
  bool split = true;
};

// One decoder step (HF's decoders.*), applied in order to the list of token strings.
struct DecoderStep {
  enum class Kind { kByteLevel, kReplace, kByteFallback, kFuse, kStrip, kMetaspace } kind = Kind::kByteLevel;
  std::string pattern, content;  // kReplace: pattern -> content; kStrip: content (one character)
  int64_t start = 0, stop = 0;   // kStrip: characters cut at each end of each token
  std::string replacement = "\xE2\x96\x81";  // kMetaspace
  std::string prepend_scheme = "always";     // kMetaspace: "never" keeps the first token's leading space
};

struct TokenizerSpec {
  std::string source;                // the file it came from; every error names it
  std::vector<std::string> vocab;    // id -> token of the model (BPE); an id only an added token has is ""
  std::vector<std::pair<std::string, std::string>> merges;  // rank order (first = merged first)
  bool byte_fallback = false;        // a character missing from vocab becomes its <0xAB> byte tokens
  bool ignore_merges = false;        // a pre-token found whole in vocab is one token (Llama 3)
  bool fuse_unk = false;
  int64_t unk_id = -1;               // -1: characters missing from vocab (and no byte fallback) are dropped
  std::vector<AddedToken> added;     // split out of the text before everything else
  std::vector<NormalizerStep> normalizer;
  std::vector<PreTokenizerStep> pre_tokenizer;
  std::vector<DecoderStep> decoder;
  // encode(add_special_tokens=true): `prefix` ids, the text's ids, `suffix` ids (HF's TemplateProcessing
  // single template, or GGUF's add_bos/add_eos).
  std::vector<int64_t> prefix, suffix;
  int64_t bos_id = -1, eos_id = -1, pad_id = -1;
};

// The token types of GGUF's tokenizer.ggml.token_type.
enum class GgufTokenType : int32_t { kNormal = 1, kUnknown = 2, kControl = 3, kUserDefined = 4, kUnused = 5,
                                     kByte = 6 };

// The tokenizer metadata of a GGUF file, as read (absent arrays empty, absent ids -1).
struct GgufTokenizerData {
  std::string source;                 // the file
  std::string model;                  // tokenizer.ggml.model
  std::string pre;                    // tokenizer.ggml.pre ("" when absent)
  std::vector<std::string> tokens;
  std::vector<int32_t> token_types;   // empty: all normal
  std::vector<std::string> merges;    // "a b"
  std::vector<float> scores;
  int64_t bos_id = -1, eos_id = -1, unk_id = -1, pad_id = -1;
  int add_bos = -1, add_eos = -1;     // -1: absent (the model's default: SPM adds bos, gpt2 nothing)
  int add_space_prefix = -1;          // -1: absent (SPM default true)
};

// The spec HF builds for these metadata (transformers' GGUF converter), or std::runtime_error
// "[tokenizer] <file>: tokenizer.ggml.<key> ..." for a model or pre-tokenizer this reader does not implement.
// Taken by value: the tokens move into the spec (pass std::move(data) to hold the vocabulary once).
TokenizerSpec spec_from_gguf(GgufTokenizerData data);

// Splits text by the added tokens (leftmost match, longest at a position; lstrip/rstrip take the whitespace
// beside): pieces in order, each (id, text), id -1 for plain text. No added token matches across or inside the
// byte ranges [begin, end) of `plain` (text a user typed). Exposed for the tests.
std::vector<std::pair<int64_t, std::string>> split_added_tokens(
    std::string_view text, const std::vector<AddedToken>& added,
    const std::vector<std::pair<size_t, size_t>>& plain = {});

// Runs one regex pre-tokenizer step (kSplit) over text: the pieces it gives. Exposed for the tests.
std::vector<std::string> regex_split(std::string_view text, const std::string& pattern, const std::string& behavior,
                                     bool invert = false);

}  // namespace qkv::text
