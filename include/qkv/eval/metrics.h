// Corpus-level translation metrics, reimplemented to match sacrebleu 2.6.0 bit for bit on one reference:
// BLEU-4 (13a or zh tokenisation, exponential smoothing) and chrF (character 6-grams, beta 2, whitespace removed).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace qkv::eval {

enum class BleuTokenizer {
  k13a,   // mteval-v13a, sacrebleu's default
  kZh,    // sacrebleu's "zh": each CJK character is a word, the rest as 13a (use for Chinese targets)
  kNone,  // split on whitespace only
};

// "13a" | "zh" | "none"; throws std::invalid_argument "[bleu] unknown tokenizer 'x' (choose 13a, zh or none)".
BleuTokenizer bleu_tokenizer_from_string(const std::string& name);

// The tokenised line, tokens joined by single spaces, exactly as sacrebleu's tokenizers produce it (input is
// UTF-8; whitespace is Python's str.isspace set).
std::string tokenize_13a(std::string_view line);
std::string tokenize_zh(std::string_view line);

struct BleuScore {
  double score = 0.0;                   // 0..100
  std::array<int64_t, 4> correct{};     // matched n-grams (clipped) per order 1..4
  std::array<int64_t, 4> total{};       // hypothesis n-grams per order
  std::array<double, 4> precisions{};   // percentages, after smoothing
  double bp = 1.0;                      // brevity penalty
  int64_t sys_len = 0, ref_len = 0;     // tokens
};

// sacrebleu.corpus_bleu(hyps, [refs], tokenize=...) with its defaults (smooth_method "exp", no lowercasing,
// no effective order). hypotheses.size() == references.size(); throws std::invalid_argument "[bleu] ..." otherwise.
// An empty corpus scores 0.
BleuScore corpus_bleu(const std::vector<std::string>& hypotheses, const std::vector<std::string>& references,
                      BleuTokenizer tokenizer = BleuTokenizer::k13a);

struct ChrfScore {
  double score = 0.0;  // 0..100
  // Summed statistics per character order 1..char_order: hypothesis n-grams, reference n-grams, matches.
  std::vector<std::array<int64_t, 3>> stats;
};

// sacrebleu.corpus_chrf(hyps, [refs]) (chrF2: char_order 6, word_order 0, beta 2, whitespace removed, no
// lowercasing, no eps smoothing). Sizes must match; char_order >= 1, beta >= 0 ("[chrf] ..." otherwise).
ChrfScore corpus_chrf(const std::vector<std::string>& hypotheses, const std::vector<std::string>& references,
                      int char_order = 6, int beta = 2);

}  // namespace qkv::eval
