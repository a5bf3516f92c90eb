// The BPE tokenizer of the language models, step for step as HF tokenizers runs it: added tokens split out first,
// then normalizer, pre-tokenizer, the BPE model (ranked merges, byte fallback), post-processor; decoder steps back.
#include "qkv/text/bpe.h"

#include <algorithm>
#include <array>
#include <memory>
#include <queue>
#include <unordered_map>

#include "qkv/core/error.h"
#include "qkv/core/json.h"
#include "qkv/core/utf8.h"
#include "qkv/text/tokenizer.h"
#include "bpe_tables.h"
#include "regex.h"

namespace qkv::text {

const char* const kGpt2Pattern = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
const char* const kLlama3Pattern =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const char* const kQwen2Pattern =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

namespace {

struct ByteMap {
  std::array<char32_t, 256> to_cp{};
  std::unordered_map<char32_t, int> to_byte;
  ByteMap() {
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      const bool kept = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
      to_cp[b] = kept ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + n++);
      to_byte[to_cp[b]] = b;
    }
  }
};

const ByteMap& byte_map() {
  static const ByteMap map;
  return map;
}

// Code points of valid UTF-8 text, with their byte offsets.
std::vector<std::pair<size_t, size_t>> chars_of(std::string_view s) {
  std::vector<std::pair<size_t, size_t>> out;
  for (size_t i = 0; i < s.size();) {
    const size_t n = utf8_decode(s, i);
    QKV_ASSERT(n > 0);
    out.emplace_back(i, n);
    i += n;
  }
  return out;
}

void replace_all(std::string& s, const std::string& from, const std::string& to) {
  if (from.empty()) return;
  std::string out;
  size_t pos = 0;
  for (size_t hit; (hit = s.find(from, pos)) != std::string::npos; pos = hit + from.size()) {
    out.append(s, pos, hit - pos);
    out += to;
  }
  out.append(s, pos, std::string::npos);
  s.swap(out);
}

// HF's NormalizedString::split over the (start, end, is_match) cover of a piece.
std::vector<std::string> split_by_matches(std::string_view text, const std::vector<std::pair<size_t, size_t>>& m,
                                          const std::string& behavior, bool invert) {
  struct Part { size_t s, e; bool match; };
  std::vector<Part> parts;
  size_t prev = 0;
  for (const auto& [s, e] : m) {
    if (prev != s) parts.push_back({prev, s, false});
    parts.push_back({s, e, true});
    prev = e;
  }
  if (prev != text.size()) parts.push_back({prev, text.size(), false});
  if (invert)
    for (auto& p : parts) p.match = !p.match;
  std::vector<Part> out;  // match = remove
  if (behavior == "Isolated") {
    for (const auto& p : parts) out.push_back({p.s, p.e, false});
  } else if (behavior == "Removed") {
    out = parts;
  } else if (behavior == "Contiguous") {
    bool previous = false;
    for (const auto& p : parts) {
      if (p.match == previous && !out.empty()) out.back().e = p.e;
      else out.push_back({p.s, p.e, false});
      previous = p.match;
    }
  } else if (behavior == "MergedWithPrevious") {
    bool previous = false;
    for (const auto& p : parts) {
      if (p.match && !previous && !out.empty()) out.back().e = p.e;
      else out.push_back({p.s, p.e, false});
      previous = p.match;
    }
  } else if (behavior == "MergedWithNext") {
    bool previous = false;
    for (auto it = parts.rbegin(); it != parts.rend(); ++it) {
      if (it->match && !previous && !out.empty()) out.back().s = it->s;
      else out.push_back({it->s, it->e, false});
      previous = it->match;
    }
    std::reverse(out.begin(), out.end());
  } else {
    QKV_ASSERT(false);
  }
  std::vector<std::string> pieces;
  for (const auto& p : out)
    if (!p.match && p.e > p.s) pieces.emplace_back(text.substr(p.s, p.e - p.s));
  return pieces;
}

bool known_behavior(const std::string& b) {
  return b == "Isolated" || b == "Removed" || b == "Contiguous" || b == "MergedWithPrevious" ||
         b == "MergedWithNext";
}

// A piece of text on its way through the pre-tokenizer; `first` when it starts at offset 0 of the input.
struct Piece {
  std::string text;
  bool first;
};

std::string utf8_lossy(std::string_view s);

