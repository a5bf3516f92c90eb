// WordPieceTokenizer on a tiny vocabulary: each BERT rule (clean-up, CJK, accents, punctuation, ## pieces, [UNK],
// literal special tokens, truncation, padding) and every error path. The full comparison lives in test_wordpiece.py.
#include "qkv/models/wordpiece.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

using qkv::models::WordPieceOptions;
using qkv::models::WordPieceTokenizer;

std::vector<std::string> tiny_vocab() {
  return {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "un", "##aff", "##able", "hello", "world", "!", ",", "'",
          "s", "cafe", "中", "a", "##a", "σ", "##α", "##σ", "istanbul", "e", "[", "]", "mask", "x", "y"};
}

WordPieceTokenizer tiny() { return WordPieceTokenizer(tiny_vocab()); }

using Pieces = std::vector<std::string>;

template <typename F>
void expect_invalid_argument(F&& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "expected std::invalid_argument containing " << needle;
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(WordPiece, GreedyLongestMatchWithContinuationPrefix) {
  EXPECT_EQ(tiny().tokenize("unaffable"), (Pieces{"un", "##aff", "##able"}));
}

TEST(WordPiece, WordWithUnmatchablePartIsOneUnk) {
  EXPECT_EQ(tiny().tokenize("unaffablez hello"), (Pieces{"[UNK]", "hello"}));
}

TEST(WordPiece, WordOver100CharsIsUnkAndExactly100IsNot) {
  const auto t = tiny();
  EXPECT_EQ(t.tokenize(std::string(101, 'a')), (Pieces{"[UNK]"}));
  const Pieces hundred = t.tokenize(std::string(100, 'a'));
  ASSERT_EQ(hundred.size(), 100u);
  EXPECT_EQ(hundred[0], "a");
  EXPECT_EQ(hundred[99], "##a");
}

TEST(WordPiece, LowercasesAndSplitsPunctuation) {
  EXPECT_EQ(tiny().tokenize("Hello,WORLD!"), (Pieces{"hello", ",", "world", "!"}));
}

TEST(WordPiece, AsciiSymbolsCountAsPunctuation) {
  EXPECT_EQ(tiny().tokenize("x$y"), (Pieces{"x", "[UNK]", "y"}));  // '$' is its own word, not in the vocab
}

TEST(WordPiece, StripsAccentsComposedAndDecomposed) {
  const auto t = tiny();
  EXPECT_EQ(t.tokenize("Café"), (Pieces{"cafe"}));
  EXPECT_EQ(t.tokenize("Cafe\xCC\x81"), (Pieces{"cafe"}));         // e + U+0301
  EXPECT_EQ(t.tokenize("\xC4\xB0stanbul"), (Pieces{"istanbul"}));  // U+0130 capital I with dot above
}

TEST(WordPiece, GreekCapitalSigmaLowercasesCharByChar) {
  EXPECT_EQ(tiny().tokenize("ΣΑΣ"), (Pieces{"σ", "##α", "##σ"}));  // no final-sigma rule, as the reference
}

TEST(WordPiece, CjkIdeographIsItsOwnWord) {
  EXPECT_EQ(tiny().tokenize("a中a"), (Pieces{"a", "中", "a"}));
}

TEST(WordPiece, ControlCharsVanishAndUnicodeSpacesSplit) {
  const auto t = tiny();
  EXPECT_EQ(t.normalize(std::string("he\0llo", 6)), "hello");
  EXPECT_EQ(t.normalize("he\xEF\xBF\xBDllo\xE2\x80\x8B"), "hello");  // U+FFFD and zero-width space removed
  EXPECT_EQ(t.tokenize("hello\xC2\xA0world\xE3\x80\x80!"), (Pieces{"hello", "world", "!"}));
  EXPECT_EQ(t.tokenize("hello\tworld\r\n"), (Pieces{"hello", "world"}));
}

TEST(WordPiece, CanonicalOrderingHappensBeforeMarksAreDropped) {
  const auto t = tiny();
  // U+1D16D (class 226) and U+1D165 (class 216) are spacing marks that survive accent stripping: NFD sorts them.
  const std::string m226 = "\xF0\x9D\x85\xAD", m216 = "\xF0\x9D\x85\xA5";
  EXPECT_EQ(t.normalize("a" + m226 + m216), "a" + m216 + m226);
  EXPECT_EQ(t.normalize("a" + m226 + "\xCC\x81" + m216), "a" + m216 + m226);  // U+0301 (230) dropped after sorting
  // U+034F (a non-spacing mark of class 0) ends the run before it is dropped: no reordering across it.
  EXPECT_EQ(t.normalize("a" + m226 + "\xCD\x8F" + m216), "a" + m226 + m216);
}

TEST(WordPiece, LiteralSpecialTokensStayWholeButLowercaseOnesDoNot) {
  const auto t = tiny();
  EXPECT_EQ(t.tokenize("x[MASK]y"), (Pieces{"x", "[MASK]", "y"}));
  EXPECT_EQ(t.tokenize("[mask]"), (Pieces{"[", "mask", "]"}));
  EXPECT_EQ(t.tokenize("[PAD][CLS]"), (Pieces{"[PAD]", "[CLS]"}));
}

TEST(WordPiece, EmptyAndBlankTextGiveOnlyClsSep) {
  const auto t = tiny();
  EXPECT_EQ(t.encode("", 8), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(t.encode(" \t\n", 8), (std::vector<int64_t>{2, 3}));
}

TEST(WordPiece, TruncationKeepsClsAndSep) {
  const auto t = tiny();
  EXPECT_EQ(t.encode("hello world hello world", 4), (std::vector<int64_t>{2, 8, 9, 3}));
  EXPECT_EQ(t.encode("hello world", 2), (std::vector<int64_t>{2, 3}));
}

TEST(WordPiece, BatchPadsRightWithPadIdAndMasksPadding) {
  const auto b = tiny().encode_batch({"hello", "hello world !", ""}, 16);
  ASSERT_EQ(b.ids.shape, (qkv::Shape{3, 5}));
  EXPECT_EQ(b.ids.data, (std::vector<int64_t>{2, 8, 3, 0, 0, 2, 8, 9, 10, 3, 2, 3, 0, 0, 0}));
  EXPECT_EQ(b.attention_mask.data, (std::vector<int64_t>{1, 1, 1, 0, 0, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0}));
  EXPECT_EQ(b.lengths, (std::vector<int64_t>{3, 5, 2}));
}

TEST(WordPiece, EmptyBatchIsZeroByZero) {
  const auto b = tiny().encode_batch({}, 16);
  EXPECT_EQ(b.ids.shape, (qkv::Shape{0, 0}));
  EXPECT_TRUE(b.ids.data.empty());
}

TEST(WordPiece, InvalidUtf8Throws) {
  const auto t = tiny();
  expect_invalid_argument([&] { t.tokenize("ab\xC3"); }, "[wordpiece] text is not valid UTF-8 at byte 2");
  expect_invalid_argument([&] { t.tokenize("\xC0\xAF"); }, "[wordpiece] text is not valid UTF-8");   // overlong
  expect_invalid_argument([&] { t.tokenize("\xED\xA0\x80"); }, "[wordpiece] text is not valid UTF-8");  // surrogate
  expect_invalid_argument([&] { t.tokenize("\xF4\x90\x80\x80"); }, "[wordpiece] text is not valid UTF-8");
}

TEST(WordPiece, MaxLengthBelowTwoThrows) {
  const auto t = tiny();
  expect_invalid_argument([&] { t.encode("x", 1); }, "[wordpiece] max_length must be >= 2");
  expect_invalid_argument([&] { t.encode_batch({"x"}, 0); }, "[wordpiece] max_length must be >= 2");
}

TEST(WordPiece, BadVocabulariesThrow) {
  expect_invalid_argument([] { WordPieceTokenizer({}); }, "[wordpiece] the vocabulary is empty");
  auto v = tiny_vocab();
  v.push_back("hello");
  expect_invalid_argument([&] { WordPieceTokenizer{v}; }, "'hello' is a duplicate");
  v = tiny_vocab();
  v.push_back("");
  expect_invalid_argument([&] { WordPieceTokenizer{v}; }, "is empty");
  v = tiny_vocab();
  v.erase(v.begin() + 4);
  expect_invalid_argument([&] { WordPieceTokenizer{v}; }, "no mask token '[MASK]'");
  WordPieceOptions o;
  o.max_input_chars_per_word = 0;
  expect_invalid_argument([&] { WordPieceTokenizer(tiny_vocab(), o); }, "max_input_chars_per_word");
}

TEST(WordPiece, IdToTokenOutOfRangeThrows) {
  const auto t = tiny();
  EXPECT_EQ(t.id_to_token(8), "hello");
  EXPECT_EQ(t.token_to_id("nope"), -1);
  expect_invalid_argument([&] { t.id_to_token(-1); }, "[wordpiece] id -1 is outside");
  expect_invalid_argument([&] { t.id_to_token(t.vocab_size()); }, "[wordpiece] id");
}

TEST(WordPiece, VocabFileLoadsAndMissingFileNamesIt) {
  const std::string path = ::testing::TempDir() + "qkv_wordpiece_vocab.txt";
  {
    std::ofstream f(path);
    for (const auto& tok : tiny_vocab()) f << tok << "\r\n";  // CRLF lines are trimmed
  }
  const auto t = WordPieceTokenizer::from_file(path);
  EXPECT_EQ(t.vocab_size(), static_cast<int64_t>(tiny_vocab().size()));
  EXPECT_EQ(t.token_to_id("hello"), 8);
  std::remove(path.c_str());
  try {
    WordPieceTokenizer::from_file(path);
    ADD_FAILURE() << "expected std::runtime_error";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("[wordpiece] cannot open vocabulary file " + path), std::string::npos);
  }
}

}  // namespace
