// The tokenizer interface's shared parts: the streaming decoder, the GGUF metadata -> spec conversion (as
// transformers' GGUF converter and llama.cpp read those keys), and the path dispatch of load_tokenizer.
#include "qkv/text/tokenizer.h"

#include <algorithm>
#include <filesystem>
#include <unordered_map>
#include <unordered_set>

#include "qkv/core/error.h"
#include "qkv/core/utf8.h"

namespace qkv::text {

size_t unfinished_utf8_tail(std::string_view s) {
  // Walk back over at most 3 continuation bytes to a lead byte; the tail is unfinished when that lead byte wants
  // more bytes than follow it and every byte so far could still be part of a well-formed sequence.
  const size_t n = s.size();
  for (size_t k = 1; k <= std::min<size_t>(3, n); ++k) {
    const auto b0 = static_cast<unsigned char>(s[n - k]);
    if ((b0 & 0xC0) == 0x80) continue;
    size_t need = 0;
    unsigned char lo = 0x80, hi = 0xBF;
    if (b0 >= 0xC2 && b0 <= 0xDF) need = 2;
    else if (b0 >= 0xE0 && b0 <= 0xEF) need = 3, lo = b0 == 0xE0 ? 0xA0 : 0x80, hi = b0 == 0xED ? 0x9F : 0xBF;
    else if (b0 >= 0xF0 && b0 <= 0xF4) need = 4, lo = b0 == 0xF0 ? 0x90 : 0x80, hi = b0 == 0xF4 ? 0x8F : 0xBF;
    if (need <= k) return 0;  // an ASCII byte, an invalid lead byte, or a sequence already long enough
    if (k >= 2) {
      const auto b1 = static_cast<unsigned char>(s[n - k + 1]);
      if (b1 < lo || b1 > hi) return 0;
    }
    return k;
  }
  return 0;
}

StreamDecoder::StreamDecoder(const Tokenizer& tokenizer, bool skip_special_tokens)
    : tokenizer_(tokenizer), skip_special_(skip_special_tokens) {}

std::string StreamDecoder::push(int64_t id) {
  ids_.push_back(id);
  const std::string full = tokenizer_.decode_bytes(ids_, skip_special_);
  // The decoders used here only append when an id is appended (the first token's strip happens once, on the
  // first id kept as context), so `full` extends what was returned before.
  QKV_ASSERT(full.size() >= done_);
  const std::string_view fresh = std::string_view(full).substr(done_);
  const size_t held = unfinished_utf8_tail(fresh);
  std::string out = lossy_utf8(fresh.substr(0, fresh.size() - held));
  if (held == 0) {
    ids_.assign(1, id);  // the last id stays as context for the next one
    done_ = tokenizer_.decode_bytes(ids_, skip_special_).size();
  } else {
    done_ = full.size() - held;
  }
  return out;
}

std::string StreamDecoder::flush() {
  std::string out;
  if (!ids_.empty()) {
    const std::string full = tokenizer_.decode_bytes(ids_, skip_special_);
    out = lossy_utf8(std::string_view(full).substr(std::min(done_, full.size())));
  }
  ids_.clear();
  done_ = 0;
  return out;
}

namespace {

// transformers' generate_merges: every split of every token into two tokens of the vocabulary, ordered by the
// whole token's score (best first), then the left part's length, then the right part's (longest first); ties
// keep the vocabulary's order, and the splits of one token go in (id left, id right) order.
std::vector<std::pair<std::string, std::string>> merges_from_scores(const std::vector<std::string>& tokens,
                                                                    const std::vector<float>& scores) {
  std::unordered_map<std::string, int64_t> ids;
  std::unordered_map<std::string, float> score_of;  // the last entry wins, as dict(zip(tokens, scores))
  std::vector<std::string> order;                   // dict insertion order: first occurrence
  for (size_t i = 0; i < tokens.size(); ++i) {
    ids[tokens[i]] = static_cast<int64_t>(i);  // {token: index}: the last index wins
    if (score_of.find(tokens[i]) == score_of.end()) order.push_back(tokens[i]);
    score_of[tokens[i]] = scores[i];
  }
  struct M { std::string l, r; float score; size_t ll, rl; };
  std::vector<M> merges;
  for (const auto& t : order) {
    std::vector<M> local;
    std::vector<size_t> cuts;
    for (size_t i = 0; i < t.size();) {
      const size_t n = utf8_decode(t, i);
      i += n ? n : 1;
      if (i < t.size()) cuts.push_back(i);
    }
    const size_t chars = cuts.size() + 1;
    for (size_t c = 0; c < cuts.size(); ++c) {
      std::string l = t.substr(0, cuts[c]), r = t.substr(cuts[c]);
      if (ids.count(l) && ids.count(r)) local.push_back({l, r, score_of[t], c + 1, chars - c - 1});
    }
    std::stable_sort(local.begin(), local.end(), [&](const M& a, const M& b) {
      const int64_t al = ids[a.l], bl = ids[b.l];
      return al != bl ? al < bl : ids[a.r] < ids[b.r];
    });
    for (auto& m : local) merges.push_back(std::move(m));
  }
  std::stable_sort(merges.begin(), merges.end(), [](const M& a, const M& b) {
    if (a.score != b.score) return a.score > b.score;
    if (a.ll != b.ll) return a.ll > b.ll;
    return a.rl > b.rl;
  });
  std::vector<std::pair<std::string, std::string>> out;
  out.reserve(merges.size());
  for (auto& m : merges) out.emplace_back(std::move(m.l), std::move(m.r));
  return out;
}

}  // namespace

TokenizerSpec spec_from_gguf(GgufTokenizerData d) {
  const std::string& src = d.source;
  TokenizerSpec spec;
  spec.source = src;
  QKV_CHECK_RUNTIME(d.model == "gpt2" || d.model == "llama", "[tokenizer] ", src, ": tokenizer.ggml.model '",
                    d.model, "' is not implemented (gpt2 and llama are)");
  QKV_CHECK_ARG(!d.tokens.empty(), "[tokenizer] ", src, ": tokenizer.ggml.tokens is empty");
  QKV_CHECK_ARG(d.token_types.empty() || d.token_types.size() == d.tokens.size(), "[tokenizer] ", src,
                ": tokenizer.ggml.token_type has ", d.token_types.size(), " entries for ", d.tokens.size(),
                " tokens");
  const auto n = static_cast<int64_t>(d.tokens.size());
  for (auto [id, key] : {std::pair{d.bos_id, "bos_token_id"}, {d.eos_id, "eos_token_id"},
                         {d.unk_id, "unknown_token_id"}, {d.pad_id, "padding_token_id"}})
    QKV_CHECK_ARG(id >= -1 && id < n, "[tokenizer] ", src, ": tokenizer.ggml.", key, " ", id,
                  " is outside the vocabulary [0, ", n, ")");
  spec.bos_id = d.bos_id;
  spec.eos_id = d.eos_id;
  spec.pad_id = d.pad_id;
  for (size_t i = 0; i < d.token_types.size(); ++i) {
    const int32_t t = d.token_types[i];
    QKV_CHECK_ARG(t >= 1 && t <= 6, "[tokenizer] ", src, ": tokenizer.ggml.token_type[", i, "] is ", t,
                  " (1 to 6 expected)");
    if (t == static_cast<int32_t>(GgufTokenType::kControl) || t == static_cast<int32_t>(GgufTokenType::kUserDefined)) {
      AddedToken a;
      a.id = static_cast<int64_t>(i);
      a.content = d.tokens[i];
      a.special = t == static_cast<int32_t>(GgufTokenType::kControl);
      if (!a.content.empty()) spec.added.push_back(a);
    }
  }
  if (d.model == "gpt2") {
    QKV_CHECK_ARG(!d.merges.empty(), "[tokenizer] ", src, ": tokenizer.ggml.merges is missing or empty");
    for (size_t i = 0; i < d.merges.size(); ++i) {
      const std::string& m = d.merges[i];
      const size_t sp = m.find(' ');
      QKV_CHECK_ARG(sp != std::string::npos && sp > 0 && sp + 1 < m.size() && m.find(' ', sp + 1) == std::string::npos,
                    "[tokenizer] ", src, ": tokenizer.ggml.merges[", i, "] '", m, "' is not two tokens and a space");
      spec.merges.emplace_back(m.substr(0, sp), m.substr(sp + 1));
    }
    std::vector<std::string>().swap(d.merges);  // parsed: freed before the tokenizer is built
    PreTokenizerStep bl;
    bl.kind = PreTokenizerStep::Kind::kByteLevel;
    const std::string& pre = d.pre;
    if (pre == "gpt2" || pre == "default" || pre.empty()) {
      bl.use_regex = true;
    } else if (pre == "smollm") {  // SmolLM's tokenizer.json: Digits(individual) then ByteLevel
      PreTokenizerStep digits;
      digits.kind = PreTokenizerStep::Kind::kDigits;
      digits.individual_digits = true;
      spec.pre_tokenizer.push_back(digits);
      bl.use_regex = true;
    } else if (pre == "llama-bpe" || pre == "llama3" || pre == "llama-v3" || pre == "qwen2") {
      PreTokenizerStep split;
      split.pattern = pre == "qwen2" ? kQwen2Pattern : kLlama3Pattern;
      spec.pre_tokenizer.push_back(split);
      bl.use_regex = false;
      spec.ignore_merges = pre != "qwen2";  // Llama 3's tokenizer.json (and llama.cpp's llama-bpe)
    } else {
      throw std::runtime_error(::qkv::detail::concat("[tokenizer] ", src, ": tokenizer.ggml.pre '", pre,
                                              "' is not implemented (smollm, llama-bpe, qwen2, gpt2 and default are)"));
    }
    spec.pre_tokenizer.push_back(bl);
    DecoderStep dec;
    dec.kind = DecoderStep::Kind::kByteLevel;
    spec.decoder.push_back(dec);
    if (d.add_bos == 1 && d.bos_id >= 0) spec.prefix.push_back(d.bos_id);
    if (d.add_eos == 1 && d.eos_id >= 0) spec.suffix.push_back(d.eos_id);
    spec.vocab = std::move(d.tokens);
    return spec;
  }
  // llama: SentencePiece BPE. transformers' LlamaTokenizer: merges rebuilt from the scores, byte fallback, fused
  // unknowns, Metaspace (prepend first, no split), decoder Replace + ByteFallback + Fuse + Strip, bos added.
  QKV_CHECK_ARG(d.scores.size() == d.tokens.size(), "[tokenizer] ", src, ": tokenizer.ggml.scores has ",
                d.scores.size(), " entries for ", d.tokens.size(), " tokens");
  spec.merges = d.merges.empty() ? merges_from_scores(d.tokens, d.scores) : std::vector<std::pair<std::string,
                                                                                                   std::string>>{};
  for (size_t i = 0; i < d.merges.size(); ++i) {
    const std::string& m = d.merges[i];
    const size_t sp = m.find(' ');
    QKV_CHECK_ARG(sp != std::string::npos, "[tokenizer] ", src, ": tokenizer.ggml.merges[", i, "] '", m,
                  "' is not two tokens and a space");
    spec.merges.emplace_back(m.substr(0, sp), m.substr(sp + 1));
  }
  std::vector<std::string>().swap(d.merges);
  spec.byte_fallback = true;
  spec.fuse_unk = true;
  spec.unk_id = d.unk_id;
  const bool prefix_space = d.add_space_prefix != 0;
  PreTokenizerStep ms;
  ms.kind = PreTokenizerStep::Kind::kMetaspace;
  ms.prepend_scheme = prefix_space ? "first" : "never";
  ms.split = false;
  spec.pre_tokenizer.push_back(ms);
  DecoderStep rep;
  rep.kind = DecoderStep::Kind::kReplace;
  rep.pattern = "\xE2\x96\x81";
  rep.content = " ";
  DecoderStep bf, fuse, strip;
  bf.kind = DecoderStep::Kind::kByteFallback;
  fuse.kind = DecoderStep::Kind::kFuse;
  strip.kind = DecoderStep::Kind::kStrip;
  strip.content = " ";
  strip.start = 1;
  spec.decoder = {rep, bf, fuse};
  if (prefix_space) spec.decoder.push_back(strip);
  if (d.add_bos != 0 && d.bos_id >= 0) spec.prefix.push_back(d.bos_id);
  if (d.add_eos == 1 && d.eos_id >= 0) spec.suffix.push_back(d.eos_id);
  spec.vocab = std::move(d.tokens);
  return spec;
}

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    const fs::path json = fs::path(path) / "tokenizer.json";
    QKV_CHECK_RUNTIME(fs::is_regular_file(json, ec), "[tokenizer] ", path, ": the folder holds no tokenizer.json");
    return load_tokenizer_json(json.string());
  }
  QKV_CHECK_RUNTIME(fs::is_regular_file(path, ec), "[tokenizer] ", path, ": no such file or folder");
  const std::string ext = fs::path(path).extension().string();
  if (ext == ".gguf") return from_gguf(path);
  if (ext == ".json") return load_tokenizer_json(path);
  throw std::runtime_error(::qkv::detail::concat("[tokenizer] ", path,
                                          ": not a .gguf file, a .json file or a folder holding tokenizer.json"));
}

}  // namespace qkv::text