// The byte tokens' value, or -1: "<0xAB>" (upper-case hex, as HF writes them).
int byte_token_value(std::string_view t) {
  if (t.size() != 6 || t.substr(0, 3) != "<0x" || t[5] != '>') return -1;
  int v = 0;
  for (size_t i = 3; i < 5; ++i) {
    const char c = t[i];
    if (c >= '0' && c <= '9') v = v * 16 + (c - '0');
    else if (c >= 'A' && c <= 'F') v = v * 16 + (c - 'A' + 10);
    else if (c >= 'a' && c <= 'f') v = v * 16 + (c - 'a' + 10);
    else return -1;
  }
  return v;
}

std::string byte_token_name(uint8_t b) {
  static const char* hex = "0123456789ABCDEF";
  return std::string("<0x") + hex[b >> 4] + hex[b & 15] + ">";
}

class BpeTokenizer final : public Tokenizer {
 public:
  explicit BpeTokenizer(TokenizerSpec spec);

  std::vector<int64_t> encode(std::string_view text, bool add_special_tokens) const override;
  std::vector<int64_t> encode(std::string_view text, bool add_special_tokens,
                              const std::vector<std::pair<size_t, size_t>>& plain) const override;
  std::string decode_bytes(const std::vector<int64_t>& ids, bool skip_special_tokens) const override {
    return run_decoder(ids, skip_special_tokens, false);
  }
  std::string decode(const std::vector<int64_t>& ids, bool skip_special_tokens) const override {
    return run_decoder(ids, skip_special_tokens, true);
  }
  int64_t vocab_size() const override { return static_cast<int64_t>(tokens_.size()); }
  const std::string& token(int64_t id) const override {
    QKV_CHECK_ARG(id >= 0 && id < vocab_size(), "[tokenizer] id ", id, " is outside the vocabulary [0, ",
                  vocab_size(), ")");
    return tokens_[id];
  }
  int64_t id(std::string_view token) const override {
    auto it = added_ids_.find(std::string(token));
    if (it != added_ids_.end()) return it->second;
    return vocab_id(token);
  }
  int64_t bos_token_id() const override { return spec_.bos_id; }
  int64_t eos_token_id() const override { return spec_.eos_id; }
  const std::vector<int64_t>& special_token_ids() const override { return special_ids_; }
  bool is_special(int64_t id) const override {
    return id >= 0 && id < vocab_size() && special_[static_cast<size_t>(id)];
  }

 private:
  void bpe(const std::string& word, std::vector<int64_t>& out) const;
  std::vector<Piece> pre_tokenize(Piece piece) const;
  std::string run_decoder(const std::vector<int64_t>& ids, bool skip_special, bool lossy) const;

  // The model vocabulary's id of a token string, -1 when absent.
  int64_t vocab_id(std::string_view token) const {
    return vocab_index_.find(token, [this](int32_t id) -> const std::string& { return vocab_string(id); });
  }
  // The model vocabulary's string of id (what vocab_index_ keys on): tokens_[id] unless an added token took the id
  // with other content.
  const std::string& vocab_string(int32_t id) const {
    if (!shadowed_.empty()) {
      auto it = shadowed_.find(id);
      if (it != shadowed_.end()) return it->second;
    }
    return tokens_[static_cast<size_t>(id)];
  }

  TokenizerSpec spec_;  // everything but vocab (moved into tokens_) and merges (in merges_), released when built
  std::vector<std::string> tokens_;  // id -> string (added tokens' content where they have the id)
  std::unordered_map<int32_t, std::string> shadowed_;  // id -> its vocab string, where an added token replaced it
  std::vector<char> special_;
  std::vector<int64_t> special_ids_;
  std::unordered_map<std::string, int64_t> added_ids_;
  detail::VocabIndex vocab_index_;
  detail::MergeTable merges_;
  std::array<int64_t, 256> byte_ids_{};  // <0xAB> token ids (-1 when absent)
  std::vector<std::unique_ptr<detail::Regex>> regexes_;  // one per kSplit / kByteLevel(use_regex) step
};

