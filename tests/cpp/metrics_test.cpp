// Tests of the corpus BLEU / chrF reimplementation on hand-computed cases and the tokenizers' edge rules
// (the byte-for-byte comparison with sacrebleu itself is tests/python/test_metrics.py).
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "qkv/eval/metrics.h"

namespace qkv::eval {
namespace {

// Scores are percentages computed in double; hand-derived values agree to rounding of the last digits.
void expect_score_near(double got, double want) { EXPECT_NEAR(got, want, 1e-9 + 1e-12 * std::abs(want)); }

TEST(Tokenize13a, SplitsPunctuationButKeepsDecimalsAndApostrophes) {
  EXPECT_EQ(tokenize_13a("Hello, world!"), "Hello , world !");
  EXPECT_EQ(tokenize_13a("pi is 3.14, e is 2,71."), "pi is 3.14 , e is 2,71 .");
  EXPECT_EQ(tokenize_13a("don't 'quote' (x)"), "don't 'quote' ( x )");
  EXPECT_EQ(tokenize_13a("1990-2000 well-known"), "1990 - 2000 well-known");
  EXPECT_EQ(tokenize_13a("a &amp; b &lt;c&gt;"), "a & b < c >");
  EXPECT_EQ(tokenize_13a("  spaced\tout \n"), "spaced out");
}

TEST(Tokenize13a, UnicodeWhitespaceSeparatesTokens) {
  // French typography puts a no-break space (U+00A0) before ':'; Python's str.split() treats it as whitespace.
  EXPECT_EQ(tokenize_13a("Référence non valide\xc2\xa0: %s"), "Référence non valide : % s");
}

TEST(TokenizeZh, EachHanCharacterIsAToken) {
  EXPECT_EQ(tokenize_zh("无法打开提交图形 '%s'"), "无 法 打 开 提 交 图 形 ' % s'");  // no 13a padding: the last ' stays
  EXPECT_EQ(tokenize_zh("remote-curl：意外"), "remote-curl ： 意 外");
}

TEST(Bleu, IdenticalCorpusScores100) {
  const std::vector<std::string> s = {"the cat sat on the mat", "a dog barked loudly at night"};
  const BleuScore b = corpus_bleu(s, s);
  expect_score_near(b.score, 100.0);
  EXPECT_EQ(b.sys_len, 12);
  EXPECT_DOUBLE_EQ(b.bp, 1.0);
}

TEST(Bleu, HandComputedPrecisions) {
  // p1 = 4/5, p2 = 3/4, p3 = 2/3, p4 = 1/2 -> BLEU = 100 * (0.8 * 0.75 * 2/3 * 0.5)^(1/4) = 100 * 0.2^(1/4).
  const BleuScore b = corpus_bleu({"a b c d e"}, {"a b c d f"});
  EXPECT_EQ(b.correct, (std::array<int64_t, 4>{4, 3, 2, 1}));
  EXPECT_EQ(b.total, (std::array<int64_t, 4>{5, 4, 3, 2}));
  expect_score_near(b.score, 100.0 * std::pow(0.2, 0.25));
}

TEST(Bleu, ExpSmoothingHalvesEachMissingOrder) {
  // No matching 3- or 4-grams: p3 = 100 / (2 * 3), p4 = 100 / (4 * 2).
  const BleuScore b = corpus_bleu({"a b x c d"}, {"a b y c d"});
  EXPECT_EQ(b.correct, (std::array<int64_t, 4>{4, 2, 0, 0}));
  expect_score_near(b.precisions[2], 100.0 / 6.0);
  expect_score_near(b.precisions[3], 100.0 / 8.0);
}

TEST(Bleu, BrevityPenaltyAndShortHypothesisScoreZero) {
  // Three tokens: no 4-gram at all, so sacrebleu stops at order 4 with precision 0 and the score is 0.
  const BleuScore b = corpus_bleu({"the cat sat"}, {"the cat sat on the mat"});
  EXPECT_NEAR(b.bp, std::exp(1.0 - 6.0 / 3.0), 1e-15);
  EXPECT_LT(b.score, 1e-100);
  EXPECT_EQ(corpus_bleu({""}, {"x"}).score, 0.0);
  EXPECT_EQ(corpus_bleu({}, {}).score, 0.0);
}

TEST(Bleu, MismatchedSizesAndUnknownTokenizerThrow) {
  try {
    corpus_bleu({"a"}, {});
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("[bleu] 1 hypotheses but 0 references"), std::string::npos);
  }
  EXPECT_THROW(bleu_tokenizer_from_string("intl"), std::invalid_argument);
  EXPECT_EQ(bleu_tokenizer_from_string("zh"), BleuTokenizer::kZh);
}

TEST(Chrf, IdenticalIs100AndDisjointIs0) {
  expect_score_near(corpus_chrf({"abc def"}, {"abcdef"}).score, 100.0);  // whitespace is removed
  EXPECT_EQ(corpus_chrf({"xyz"}, {"abc"}).score, 0.0);
}

TEST(Chrf, HandComputedUnigramOnly) {
  // char_order 1: hyp "ab", ref "abc": P = 1, R = 2/3, F2 = 5 P R / (4 P + R) = (10/3) / (14/3) = 5/7.
  expect_score_near(corpus_chrf({"ab"}, {"abc"}, 1, 2).score, 100.0 * 5.0 / 7.0);
}

TEST(Chrf, OrdersTheReferenceIsTooShortForAreSkipped) {
  // ref "ab" has no 3-grams: that order counts 0 hypothesis n-grams (sacrebleu's rule) and leaves the average.
  const ChrfScore c = corpus_chrf({"abc"}, {"ab"}, 3, 2);
  EXPECT_EQ(c.stats[2][0], 0);
  EXPECT_EQ(c.stats[0], (std::array<int64_t, 3>{3, 2, 2}));
}

TEST(Chrf, BadArgumentsThrow) {
  EXPECT_THROW(corpus_chrf({"a"}, {"a", "b"}), std::invalid_argument);
  try {
    corpus_chrf({"a"}, {"a"}, 0, 2);
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("[chrf]"), std::string::npos);
  }
}

}  // namespace
}  // namespace qkv::eval
