// Tests of the data layer: tokenizers, the vocabulary and its file format, padded batches, the seeded sampler and
// the TSV loader (errors name the file and line).
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "ops_testing.h"
#include "qkv/data/batch.h"
#include "qkv/data/tokenizer.h"
#include "qkv/data/tsv.h"
#include "qkv/data/vocab.h"

namespace qkv::data {
namespace {

using qkv::testing::ThrowsArg;
using Strings = std::vector<std::string>;

std::string temp_path(const std::string& name) {
  return ::testing::TempDir() + "qkv_data_test_" + std::to_string(::getpid()) + "_" + name;
}

// --- tokenizers -------------------------------------------------------------------------------------------------

TEST(Tokenizer, CharSplitsUtf8CodePointsNotBytes) {
  EXPECT_EQ(tokenize("a年b", TokenizerKind::kChar), (Strings{"a", "年", "b"}));
  EXPECT_EQ(tokenize("😀x", TokenizerKind::kChar), (Strings{"😀", "x"}));
  EXPECT_EQ(tokenize("", TokenizerKind::kChar), Strings{});
}

TEST(Tokenizer, CharInvalidUtf8BytesAreSingleTokensAndRoundTrip) {
  const std::string text = std::string("a\xff") + "\xe5\xb9" + "b";  // stray byte, truncated 3-byte sequence
  const Strings t = tokenize(text, TokenizerKind::kChar);
  EXPECT_EQ(t.size(), 5u);
  EXPECT_EQ(detokenize(t, TokenizerKind::kChar), text);
}

TEST(Tokenizer, Utf8RejectsOverlongAndSurrogates) {
  EXPECT_EQ(utf8_sequence_length("\xc0\x80", 0), 0u);          // overlong NUL
  EXPECT_EQ(utf8_sequence_length("\xe0\x80\x80", 0), 0u);      // overlong 3-byte
  EXPECT_EQ(utf8_sequence_length("\xed\xa0\x80", 0), 0u);      // surrogate U+D800
  EXPECT_EQ(utf8_sequence_length("\xf4\x90\x80\x80", 0), 0u);  // above U+10FFFF
  EXPECT_EQ(utf8_sequence_length("\xf0\x9f\x98\x80", 0), 4u);
  EXPECT_TRUE(ThrowsArg([] { utf8_sequence_length("ab", 2); }, "[tokenizer]"));
}

TEST(Tokenizer, WordSplitsOnAnyAsciiWhitespaceRun) {
  EXPECT_EQ(tokenize("  the\tcat \n sat  ", TokenizerKind::kWord), (Strings{"the", "cat", "sat"}));
  EXPECT_EQ(detokenize({"the", "cat"}, TokenizerKind::kWord), "the cat");
  EXPECT_EQ(tokenize(" \t ", TokenizerKind::kWord), Strings{});
}

TEST(Tokenizer, ByteGivesOneTokenPerByte) {
  const Strings t = tokenize("年", TokenizerKind::kByte);
  ASSERT_EQ(t.size(), 3u);
  EXPECT_EQ(detokenize(t, TokenizerKind::kByte), "年");
}

TEST(Tokenizer, NamesRoundTripAndUnknownNameThrows) {
  for (auto k : {TokenizerKind::kChar, TokenizerKind::kWord, TokenizerKind::kByte})
    EXPECT_EQ(tokenizer_from_string(tokenizer_name(k)), k);
  EXPECT_TRUE(ThrowsArg([] { tokenizer_from_string("bpe"); }, "[tokenizer] unknown tokenizer 'bpe'"));
}

// --- vocabulary -------------------------------------------------------------------------------------------------

TEST(Vocabulary, SpecialsComeFirstWithFixedIds) {
  const Vocabulary v;
  EXPECT_EQ(v.size(), 4);
  EXPECT_EQ(v.token(Vocabulary::kPad), "<pad>");
  EXPECT_EQ(v.token(Vocabulary::kBos), "<bos>");
  EXPECT_EQ(v.token(Vocabulary::kEos), "<eos>");
  EXPECT_EQ(v.token(Vocabulary::kUnk), "<unk>");
  EXPECT_EQ(Vocabulary::kPad, 0);
}

TEST(Vocabulary, BuildOrdersByFrequencyThenBytes) {
  const Vocabulary v = Vocabulary::build({"abca", "cb", "d"}, TokenizerKind::kChar);
  // counts: a 2, b 2, c 2, d 1 -> a b c (ties in byte order), then d
  EXPECT_EQ(v.tokens_of({4, 5, 6, 7}), (Strings{"a", "b", "c", "d"}));
}

TEST(Vocabulary, MinFreqAndMaxSizeDropRareTokens) {
  const Vocabulary v = Vocabulary::build({"aab", "aac"}, TokenizerKind::kChar, 2);
  EXPECT_EQ(v.size(), 5);
  EXPECT_EQ(v.id("b"), Vocabulary::kUnk);
  const Vocabulary w = Vocabulary::build({"aabbbc"}, TokenizerKind::kChar, 1, 1);
  EXPECT_EQ(w.size(), 5);
  EXPECT_EQ(w.token(4), "b");
  EXPECT_TRUE(ThrowsArg([] { Vocabulary::build({"a"}, TokenizerKind::kChar, 0); }, "[vocab] min_freq"));
  EXPECT_TRUE(ThrowsArg([] { Vocabulary::build({"a"}, TokenizerKind::kChar, 1, -1); }, "[vocab] max_size"));
}

TEST(Vocabulary, ByteVocabularyCoversAll256BytesWhateverTheCorpus) {
  const Vocabulary v = Vocabulary::build({}, TokenizerKind::kByte);
  EXPECT_EQ(v.size(), 4 + 256);
  EXPECT_EQ(v.encode("\x01\xff"), (std::vector<int64_t>{5, 4 + 255}));
}

TEST(Vocabulary, EncodeDecodeWithSpecialsAndUnknowns) {
  const Vocabulary v = Vocabulary::build({"the cat", "the dog"}, TokenizerKind::kWord);
  const std::vector<int64_t> ids = v.encode("the bird cat", true, true);
  ASSERT_EQ(ids.size(), 5u);
  EXPECT_EQ(ids.front(), Vocabulary::kBos);
  EXPECT_EQ(ids[2], Vocabulary::kUnk);
  EXPECT_EQ(ids.back(), Vocabulary::kEos);
  EXPECT_EQ(v.decode(ids), "the <unk> cat");
  // decoding stops at EOS and skips PAD/BOS
  EXPECT_EQ(v.decode({Vocabulary::kBos, v.id("dog"), Vocabulary::kPad, Vocabulary::kEos, v.id("cat")}), "dog");
  // the specials' names in text are unknown words, never PAD/BOS/EOS
  EXPECT_EQ(v.encode("<pad> <eos>"), (std::vector<int64_t>{Vocabulary::kUnk, Vocabulary::kUnk}));
  EXPECT_TRUE(ThrowsArg([&] { v.decode({99}); }, "[vocab] id 99 is out of range"));
}

TEST(Vocabulary, AddRejectsEmptyAndSpecialNames) {
  Vocabulary v;
  EXPECT_EQ(v.add("x"), 4);
  EXPECT_EQ(v.add("x"), 4);
  EXPECT_TRUE(ThrowsArg([&] { v.add(""); }, "[vocab] cannot add an empty token"));
  EXPECT_TRUE(ThrowsArg([&] { v.add("<eos>"); }, "[vocab] '<eos>' is the name of a special token"));
}

TEST(Vocabulary, TextFormatRoundTripsAwkwardTokens) {
  Vocabulary v(TokenizerKind::kWord);
  for (const std::string& t : Strings{"a\\b", "new\nline", " ", "tab\t", std::string("\xff\x01", 2), "年", "\\x41"}) v.add(t);
  const std::string text = v.serialize();
  EXPECT_EQ(text.rfind("qkv-vocab 1 word\n<pad>\n<bos>\n<eos>\n<unk>\n", 0), 0u);
  EXPECT_EQ(Vocabulary::parse(text), v);
  const Vocabulary bytes = Vocabulary::build({}, TokenizerKind::kByte);
  EXPECT_EQ(Vocabulary::parse(bytes.serialize()), bytes);
}

TEST(Vocabulary, SaveLoadFileAndCompare) {
  const std::string path = temp_path("vocab.txt");
  const Vocabulary v = Vocabulary::build({"hello", "world"}, TokenizerKind::kChar);
  v.save(path);
  EXPECT_EQ(Vocabulary::load(path), v);
  EXPECT_NE(Vocabulary::load(path), Vocabulary::build({"hello"}, TokenizerKind::kChar));
  std::remove(path.c_str());
  EXPECT_THROW(Vocabulary::load(path), std::runtime_error);
}

TEST(Vocabulary, ParseErrorsNameFileAndLine) {
  EXPECT_TRUE(ThrowsArg([] { Vocabulary::parse("", "v.txt"); }, "[vocab] v.txt: empty vocabulary file"));
  EXPECT_TRUE(ThrowsArg([] { Vocabulary::parse("hello\n", "v.txt"); }, "[vocab] v.txt:1: expected the header"));
  EXPECT_TRUE(ThrowsArg([] { Vocabulary::parse("qkv-vocab 1 sentencepiece\n<pad>\n", "v.txt"); },
                        "[tokenizer] unknown tokenizer"));
  EXPECT_TRUE(ThrowsArg([] { Vocabulary::parse("qkv-vocab 1 char\n<pad>\n<bos>\n", "v.txt"); },
                        "[vocab] v.txt: the four special tokens are missing"));
  EXPECT_TRUE(ThrowsArg([] { Vocabulary::parse("qkv-vocab 1 char\n<pad>\n<eos>\n<bos>\n<unk>\n", "v.txt"); },
                        "[vocab] v.txt:3: expected '<bos>'"));
  const std::string head = "qkv-vocab 1 char\n<pad>\n<bos>\n<eos>\n<unk>\n";
  EXPECT_TRUE(ThrowsArg([&] { Vocabulary::parse(head + "a\na\n", "v.txt"); }, "[vocab] v.txt:7: duplicate token"));
  EXPECT_TRUE(ThrowsArg([&] { Vocabulary::parse(head + "a\\q\n", "v.txt"); }, "[vocab] v.txt:6: bad escape"));
  EXPECT_TRUE(ThrowsArg([&] { Vocabulary::parse(head + "a\\\n", "v.txt"); }, "[vocab] v.txt:6: dangling backslash"));
  EXPECT_TRUE(ThrowsArg([&] { Vocabulary::parse(head + "\n", "v.txt"); }, "[vocab] v.txt:6: empty token"));
  EXPECT_TRUE(ThrowsArg([&] { Vocabulary::parse(head + "<pad>\n", "v.txt"); }, "[vocab] v.txt:6: special token"));
}

// --- batches ----------------------------------------------------------------------------------------------------

TEST(Batch, PadSequencesGivesIdsLengthsAndBlockMask) {
  const Padded p = pad_sequences({{5, 6, 7}, {8}}, 0);
  EXPECT_EQ(p.ids.shape, (Shape{2, 3}));
  EXPECT_EQ(p.ids.data, (std::vector<int64_t>{5, 6, 7, 8, 0, 0}));
  EXPECT_EQ(p.lengths, (std::vector<int64_t>{3, 1}));
  EXPECT_EQ(p.padding_mask.to_vector(), (std::vector<float>{0, 0, 0, 0, 1, 1}));
  EXPECT_EQ(pad_sequences({{}, {}}, 0, 1).ids.shape, (Shape{2, 1}));
  EXPECT_TRUE(ThrowsArg([] { pad_sequences({}); }, "[pad_sequences] needs at least one sequence"));
  EXPECT_TRUE(ThrowsArg([] { pad_sequences({{1}}, 0, -1); }, "[pad_sequences] min_len"));
}

TEST(Batch, Seq2SeqBatchShiftsTargetsByBos) {
  const Example a{{10, 11}, {20, 21, 22}}, b{{12}, {23}};
  const Seq2SeqBatch batch = make_seq2seq_batch({&a, &b});
  const int64_t B = Vocabulary::kBos, E = Vocabulary::kEos, P = Vocabulary::kPad;
  EXPECT_EQ(batch.src.ids.data, (std::vector<int64_t>{10, 11, 12, P}));
  EXPECT_EQ(batch.tgt_in.ids.data, (std::vector<int64_t>{B, 20, 21, 22, B, 23, P, P}));
  EXPECT_EQ(batch.tgt_out.ids.data, (std::vector<int64_t>{20, 21, 22, E, 23, E, P, P}));
  EXPECT_EQ(batch.num_target_tokens, 6);
  const Seq2SeqBatch with_eos = make_seq2seq_batch({&b}, true);
  EXPECT_EQ(with_eos.src.ids.data, (std::vector<int64_t>{12, E}));
  EXPECT_TRUE(ThrowsArg([] { make_seq2seq_batch({}); }, "[make_seq2seq_batch]"));
}

TEST(Batch, LmBatchScoresOnlyTheTargetPart) {
  const Example a{{10, 11}, {20, 21}}, b{{12}, {}};
  const LmBatch batch = make_lm_batch({&a, &b});
  const int64_t B = Vocabulary::kBos, E = Vocabulary::kEos, P = Vocabulary::kPad;
  EXPECT_EQ(batch.input.ids.shape, (Shape{2, 5}));
  EXPECT_EQ(batch.input.ids.data, (std::vector<int64_t>{10, 11, B, 20, 21, 12, B, P, P, P}));
  EXPECT_EQ(batch.targets, (std::vector<int64_t>{P, P, 20, 21, E, P, E, P, P, P}));
  EXPECT_EQ(batch.prompt_lengths, (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(batch.num_target_tokens, 4);
  EXPECT_TRUE(ThrowsArg([] { make_lm_batch({}); }, "[make_lm_batch]"));
}

// --- shuffling --------------------------------------------------------------------------------------------------

TEST(Shuffle, SameSeedSamePermutationDifferentSeedDifferent) {
  Rng a(7), b(7), c(8);
  const auto pa = shuffled_indices(50, a);
  EXPECT_EQ(pa, shuffled_indices(50, b));
  EXPECT_NE(pa, shuffled_indices(50, c));
  EXPECT_EQ(std::set<int64_t>(pa.begin(), pa.end()).size(), 50u);
}

TEST(Sampler, EachEpochVisitsEveryExampleOnceWithShortLastBatch) {
  Sampler s(10, 4, 3);
  std::vector<int64_t> seen;
  std::vector<size_t> sizes;
  for (int i = 0; i < 3; ++i) {
    auto b = s.next();
    sizes.push_back(b.size());
    seen.insert(seen.end(), b.begin(), b.end());
  }
  EXPECT_EQ(sizes, (std::vector<size_t>{4, 4, 2}));
  EXPECT_EQ(std::set<int64_t>(seen.begin(), seen.end()).size(), 10u);
  const auto first_of_epoch1 = s.next();
  EXPECT_EQ(s.epoch(), 1);
  EXPECT_NE(first_of_epoch1, std::vector<int64_t>(seen.begin(), seen.begin() + 4));  // reshuffled
}

TEST(Sampler, SeekResumesTheSameStream) {
  Sampler a(13, 5, 99);
  for (int i = 0; i < 4; ++i) a.next();
  Sampler b(13, 5, 99);
  b.seek(a.epoch(), a.position());
  for (int i = 0; i < 10; ++i) EXPECT_EQ(a.next(), b.next());
  EXPECT_TRUE(ThrowsArg([&] { b.seek(0, 14); }, "[Sampler] seek"));
  EXPECT_TRUE(ThrowsArg([] { Sampler(0, 1, 0); }, "[Sampler] needs at least one example"));
  EXPECT_TRUE(ThrowsArg([] { Sampler(1, 0, 0); }, "[Sampler] batch_size"));
}

// --- TSV --------------------------------------------------------------------------------------------------------

TEST(Tsv, ParsesPairsSkipsBlankLinesAndCrlf) {
  const auto pairs = parse_tsv("Go.\tVa !\r\n\nHi.\tSalut.\n", "x.tsv");
  ASSERT_EQ(pairs.size(), 2u);
  EXPECT_EQ(pairs[0], (TextPair{"Go.", "Va !"}));
  EXPECT_EQ(pairs[1], (TextPair{"Hi.", "Salut."}));
  EXPECT_EQ(parse_tsv("\tempty source\n")[0].src, "");
}

TEST(Tsv, LineWithAThirdFieldIsAnErrorNamingFileAndLine) {
  EXPECT_TRUE(ThrowsArg([] { parse_tsv("a\tb\nGo.\tVa !\tCC-BY 2.0\n", "t.tsv"); },
                        "[tsv] t.tsv:2: line has 3 tab-separated fields"));
  EXPECT_TRUE(ThrowsArg([] { parse_tsv("a\tb\t\n", "t.tsv"); }, "[tsv] t.tsv:1: line has 3"));
}

TEST(Tsv, LineWithNoTabNamesFileAndLine) {
  EXPECT_TRUE(ThrowsArg([] { parse_tsv("a\tb\n\nno tab here\n", "corpus.tsv"); },
                        "[tsv] corpus.tsv:3: line has no tab"));
}

TEST(Tsv, EmptyCorpusIsAClearError) {
  EXPECT_TRUE(ThrowsArg([] { parse_tsv("", "e.tsv"); }, "[tsv] e.tsv: empty corpus"));
  EXPECT_TRUE(ThrowsArg([] { parse_tsv("\n \n\r\n", "e.tsv"); }, "[tsv] e.tsv: empty corpus"));
}

TEST(Tsv, LoadReadsFilesAndMissingFileIsRuntimeError) {
  const std::string path = temp_path("c.tsv");
  {
    std::ofstream f(path);
    f << "1 2\tone two\n";
  }
  EXPECT_EQ(load_tsv(path), (std::vector<TextPair>{{"1 2", "one two"}}));
  std::remove(path.c_str());
  EXPECT_THROW(load_tsv(path), std::runtime_error);
}

}  // namespace
}  // namespace qkv::data