BpeTokenizer::BpeTokenizer(TokenizerSpec spec) : spec_(std::move(spec)) {
  const std::string& src = spec_.source;
  const size_t n_vocab = spec_.vocab.size();
  QKV_CHECK_ARG(n_vocab < static_cast<size_t>(INT32_MAX), "[tokenizer] ", src, ": ", n_vocab,
                " tokens (at most 2^31 - 2)");
  for (size_t i = 0; i < n_vocab; ++i) {
    const std::string& t = spec_.vocab[i];
    if (t.empty()) continue;
    QKV_CHECK_ARG(json::first_invalid_utf8(t) == std::string::npos, "[tokenizer] ", src, ": token ", i,
                  " is not valid UTF-8");
  }
  int64_t size = static_cast<int64_t>(n_vocab);
  for (const auto& a : spec_.added) {
    QKV_CHECK_ARG(a.id >= 0, "[tokenizer] ", src, ": added token '", a.content, "' has id ", a.id);
    QKV_CHECK_ARG(a.id < INT32_MAX, "[tokenizer] ", src, ": added token '", a.content, "' has id ", a.id,
                  " (at most 2^31 - 2)");
    QKV_CHECK_ARG(!a.content.empty(), "[tokenizer] ", src, ": added token ", a.id, " is empty");
    QKV_CHECK_RUNTIME(!a.single_word, "[tokenizer] ", src, ": added token '", a.content,
                      "' has single_word = true, which this reader does not implement");
    QKV_CHECK_RUNTIME(!a.normalized || spec_.normalizer.empty(), "[tokenizer] ", src, ": added token '",
                      a.content, "' has normalized = true beside a normalizer, which this reader does not implement");
    size = std::max(size, a.id + 1);
  }
  // The vocabulary moves into tokens_ (one copy of every string); an added token's content replaces the string of
  // its id there, and the vocab string it replaced, when different, stays in shadowed_ for the vocab index.
  tokens_ = std::move(spec_.vocab);
  std::vector<std::string>().swap(spec_.vocab);
  tokens_.resize(static_cast<size_t>(size));
  // Keys: the vocab strings, before any added token replaces one.
  vocab_index_.build(n_vocab, [this](int32_t id) -> const std::string& { return vocab_string(id); });
  special_.assign(static_cast<size_t>(size), 0);
  for (const auto& a : spec_.added) {
    std::string& t = tokens_[static_cast<size_t>(a.id)];
    if (static_cast<size_t>(a.id) < n_vocab && !t.empty() && t != a.content)
      shadowed_.try_emplace(static_cast<int32_t>(a.id), std::move(t));
    t = a.content;
    added_ids_[a.content] = a.id;
    if (a.special) special_[static_cast<size_t>(a.id)] = 1;
  }
  for (int64_t i = 0; i < size; ++i)
    if (special_[static_cast<size_t>(i)]) special_ids_.push_back(i);
  merges_.reserve(spec_.merges.size());
  std::string joined;
  for (size_t r = 0; r < spec_.merges.size(); ++r) {
    const auto& [l, rt] = spec_.merges[r];
    joined.assign(l).append(rt);
    const int64_t a = vocab_id(l), b = vocab_id(rt), c = vocab_id(joined);
    QKV_CHECK_ARG(a >= 0 && b >= 0, "[tokenizer] ", src, ": merge ", r, " ('", l, "' '", rt,
                  "') names a token missing from the vocabulary");
    QKV_CHECK_ARG(c >= 0, "[tokenizer] ", src, ": merge ", r, " ('", l, "' '", rt,
                  "') gives a token missing from the vocabulary");
    QKV_CHECK_ARG(r < static_cast<size_t>(INT32_MAX), "[tokenizer] ", src, ": more than 2^31 - 1 merges");
    merges_.insert(static_cast<int32_t>(a), static_cast<int32_t>(b), static_cast<int32_t>(r),
                   static_cast<int32_t>(c));
  }
  std::vector<std::pair<std::string, std::string>>().swap(spec_.merges);  // in merges_ now
  for (int b = 0; b < 256; ++b) byte_ids_[b] = vocab_id(byte_token_name(static_cast<uint8_t>(b)));
  auto check_id = [&](int64_t id, const char* what) {
    QKV_CHECK_ARG(id >= -1 && id < size, "[tokenizer] ", src, ": ", what, " id ", id, " is outside [0, ", size,
                  ")");
  };
  check_id(spec_.unk_id, "unk");
  check_id(spec_.bos_id, "bos");
  check_id(spec_.eos_id, "eos");
  check_id(spec_.pad_id, "pad");
  for (int64_t id : spec_.prefix) check_id(id, "post-processor");
  for (int64_t id : spec_.suffix) check_id(id, "post-processor");
  for (const auto& step : spec_.pre_tokenizer) {
    using K = PreTokenizerStep::Kind;
    if (step.kind == K::kSplit) {
      QKV_CHECK_RUNTIME(known_behavior(step.behavior), "[tokenizer] ", src, ": pre_tokenizer Split behavior '",
                        step.behavior, "' is not implemented");
      if (step.pattern_is_regex) regexes_.push_back(std::make_unique<detail::Regex>(step.pattern, src));
    } else if (step.kind == K::kByteLevel && step.use_regex) {
      regexes_.push_back(std::make_unique<detail::Regex>(kGpt2Pattern, src));
    } else if (step.kind == K::kDigits) {
      regexes_.push_back(std::make_unique<detail::Regex>("\\p{N}", src));
    } else if (step.kind == K::kMetaspace) {
      QKV_CHECK_RUNTIME(step.prepend_scheme == "always" || step.prepend_scheme == "first" ||
                            step.prepend_scheme == "never",
                        "[tokenizer] ", src, ": pre_tokenizer Metaspace prepend_scheme '", step.prepend_scheme,
                        "' is not implemented");
      QKV_CHECK_ARG(utf8_decode(step.replacement, 0) == step.replacement.size(), "[tokenizer] ", src,
                    ": pre_tokenizer Metaspace replacement must be one character");
    }
  }
  for (const auto& step : spec_.decoder) {
    if (step.kind == DecoderStep::Kind::kStrip) {
      QKV_CHECK_ARG(step.content.size() == 1, "[tokenizer] ", src,
                    ": decoder Strip content must be one ASCII character, got '", step.content, "'");
    }
  }
}

