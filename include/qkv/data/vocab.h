// Vocabulary: token strings <-> ids with the specials PAD = 0, BOS = 1, EOS = 2, UNK = 3, bound to one tokenizer.
// Built from a corpus (frequency order, ties by byte order: deterministic), saved and loaded as a small text file.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "qkv/data/tokenizer.h"

namespace qkv::data {

class Vocabulary {
 public:
  static constexpr int64_t kPad = 0;
  static constexpr int64_t kBos = 1;
  static constexpr int64_t kEos = 2;
  static constexpr int64_t kUnk = 3;
  static constexpr int64_t kNumSpecials = 4;

  // Only the four specials ("<pad>", "<bos>", "<eos>", "<unk>").
  explicit Vocabulary(TokenizerKind kind = TokenizerKind::kChar);

  // Tokens of `texts` seen at least min_freq (>= 1) times, most frequent first, ties in byte order; max_size > 0
  // keeps that many non-special tokens (0 = all). For kByte the vocabulary is always the 256 bytes in byte order
  // (id = 4 + byte), whatever the corpus, so any input encodes without UNK.
  static Vocabulary build(const std::vector<std::string>& texts, TokenizerKind kind, int64_t min_freq = 1,
                          int64_t max_size = 0);

  // Appends a token (not empty, not a special's name) and returns its id; an existing token returns its id.
  int64_t add(const std::string& token);

  int64_t size() const { return static_cast<int64_t>(tokens_.size()); }
  TokenizerKind kind() const { return kind_; }
  // The id of a token; UNK when absent (the specials' names also map to UNK: text never produces PAD/BOS/EOS).
  int64_t id(std::string_view token) const;
  bool contains(std::string_view token) const;
  // The token of an id in [0, size()); throws invalid_argument "[vocab] id 7 is out of range [0, 5)".
  const std::string& token(int64_t id) const;

  // text -> ids (optionally BOS first and EOS last); unknown tokens become UNK.
  std::vector<int64_t> encode(std::string_view text, bool add_bos = false, bool add_eos = false) const;
  // The tokens of `text` that encode() would turn into UNK, each once, in order of first appearance.
  std::vector<std::string> unknown_tokens(std::string_view text) const;
  // ids -> text: stops at the first EOS, skips PAD and BOS, writes UNK as "<unk>". Ids out of range throw.
  std::string decode(const std::vector<int64_t>& ids) const;
  // ids -> token strings, with no skipping (for attention plots); specials appear by name.
  std::vector<std::string> tokens_of(const std::vector<int64_t>& ids) const;

  // The text form: first line "qkv-vocab 1 <tokenizer>", then one token per line in id order, the specials first.
  // Bytes outside printable ASCII / valid UTF-8, '\' and space are escaped (\\, \n, \t, \r, \xHH).
  std::string serialize() const;
  // Parses serialize()'s text; `name` (a file name) prefixes errors: "[vocab] NAME:LINE: ...".
  static Vocabulary parse(std::string_view text, const std::string& name = "vocabulary");
  // Atomic write (tmp + fsync + rename) / read. load throws runtime_error when the file cannot be read.
  void save(const std::string& path) const;
  static Vocabulary load(const std::string& path);

  bool operator==(const Vocabulary& other) const { return kind_ == other.kind_ && tokens_ == other.tokens_; }
  bool operator!=(const Vocabulary& other) const { return !(*this == other); }

 private:
  TokenizerKind kind_;
  std::vector<std::string> tokens_;
  std::unordered_map<std::string, int64_t> index_;  // non-special tokens only
};

}  // namespace qkv::data
