// BERT's uncased WordPiece tokenizer, step for step as HF tokenizers (BertNormalizer, BertPreTokenizer, WordPiece,
// the [CLS]/[SEP] template). Character data comes from unicode_tables.cpp, generated from that reference.
#include "qkv/models/wordpiece.h"

#include <algorithm>
#include <array>
#include <fstream>
#include <cctype>

#include "qkv/core/error.h"
#include "qkv/core/utf8.h"
#include "unicode_tables.h"

namespace qkv::models {
namespace {

namespace uni = unicode;

uint8_t flags_from_table(char32_t c) {
  const uni::FlagRange* end = uni::kFlagRanges + uni::kFlagRangesSize;
  const uni::FlagRange* it =
      std::upper_bound(uni::kFlagRanges, end, c, [](char32_t v, const uni::FlagRange& r) { return v < r.lo; });
  if (it == uni::kFlagRanges) return 0;
  --it;
  return c <= it->hi ? it->flags : 0;
}

// ASCII, most of any text, from a 128-entry copy of the table (built from it once); the rest by binary search.
uint8_t flags_of(char32_t c) {
  static const std::array<uint8_t, 128> ascii = [] {
    std::array<uint8_t, 128> a{};
    for (char32_t i = 0; i < 128; ++i) a[i] = flags_from_table(i);
    return a;
  }();
  return c < 128 ? ascii[c] : flags_from_table(c);
}

uint8_t combining_class(char32_t c) {
  const uni::ClassRange* begin = uni::kCombiningClassRanges;
  const uni::ClassRange* end = begin + uni::kCombiningClassRangesSize;
  if (begin == end || c < begin->lo) return 0;  // every starter below the first combining mark, ASCII included
  const uni::ClassRange* it =
      std::upper_bound(begin, end, c, [](char32_t v, const uni::ClassRange& r) { return v < r.lo; });
  if (it == begin) return 0;
  --it;
  return c <= it->hi ? it->ccc : 0;
}

// Appends the mapping of c from a generated table, or c itself when the table has no entry.
void append_mapped(char32_t c, const uni::Mapping* table, size_t size, const char32_t* data, std::u32string& out) {
  const uni::Mapping* end = table + size;
  if (size == 0 || c < table->cp) {  // below the table's first entry (ASCII for the decompositions)
    out.push_back(c);
    return;
  }
  const uni::Mapping* it =
      std::lower_bound(table, end, c, [](const uni::Mapping& m, char32_t v) { return m.cp < v; });
  if (it != end && it->cp == c) {
    out.append(data + it->start, it->len);
  } else {
    out.push_back(c);
  }
}

// "This defines a 'chinese character' as anything in the CJK Unicode block" (BERT); the reference's ranges, which
// scripts/gen_unicode_tables.py checks code point by code point.
bool is_chinese_char(char32_t c) {
  return (c >= 0x3400 && c <= 0x4DBF) || (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0xF900 && c <= 0xFAFF) ||
         (c >= 0x20000 && c <= 0x2A6DF) || (c >= 0x2A700 && c <= 0x2B73F) || (c >= 0x2B740 && c <= 0x2B81F) ||
         (c >= 0x2B920 && c <= 0x2CEAF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

// Canonical decomposition (NFD) of one code point; Hangul syllables by the Unicode algorithm.
void decompose(char32_t c, std::u32string& out) {
  constexpr char32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
  constexpr char32_t kVCount = 21, kTCount = 28, kSCount = 19 * kVCount * kTCount;
  if (c >= kSBase && c < kSBase + kSCount) {
    const char32_t s = c - kSBase;
    out.push_back(kLBase + s / (kVCount * kTCount));
    out.push_back(kVBase + (s % (kVCount * kTCount)) / kTCount);
    if (s % kTCount) out.push_back(kTBase + s % kTCount);
    return;
  }
  append_mapped(c, uni::kDecompositions, uni::kDecompositionsSize, uni::kDecompositionsData, out);
}

// Decodes UTF-8, rejecting overlong forms, surrogates and code points past U+10FFFF.
std::u32string decode_utf8(std::string_view s) {
  std::u32string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    char32_t c = 0;
    const size_t n = utf8_decode(s, i, &c);
    QKV_CHECK_ARG(n > 0, "[wordpiece] text is not valid UTF-8 at byte ", i);
    out.push_back(c);
    i += n;
  }
  return out;
}

std::string encode_utf8(const std::u32string& s) {
  std::string out;
  out.reserve(s.size());
  for (char32_t c : s) utf8_append(c, out);
  return out;
}

// BertPreTokenizer: whitespace separates words and is dropped; each punctuation character is a word of its own.
std::vector<std::u32string> split_words(const std::u32string& text) {
  std::vector<std::u32string> words;
  std::u32string current;
  for (char32_t c : text) {
    const uint8_t f = flags_of(c);
    if (f & (uni::kSplitSpace | uni::kPunct)) {
      if (!current.empty()) words.push_back(std::move(current));
      current.clear();
      if (f & uni::kPunct) words.push_back(std::u32string(1, c));
    } else {
      current.push_back(c);
    }
  }
  if (!current.empty()) words.push_back(std::move(current));
  return words;
}

}  // namespace

WordPieceTokenizer::WordPieceTokenizer(std::vector<std::string> vocab, WordPieceOptions options)
    : vocab_(std::move(vocab)), options_(std::move(options)) {
  QKV_CHECK_ARG(!vocab_.empty(), "[wordpiece] the vocabulary is empty");
  QKV_CHECK_ARG(options_.max_input_chars_per_word > 0, "[wordpiece] max_input_chars_per_word must be > 0, got ",
                options_.max_input_chars_per_word);
  ids_.reserve(vocab_.size());
  for (size_t i = 0; i < vocab_.size(); ++i) {
    QKV_CHECK_ARG(!vocab_[i].empty(), "[wordpiece] vocabulary entry ", i, " is empty");
    const bool fresh = ids_.emplace(vocab_[i], static_cast<int64_t>(i)).second;
    QKV_CHECK_ARG(fresh, "[wordpiece] vocabulary entry ", i, " '", vocab_[i], "' is a duplicate");
    max_token_bytes_ = std::max(max_token_bytes_, vocab_[i].size());
  }
  auto special = [&](const std::string& token, const char* role) {
    const int64_t id = token_to_id(token);
    QKV_CHECK_ARG(id >= 0, "[wordpiece] the vocabulary has no ", role, " token '", token, "'");
    specials_.push_back(token);
    special_first_byte_[static_cast<unsigned char>(token[0])] = true;
    return id;
  };
  unk_id_ = special(options_.unk_token, "unknown");
  cls_id_ = special(options_.cls_token, "classifier");
  sep_id_ = special(options_.sep_token, "separator");
  pad_id_ = special(options_.pad_token, "padding");
  special(options_.mask_token, "mask");
}

WordPieceTokenizer WordPieceTokenizer::from_file(const std::string& vocab_path, WordPieceOptions options) {
  std::ifstream in(vocab_path, std::ios::binary);
  QKV_CHECK_RUNTIME(in.good(), "[wordpiece] cannot open vocabulary file ", vocab_path);
  std::vector<std::string> vocab;
  std::string line;
  while (std::getline(in, line)) {
    while (!line.empty() && std::isspace(static_cast<unsigned char>(line.back()))) line.pop_back();
    vocab.push_back(line);
  }
  QKV_CHECK_RUNTIME(!in.bad(), "[wordpiece] error while reading vocabulary file ", vocab_path);
  QKV_CHECK_RUNTIME(!vocab.empty(), "[wordpiece] vocabulary file ", vocab_path, " is empty");
  return WordPieceTokenizer(std::move(vocab), std::move(options));
}

int64_t WordPieceTokenizer::token_to_id(std::string_view token) const {
  auto it = ids_.find(std::string(token));
  return it == ids_.end() ? -1 : it->second;
}

const std::string& WordPieceTokenizer::id_to_token(int64_t id) const {
  QKV_CHECK_ARG(id >= 0 && id < vocab_size(), "[wordpiece] id ", id, " is outside the vocabulary [0, ",
                vocab_size(), ")");
  return vocab_[static_cast<size_t>(id)];
}

// BertNormalizer, in the reference's order: clean-up, CJK spacing, NFD + strip marks, lower-case.
std::u32string WordPieceTokenizer::normalize_code_points(const std::u32string& text) const {
  std::u32string s;
  s.reserve(text.size());
  for (char32_t c : text) {
    const uint8_t f = flags_of(c);
    if (f & uni::kControl) continue;
    if (f & uni::kSpace) c = U' ';
    if (options_.tokenize_chinese_chars && is_chinese_char(c)) {
      s.push_back(U' ');
      s.push_back(c);
      s.push_back(U' ');
    } else {
      s.push_back(c);
    }
  }
  if (options_.strip_accents) {
    std::u32string d;
    d.reserve(s.size());
    for (char32_t c : s) decompose(c, d);
    // Canonical ordering: every run of non-starters is stably sorted by combining class.
    for (size_t i = 0; i < d.size();) {
      if (combining_class(d[i]) == 0) {
        ++i;
        continue;
      }
      size_t j = i;
      while (j < d.size() && combining_class(d[j]) != 0) ++j;
      std::stable_sort(d.begin() + i, d.begin() + j,
                       [](char32_t a, char32_t b) { return combining_class(a) < combining_class(b); });
      i = j;
    }
    s.clear();
    for (char32_t c : d) {
      if (!(flags_of(c) & uni::kMn)) s.push_back(c);
    }
  }
  if (options_.lowercase) {
    std::u32string l;
    l.reserve(s.size());
    // ASCII from a 128-entry copy of the table's one-to-one ASCII mappings (built from it once).
    static const std::array<char32_t, 128> ascii = [] {
      std::array<char32_t, 128> a{};
      for (char32_t i = 0; i < 128; ++i) {
        std::u32string m;
        append_mapped(i, uni::kLowercase, uni::kLowercaseSize, uni::kLowercaseData, m);
        a[i] = m.size() == 1 ? m[0] : 0;  // 0: not one-to-one, take the table
      }
      return a;
    }();
    for (char32_t c : s) {
      if (c < 128 && ascii[c] != 0) {
        l.push_back(ascii[c]);
      } else {
        append_mapped(c, uni::kLowercase, uni::kLowercaseSize, uni::kLowercaseData, l);
      }
    }
    s = std::move(l);
  }
  return s;
}

std::string WordPieceTokenizer::normalize(std::string_view text) const {
  return encode_utf8(normalize_code_points(decode_utf8(text)));
}

// Greedy longest-match-first over one word; the whole word becomes [UNK] when any part cannot be matched.
void WordPieceTokenizer::word_pieces(const std::u32string& word, std::vector<int64_t>& out) const {
  if (static_cast<int64_t>(word.size()) > options_.max_input_chars_per_word) {
    out.push_back(unk_id_);
    return;
  }
  std::string bytes;
  std::vector<size_t> offset;  // byte offset of each code point, plus the end
  for (char32_t c : word) {
    offset.push_back(bytes.size());
    utf8_append(c, bytes);
  }
  offset.push_back(bytes.size());
  const size_t first = out.size();
  std::string candidate;
  size_t start = 0;
  while (start < word.size()) {
    int64_t found = -1;
    // Candidates longer than the longest vocabulary entry cannot match: start at the longest that can (the same
    // greedy result, but O(L * longest) lookups instead of O(L^2) on a long word).
    const size_t marker = start > 0 ? 2 : 0;
    size_t end = word.size();
    while (end > start && marker + offset[end] - offset[start] > max_token_bytes_) --end;
    for (; end > start; --end) {
      candidate.assign(start > 0 ? "##" : "");
      candidate.append(bytes, offset[start], offset[end] - offset[start]);
      auto it = ids_.find(candidate);
      if (it != ids_.end()) {
        found = it->second;
        break;
      }
    }
    if (found < 0) {
      out.resize(first);
      out.push_back(unk_id_);
      return;
    }
    out.push_back(found);
    start = end;
  }
}

// Special tokens written in the raw text are matched first (leftmost, then longest); the text between them is
// normalized, split into words and cut into word pieces.
void WordPieceTokenizer::append_ids(std::string_view text, std::vector<int64_t>& out) const {
  size_t pos = 0;
  size_t piece_start = 0;
  auto flush = [&](size_t end) {
    if (end <= piece_start) return;
    const std::u32string normalized = normalize_code_points(decode_utf8(text.substr(piece_start, end - piece_start)));
    for (const std::u32string& word : split_words(normalized)) word_pieces(word, out);
  };
  while (pos < text.size()) {
    if (!special_first_byte_[static_cast<unsigned char>(text[pos])]) {  // no special token starts here
      ++pos;
      continue;
    }
    const std::string* match = nullptr;
    for (const std::string& sp : specials_) {
      if (text.compare(pos, sp.size(), sp) == 0 && (!match || sp.size() > match->size())) match = &sp;
    }
    if (!match) {
      ++pos;
      continue;
    }
    flush(pos);
    out.push_back(ids_.at(*match));
    pos += match->size();
    piece_start = pos;
  }
  flush(text.size());
}

std::vector<std::string> WordPieceTokenizer::tokenize(std::string_view text) const {
  std::vector<int64_t> ids;
  append_ids(text, ids);
  std::vector<std::string> pieces;
  pieces.reserve(ids.size());
  for (int64_t id : ids) pieces.push_back(vocab_[static_cast<size_t>(id)]);
  return pieces;
}

std::vector<int64_t> WordPieceTokenizer::encode(std::string_view text, int64_t max_length) const {
  QKV_CHECK_ARG(max_length >= 2, "[wordpiece] max_length must be >= 2 to hold [CLS] and [SEP], got ", max_length);
  std::vector<int64_t> ids{cls_id_};
  append_ids(text, ids);
  if (static_cast<int64_t>(ids.size()) > max_length - 1) ids.resize(static_cast<size_t>(max_length - 1));
  ids.push_back(sep_id_);
  return ids;
}

TokenBatch WordPieceTokenizer::encode_batch(const std::vector<std::string>& texts, int64_t max_length) const {
  QKV_CHECK_ARG(max_length >= 2, "[wordpiece] max_length must be >= 2 to hold [CLS] and [SEP], got ", max_length);
  std::vector<std::vector<int64_t>> rows;
  rows.reserve(texts.size());
  size_t longest = 0;
  for (const std::string& t : texts) {
    rows.push_back(encode(t, max_length));
    longest = std::max(longest, rows.back().size());
  }
  const auto b = static_cast<int64_t>(rows.size());
  const auto t = static_cast<int64_t>(longest);
  TokenBatch batch;
  batch.ids.shape = {b, t};
  batch.attention_mask.shape = {b, t};
  batch.ids.data.assign(static_cast<size_t>(b * t), pad_id_);
  batch.attention_mask.data.assign(static_cast<size_t>(b * t), 0);
  for (size_t i = 0; i < rows.size(); ++i) {
    std::copy(rows[i].begin(), rows[i].end(), batch.ids.data.begin() + static_cast<int64_t>(i) * t);
    std::fill_n(batch.attention_mask.data.begin() + static_cast<int64_t>(i) * t, rows[i].size(), 1);
    batch.lengths.push_back(static_cast<int64_t>(rows[i].size()));
  }
  return batch;
}

}  // namespace qkv::models