std::vector<Piece> BpeTokenizer::pre_tokenize(Piece piece) const {
  std::vector<Piece> pieces{std::move(piece)};
  size_t regex = 0;
  for (const auto& step : spec_.pre_tokenizer) {
    using K = PreTokenizerStep::Kind;
    std::vector<Piece> next;
    const detail::Regex* re = nullptr;
    if ((step.kind == K::kSplit && step.pattern_is_regex) || (step.kind == K::kByteLevel && step.use_regex) ||
        step.kind == K::kDigits)
      re = regexes_[regex++].get();
    for (auto& p : pieces) {
      std::vector<std::string> parts;
      if (step.kind == K::kSplit) {
        std::vector<std::pair<size_t, size_t>> m;
        if (re) {
          m = re->find_all(p.text);
        } else if (!step.pattern.empty()) {
          for (size_t pos = 0, hit; (hit = p.text.find(step.pattern, pos)) != std::string::npos;
               pos = hit + step.pattern.size())
            m.emplace_back(hit, hit + step.pattern.size());
        }
        parts = split_by_matches(p.text, m, step.behavior, step.invert);
      } else if (step.kind == K::kDigits) {
        std::vector<std::pair<size_t, size_t>> m;
        for (const auto& [s, e] : re->find_all(p.text)) {  // \p{N} matches one character at a time
          m.emplace_back(s, e);
        }
        parts = split_by_matches(p.text, m, step.individual_digits ? "Isolated" : "Contiguous", false);
      } else if (step.kind == K::kByteLevel) {
        std::string t = p.text;
        if (step.add_prefix_space && (t.empty() || t[0] != ' ')) t.insert(t.begin(), ' ');
        if (re) {
          parts = split_by_matches(t, re->find_all(t), "Isolated", false);
        } else if (!t.empty()) {
          parts.push_back(t);
        }
        for (auto& x : parts) x = bytes_to_unicode(x);
      } else {  // kMetaspace
        std::string t = p.text;
        replace_all(t, " ", step.replacement);
        const bool starts = t.compare(0, step.replacement.size(), step.replacement) == 0;
        if (!starts && (step.prepend_scheme == "always" || (step.prepend_scheme == "first" && p.first)))
          t.insert(0, step.replacement);
        if (step.split) {
          std::vector<std::pair<size_t, size_t>> m;
          for (size_t pos = 0, hit; (hit = t.find(step.replacement, pos)) != std::string::npos;
               pos = hit + step.replacement.size())
            m.emplace_back(hit, hit + step.replacement.size());
          parts = split_by_matches(t, m, "MergedWithNext", false);
        } else if (!t.empty()) {
          parts.push_back(t);
        }
      }
      for (size_t i = 0; i < parts.size(); ++i) next.push_back({std::move(parts[i]), p.first && i == 0});
    }
    pieces.swap(next);
  }
  return pieces;
}

