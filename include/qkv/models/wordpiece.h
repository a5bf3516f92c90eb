// WordPieceTokenizer: BERT's uncased tokenizer (clean-up, CJK split, NFD accent strip, lower-case, punctuation
// split, greedy longest-match-first WordPiece), giving the same ids as HF tokenizers' BertTokenizer.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "qkv/ops/embedding.h"

namespace qkv::models {

// Everything BERT's tokenizer needs besides the vocabulary. Defaults are bert-base-uncased's (and MiniLM's).
struct WordPieceOptions {
  bool lowercase = true;
  bool strip_accents = true;            // NFD, then drop non-spacing marks (BERT: follows lowercase when unset)
  bool tokenize_chinese_chars = true;   // each CJK ideograph becomes its own word
  int64_t max_input_chars_per_word = 100;  // longer words become unk_token
  std::string unk_token = "[UNK]";
  std::string cls_token = "[CLS]";
  std::string sep_token = "[SEP]";
  std::string pad_token = "[PAD]";
  std::string mask_token = "[MASK]";
};

// A padded batch of encoded texts.
struct TokenBatch {
  Ids ids;                       // (B, T) token ids, right-padded with the pad id; T = longest row
  Ids attention_mask;            // (B, T) 1 for real tokens, 0 for padding
  std::vector<int64_t> lengths;  // (B) real tokens per row, [CLS] and [SEP] included
};

class WordPieceTokenizer {
 public:
  // vocab[i] is the token with id i. It must be non-empty, hold no duplicate or empty token, and contain the five
  // special tokens of `options`; max_input_chars_per_word > 0.
  explicit WordPieceTokenizer(std::vector<std::string> vocab, WordPieceOptions options = {});
  // BERT's vocab.txt: one token per line, trailing whitespace trimmed. Throws std::runtime_error
  // "[wordpiece] ..." naming the file when it cannot be read, std::invalid_argument when its content is invalid.
  static WordPieceTokenizer from_file(const std::string& vocab_path, WordPieceOptions options = {});

  // The normalizer alone: clean-up (drop NUL, U+FFFD and control characters; whitespace -> ' '), spaces around
  // CJK ideographs, NFD + drop non-spacing marks, lower-case. text must be valid UTF-8.
  std::string normalize(std::string_view text) const;
  // The word pieces of `text`, without [CLS]/[SEP]. The special tokens written literally in the text ("[MASK]")
  // are matched before normalization and stay whole, as in the reference.
  std::vector<std::string> tokenize(std::string_view text) const;
  // [CLS] ids [SEP]; the pieces are cut at the end so that at most max_length ids come out. max_length >= 2.
  std::vector<int64_t> encode(std::string_view text, int64_t max_length) const;
  // B texts (B >= 0) -> ids and attention_mask (B, T), T = the longest encoded text (0 when B == 0).
  TokenBatch encode_batch(const std::vector<std::string>& texts, int64_t max_length) const;

  int64_t vocab_size() const { return static_cast<int64_t>(vocab_.size()); }
  int64_t token_to_id(std::string_view token) const;  // -1 when absent
  const std::string& id_to_token(int64_t id) const;   // id in [0, vocab_size)
  int64_t pad_id() const { return pad_id_; }
  int64_t cls_id() const { return cls_id_; }
  int64_t sep_id() const { return sep_id_; }
  int64_t unk_id() const { return unk_id_; }
  const WordPieceOptions& options() const { return options_; }

 private:
  std::u32string normalize_code_points(const std::u32string& text) const;
  void word_pieces(const std::u32string& word, std::vector<int64_t>& out) const;
  void append_ids(std::string_view text, std::vector<int64_t>& out) const;

  std::vector<std::string> vocab_;
  std::unordered_map<std::string, int64_t> ids_;
  std::vector<std::string> specials_;  // matched literally in the raw text
  std::array<bool, 256> special_first_byte_{};  // the first bytes of specials_
  size_t max_token_bytes_ = 0;         // the longest vocabulary entry: no longer candidate can match
  WordPieceOptions options_;
  int64_t pad_id_ = 0, cls_id_ = 0, sep_id_ = 0, unk_id_ = 0;
};

}  // namespace qkv::models