// HF's BPE::merge_word and Word::merge_all: symbols from the characters (byte fallback, unk fused), then the
// lowest-rank pair first (leftmost among equal ranks) through a heap, stale entries skipped.
void BpeTokenizer::bpe(const std::string& word, std::vector<int64_t>& out) const {
  if (spec_.ignore_merges) {
    const int64_t whole = vocab_id(word);
    if (whole >= 0) {
      out.push_back(whole);
      return;
    }
  }
  struct Symbol { int64_t id; int64_t prev, next; bool alive; };
  std::vector<Symbol> sym;
  auto add = [&](int64_t id) { sym.push_back({id, static_cast<int64_t>(sym.size()) - 1, -1, true}); };
  bool pending_unk = false;
  for (const auto& [pos, len] : chars_of(word)) {
    const int64_t cid = vocab_id(std::string_view(word).substr(pos, len));
    if (cid >= 0) {
      if (pending_unk) add(spec_.unk_id), pending_unk = false;
      add(cid);
      continue;
    }
    if (spec_.byte_fallback) {
      bool all = true;
      for (size_t k = 0; k < len; ++k) all = all && byte_ids_[static_cast<uint8_t>(word[pos + k])] >= 0;
      if (all) {
        for (size_t k = 0; k < len; ++k) add(byte_ids_[static_cast<uint8_t>(word[pos + k])]);
        continue;
      }
    }
    if (spec_.unk_id >= 0) {
      if (pending_unk && !spec_.fuse_unk) add(spec_.unk_id);
      pending_unk = true;
    }
  }
  if (pending_unk) add(spec_.unk_id);
  for (size_t i = 0; i + 1 < sym.size(); ++i) sym[i].next = static_cast<int64_t>(i + 1);

  struct Merge { int64_t pos, rank, id; };
  auto later = [](const Merge& a, const Merge& b) { return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos; };
  std::priority_queue<Merge, std::vector<Merge>, decltype(later)> queue(later);
  auto lookup = [&](int64_t a, int64_t b) { return merges_.find(a, b); };
  for (size_t i = 0; i + 1 < sym.size(); ++i)
    if (auto m = lookup(sym[i].id, sym[i + 1].id)) queue.push({static_cast<int64_t>(i), m->rank, m->id});
  while (!queue.empty()) {
    const Merge top = queue.top();
    queue.pop();
    Symbol& cur = sym[static_cast<size_t>(top.pos)];
    if (!cur.alive || cur.next < 0) continue;
    Symbol& right = sym[static_cast<size_t>(cur.next)];
    auto m = lookup(cur.id, right.id);
    if (!m || m->id != top.id) continue;
    cur.id = top.id;
    right.alive = false;
    cur.next = right.next;
    if (cur.next >= 0) sym[static_cast<size_t>(cur.next)].prev = top.pos;
    if (cur.prev >= 0)
      if (auto p = lookup(sym[static_cast<size_t>(cur.prev)].id, cur.id)) queue.push({cur.prev, p->rank, p->id});
    if (cur.next >= 0)
      if (auto n = lookup(cur.id, sym[static_cast<size_t>(cur.next)].id)) queue.push({top.pos, n->rank, n->id});
  }
  for (const auto& s : sym)
    if (s.alive) out.push_back(s.id);
}

std::vector<int64_t> BpeTokenizer::encode(std::string_view text, bool add_special_tokens) const {
  return encode(text, add_special_tokens, {});
}

std::vector<int64_t> BpeTokenizer::encode(std::string_view text, bool add_special_tokens,
                                          const std::vector<std::pair<size_t, size_t>>& plain) const {
  const size_t bad = json::first_invalid_utf8(text);
  QKV_CHECK_ARG(bad == std::string_view::npos, "[tokenizer] text is not valid UTF-8 (at byte ", bad, ")");
  std::vector<int64_t> out;
  if (add_special_tokens) out = spec_.prefix;
  size_t offset = 0;
  for (auto& [aid, piece] : split_added_tokens(text, spec_.added, plain)) {
    const bool first = offset == 0;
    offset += piece.size();
    if (aid >= 0) {
      out.push_back(aid);
      continue;
    }
    for (const auto& step : spec_.normalizer) {
      if (step.kind == NormalizerStep::Kind::kPrepend) {
        if (!piece.empty()) piece.insert(0, step.content);
      } else {
        replace_all(piece, step.pattern, step.content);
      }
    }
    if (piece.empty()) continue;
    for (const auto& p : pre_tokenize({piece, first})) bpe(p.text, out);
  }
  if (add_special_tokens) out.insert(out.end(), spec_.suffix.begin(), spec_.suffix.end());
  return out;
}

std::string BpeTokenizer::run_decoder(const std::vector<int64_t>& ids, bool skip_special, bool lossy) const {
  std::vector<std::string> toks;
  toks.reserve(ids.size());
  for (int64_t id : ids) {
    QKV_CHECK_ARG(id >= 0 && id < vocab_size(), "[tokenizer] decode: id ", id, " is outside the vocabulary [0, ",
                  vocab_size(), ")");
    if (skip_special && special_[static_cast<size_t>(id)]) continue;
    toks.push_back(tokens_[static_cast<size_t>(id)]);
  }
  if (spec_.decoder.empty()) {  // HF joins the tokens with spaces when there is no decoder
    std::string s;
    for (size_t i = 0; i < toks.size(); ++i) s += (i ? " " : "") + toks[i];
    return s;
  }
  for (const auto& step : spec_.decoder) {
    using K = DecoderStep::Kind;
    if (step.kind == K::kByteLevel) {
      std::string bytes;
      const auto& map = byte_map();
      for (const auto& t : toks) {
        std::string tb;
        bool all = true;
        for (const auto& [pos, len] : chars_of(t)) {
          char32_t cp = 0;
          utf8_decode(t, pos, &cp);
          auto it = map.to_byte.find(cp);
          if (it == map.to_byte.end()) {
            all = false;
            break;
          }
          tb.push_back(static_cast<char>(it->second));
        }
        bytes += all ? tb : t;
      }
      toks.assign(1, lossy ? utf8_lossy(bytes) : bytes);
    } else if (step.kind == K::kReplace) {
      for (auto& t : toks) replace_all(t, step.pattern, step.content);
    } else if (step.kind == K::kByteFallback) {
      std::vector<std::string> next;
      std::string run;
      size_t run_len = 0;
      auto flush = [&] {
        if (run_len == 0) return;
        if (!lossy || json::first_invalid_utf8(run) == std::string::npos) {
          next.push_back(run);
        } else {
          for (size_t i = 0; i < run_len; ++i) next.emplace_back("\xEF\xBF\xBD");
        }
        run.clear();
        run_len = 0;
      };
      for (auto& t : toks) {
        const int b = byte_token_value(t);
        if (b >= 0) {
          run.push_back(static_cast<char>(b));
          ++run_len;
        } else {
          flush();
          next.push_back(std::move(t));
        }
      }
      flush();
      toks.swap(next);
    } else if (step.kind == K::kFuse) {
      std::string all;
      for (const auto& t : toks) all += t;
      toks.assign(1, all);
    } else if (step.kind == K::kStrip) {
      const char c = step.content[0];
      for (auto& t : toks) {
        size_t a = 0, b = t.size();
        while (a < b && static_cast<int64_t>(a) < step.start && t[a] == c) ++a;
        size_t cut = 0;
        while (b > a && static_cast<int64_t>(cut) < step.stop && t[b - 1] == c) --b, ++cut;
        t = t.substr(a, b - a);
      }
    } else {  // kMetaspace: replacement -> ' ', the first token's leading one dropped unless prepend is "never"
      for (size_t i = 0; i < toks.size(); ++i) {
        std::string& t = toks[i];
        if (i == 0 && step.prepend_scheme != "never" &&
            t.compare(0, step.replacement.size(), step.replacement) == 0)
          t.erase(0, step.replacement.size());
        replace_all(t, step.replacement, " ");
      }
    }
  }
  std::string s;
  for (const auto& t : toks) s += t;
  return s;
}

std::string utf8_lossy(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    const size_t n = utf8_decode(s, i);
    if (n) {
      out.append(s.substr(i, n));
      i += n;
      continue;
    }
    // The maximal ill-formed subpart: the longest prefix of a well-formed sequence (Unicode 3.9, table 3-7).
    const auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
    const unsigned char b0 = b(i);
    size_t need = 0;
    unsigned char lo = 0x80, hi = 0xBF;
    if (b0 >= 0xC2 && b0 <= 0xDF) need = 1;
    else if (b0 >= 0xE0 && b0 <= 0xEF) need = 2, lo = b0 == 0xE0 ? 0xA0 : 0x80, hi = b0 == 0xED ? 0x9F : 0xBF;
    else if (b0 >= 0xF0 && b0 <= 0xF4) need = 3, lo = b0 == 0xF0 ? 0x90 : 0x80, hi = b0 == 0xF4 ? 0x8F : 0xBF;
    size_t k = 1;
    if (need && i + 1 < s.size() && b(i + 1) >= lo && b(i + 1) <= hi) {
      k = 2;
      while (k <= need && i + k < s.size() && (b(i + k) & 0xC0) == 0x80) ++k;
    }
    out += "\xEF\xBF\xBD";
    i += k;
  }
  return out;
}

}  // namespace

char32_t byte_to_unicode(uint8_t b) { return byte_map().to_cp[b]; }

int unicode_to_byte(char32_t cp) {
  const auto& m = byte_map().to_byte;
  auto it = m.find(cp);
  return it == m.end() ? -1 : it->second;
}

std::string bytes_to_unicode(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char c : bytes) utf8_append(byte_to_unicode(c), out);
  return out;
}

std::string lossy_utf8(std::string_view bytes) { return utf8_lossy(bytes); }

std::vector<std::pair<int64_t, std::string>> split_added_tokens(std::string_view text,
                                                                const std::vector<AddedToken>& added,
                                                                const std::vector<std::pair<size_t, size_t>>& plain) {
  std::vector<std::pair<int64_t, std::string>> out;
  auto in_plain = [&](size_t b, size_t e) {  // [b, e) overlaps a range where no added token may match
    for (const auto& [ps, pe] : plain)
      if (b < pe && ps < e) return true;
    return false;
  };
  if (text.empty()) return out;
  std::array<std::vector<const AddedToken*>, 256> by_first;
  for (const auto& a : added)
    if (!a.content.empty()) by_first[static_cast<unsigned char>(a.content[0])].push_back(&a);
  for (auto& v : by_first)
    std::stable_sort(v.begin(), v.end(),
                     [](const AddedToken* x, const AddedToken* y) { return x->content.size() > y->content.size(); });
  auto space_before = [&](size_t end, size_t floor) {  // start of the whitespace run ending at `end`
    size_t s = end;
    while (s > floor) {
      size_t p = s - 1;
      while (p > floor && (static_cast<unsigned char>(text[p]) & 0xC0) == 0x80) --p;
      char32_t cp = 0;
      if (!utf8_decode(text, p, &cp) || !detail::is_white_space(cp)) break;
      s = p;
    }
    return s;
  };
  auto space_after = [&](size_t start) {
    size_t e = start;
    while (e < text.size()) {
      char32_t cp = 0;
      const size_t n = utf8_decode(text, e, &cp);
      if (!n || !detail::is_white_space(cp)) break;
      e += n;
    }
    return e;
  };
  size_t done = 0;  // text before this offset is emitted
  for (size_t i = 0; i < text.size();) {
    const AddedToken* hit = nullptr;
    for (const AddedToken* a : by_first[static_cast<unsigned char>(text[i])]) {
      if (text.compare(i, a->content.size(), a->content) == 0 && !in_plain(i, i + a->content.size())) {
        hit = a;
        break;
      }
    }
    if (!hit) {
      ++i;
      continue;
    }
    size_t start = i, stop = i + hit->content.size();
    if (hit->lstrip) start = space_before(start, done);
    if (hit->rstrip) stop = space_after(stop);
    if (done < start) out.emplace_back(-1, std::string(text.substr(done, start - done)));
    out.emplace_back(hit->id, std::string(text.substr(start, stop - start)));
    done = stop;
    i = stop;
  }
  if (done < text.size()) out.emplace_back(-1, std::string(text.substr(done)));
  return out;
}

std::vector<std::string> regex_split(std::string_view text, const std::string& pattern, const std::string& behavior,
                                     bool invert) {
  QKV_CHECK_ARG(known_behavior(behavior), "[tokenizer] split behavior '", behavior, "' is not one of Isolated, "
                "Removed, Contiguous, MergedWithPrevious, MergedWithNext");
  const detail::Regex re(pattern, "regex_split");
  return split_by_matches(text, re.find_all(text), behavior, invert);
}

std::unique_ptr<Tokenizer> make_tokenizer(TokenizerSpec spec) {
  return std::make_unique<BpeTokenizer>(std::move(spec));
}

}  // namespace qkv::text
