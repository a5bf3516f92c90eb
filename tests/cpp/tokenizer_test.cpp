// Language-model tokenizers (qkv/text): the byte-level map, BPE merges on toy vocabularies, added-token splitting,
// the regex pre-tokenizers' Unicode behaviour, the stream decoder's held-back UTF-8, and every refusal.
// (Equality with HF tokenizers on real and trained models: tests/python/test_tokenizer.py.)
#include <gtest/gtest.h>

#include <set>

#include "gguf_testing.h"
#include "qkv/text/tokenizer.h"
#include "safetensors_testing.h"

namespace qkv::text {
namespace {

using ::qkv::testing::safetensors::TempDir;
namespace gf = ::qkv::testing::gguf_files;

const std::string kG = "\xC4\xA0";  // Ġ, the byte-level space

// A byte-level toy: the 256 byte symbols, then merges "h e" -> he, "he l" -> hel, "l l", "hel l"... in rank order.
TokenizerSpec byte_level_toy(std::vector<std::pair<std::string, std::string>> merges) {
  TokenizerSpec s;
  s.source = "toy";
  for (int b = 0; b < 256; ++b) s.vocab.push_back(bytes_to_unicode(std::string(1, static_cast<char>(b))));
  for (const auto& [l, r] : merges) {
    if (std::find(s.vocab.begin(), s.vocab.end(), l + r) == s.vocab.end()) s.vocab.push_back(l + r);
  }
  s.merges = std::move(merges);
  PreTokenizerStep bl;
  bl.kind = PreTokenizerStep::Kind::kByteLevel;
  s.pre_tokenizer.push_back(bl);
  DecoderStep dec;
  dec.kind = DecoderStep::Kind::kByteLevel;
  s.decoder.push_back(dec);
  return s;
}

std::vector<std::string> tokens_of(const Tokenizer& t, const std::vector<int64_t>& ids) {
  std::vector<std::string> out;
  for (int64_t id : ids) out.push_back(t.token(id));
  return out;
}

TEST(ByteLevelMap, IsABijectionWithGpt2sPrintableBytesKept) {
  std::set<char32_t> seen;
  for (int b = 0; b < 256; ++b) {
    const char32_t cp = byte_to_unicode(static_cast<uint8_t>(b));
    EXPECT_TRUE(seen.insert(cp).second);
    EXPECT_EQ(unicode_to_byte(cp), b);
    if ((b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE) {
      EXPECT_EQ(cp, char32_t(b));
    }
  }
  EXPECT_EQ(byte_to_unicode(' '), U'\u0120');   // Ġ
  EXPECT_EQ(byte_to_unicode('\n'), U'\u010A');  // Ċ
  EXPECT_EQ(byte_to_unicode(0xAD), U'\u0143');  // the soft hyphen is moved too
  EXPECT_EQ(unicode_to_byte(U'\u4F60'), -1);
  EXPECT_EQ(bytes_to_unicode("a b\n"), "a" + kG + "b\xC4\x8A");
}

TEST(BpeMerges, LowestRankFirstLeftmostAmongEqualRanks) {
  // "l l" outranks "h e": "hello" -> h e [ll] o -> [he][ll] o -> [hell] o.
  auto t = make_tokenizer(byte_level_toy({{"l", "l"}, {"h", "e"}, {"he", "ll"}, {"e", "l"}}));
  EXPECT_EQ(tokens_of(*t, t->encode("hello")), (std::vector<std::string>{"hell", "o"}));
  // "e l" (rank 3) never fires once "l l" took the l's; "aaa" with "a a": leftmost pair first -> [aa] a.
  auto a = make_tokenizer(byte_level_toy({{"a", "a"}}));
  EXPECT_EQ(tokens_of(*a, a->encode("aaa")), (std::vector<std::string>{"aa", "a"}));
  EXPECT_EQ(tokens_of(*a, a->encode("aaaa")), (std::vector<std::string>{"aa", "aa"}));
  // The space is its byte symbol and merges like any other.
  auto s = make_tokenizer(byte_level_toy({{kG, "a"}}));
  EXPECT_EQ(tokens_of(*s, s->encode("a a")), (std::vector<std::string>{"a", kG + "a"}));
  EXPECT_EQ(s->decode(s->encode("a a\n\xF0\x9F\x98\x80")), "a a\n\xF0\x9F\x98\x80");
}

TEST(BpeMerges, IgnoreMergesTakesAWholeWordFromTheVocabulary) {
  // merges reach "abc" only as [ab][c] -> no "ab c" merge: [ab] c; with ignore_merges the vocabulary's abc wins.
  TokenizerSpec spec = byte_level_toy({{"b", "c"}, {"a", "b"}});
  spec.vocab.push_back("abc");
  auto plain = make_tokenizer(spec);
  EXPECT_EQ(tokens_of(*plain, plain->encode("abc")), (std::vector<std::string>{"a", "bc"}));
  spec.ignore_merges = true;
  auto ignore = make_tokenizer(spec);
  EXPECT_EQ(tokens_of(*ignore, ignore->encode("abc")), (std::vector<std::string>{"abc"}));
}

// SentencePiece style: <unk> <s> </s>, byte tokens, ▁-pieces; Prepend + Replace normalizer.
TokenizerSpec spm_toy(bool byte_fallback, bool fuse_unk) {
  TokenizerSpec s;
  s.source = "spm";
  s.vocab = {"<unk>", "<s>", "</s>"};
  for (int b = 0; b < 256; ++b) {
    static const char* hex = "0123456789ABCDEF";
    s.vocab.push_back(std::string("<0x") + hex[b >> 4] + hex[b & 15] + ">");
  }
  const std::string u = "\xE2\x96\x81";
  for (const std::string& t : {u, std::string("h"), std::string("i"), u + "h", u + "hi"}) s.vocab.push_back(t);
  s.merges = {{u, "h"}, {u + "h", "i"}};
  s.byte_fallback = byte_fallback;
  s.fuse_unk = fuse_unk;
  s.unk_id = 0;
  s.normalizer = {{NormalizerStep::Kind::kPrepend, "", u}, {NormalizerStep::Kind::kReplace, " ", u}};
  s.added = {{0, "<unk>", true}, {1, "<s>", true}, {2, "</s>", true}};
  DecoderStep rep, bf, fuse, strip;
  rep.kind = DecoderStep::Kind::kReplace, rep.pattern = u, rep.content = " ";
  bf.kind = DecoderStep::Kind::kByteFallback;
  fuse.kind = DecoderStep::Kind::kFuse;
  strip.kind = DecoderStep::Kind::kStrip, strip.content = " ", strip.start = 1;
  s.decoder = {rep, bf, fuse, strip};
  s.prefix = {1};
  return s;
}

TEST(SentencePieceBpe, ByteFallbackUnkFusingAndTheStrippedLeadingSpace) {
  auto t = make_tokenizer(spm_toy(true, true));
  const std::vector<int64_t> ids = t->encode("hi h\xC3\xA9");  // é is not a piece: <0xC3> <0xA9>
  EXPECT_EQ(tokens_of(*t, ids), (std::vector<std::string>{"<s>", "\xE2\x96\x81hi", "\xE2\x96\x81h", "<0xC3>",
                                                          "<0xA9>"}));
  EXPECT_EQ(t->decode(ids), "<s> hi h\xC3\xA9");
  EXPECT_EQ(t->decode(ids, true), "hi h\xC3\xA9");
  // The special token splits the text first; the piece after it gets its own ▁ from Prepend.
  EXPECT_EQ(tokens_of(*t, t->encode("hi</s>hi", false)),
            (std::vector<std::string>{"\xE2\x96\x81hi", "</s>", "\xE2\x96\x81hi"}));
  auto nofb = make_tokenizer(spm_toy(false, true));
  EXPECT_EQ(tokens_of(*nofb, nofb->encode("\xC3\xA9\xC3\xA9h", false)),
            (std::vector<std::string>{"\xE2\x96\x81", "<unk>", "h"}));  // two unknowns fused into one
  auto unfused = make_tokenizer(spm_toy(false, false));
  EXPECT_EQ(unfused->encode("\xC3\xA9\xC3\xA9", false).size(), 3u);
  TokenizerSpec drop = spm_toy(false, false);
  drop.unk_id = -1;  // no unk: HF drops the character
  EXPECT_EQ(tokens_of(*make_tokenizer(drop), make_tokenizer(drop)->encode("\xC3\xA9h", false)),
            (std::vector<std::string>{"\xE2\x96\x81h"}));
  // An invalid byte run (<0x41> is part of it) decodes to one U+FFFD per byte (HF's ByteFallback); decode_bytes
  // keeps the bytes.
  const std::vector<int64_t> bad = {3 + 0xE4, 3 + 0xE4, 3 + 0x41};
  EXPECT_EQ(t->decode(bad), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(t->decode({3 + 0xE4, 3 + 0xE4, 259}), "\xEF\xBF\xBD\xEF\xBF\xBD ");  // 259 is ▁
  EXPECT_EQ(t->decode_bytes(bad), "\xE4\xE4" "A");
}

TEST(AddedTokens, LeftmostLongestWithStrips) {
  std::vector<AddedToken> added = {{10, "<|a|>"}, {11, "<|a|><|b|>"}, {12, "<|b|>"}};
  auto parts = split_added_tokens("x<|a|><|b|>y<|b|><|a|", added);
  ASSERT_EQ(parts.size(), 5u);
  EXPECT_EQ(parts[0], (std::pair<int64_t, std::string>{-1, "x"}));
  EXPECT_EQ(parts[1].first, 11);  // the longer one at the same position
  EXPECT_EQ(parts[2], (std::pair<int64_t, std::string>{-1, "y"}));
  EXPECT_EQ(parts[3].first, 12);
  EXPECT_EQ(parts[4], (std::pair<int64_t, std::string>{-1, "<|a|"}));
  std::vector<AddedToken> strips = {{5, "<m>"}};
  strips[0].lstrip = strips[0].rstrip = true;
  parts = split_added_tokens("a \t<m>\u3000 b", strips);  // U+3000 is White_Space
  ASSERT_EQ(parts.size(), 3u);
  EXPECT_EQ(parts[0].second, "a");
  EXPECT_EQ(parts[1], (std::pair<int64_t, std::string>{5, " \t<m>\u3000 "}));
  EXPECT_EQ(parts[2].second, "b");
  EXPECT_TRUE(split_added_tokens("", added).empty());
}

TEST(RegexPreTokenizer, WhitespaceLookaheadAndUnicodeClassesAsOniguruma) {
  // \s+(?!\S) leaves the last space to the next word; at the end of the piece it takes the whole run.
  EXPECT_EQ(regex_split("a   b  ", kGpt2Pattern, "Isolated"), (std::vector<std::string>{"a", "  ", " b", "  "}));
  // U+3000 and U+00A0 are whitespace; U+180E is not (Unicode >= 6.3), although PCRE2's own \s takes it.
  EXPECT_EQ(regex_split("a\u3000\u3000b", kGpt2Pattern, "Isolated"),
            (std::vector<std::string>{"a", "\u3000", "\u3000", "b"}));
  EXPECT_EQ(regex_split("a\u180e\u180eb", kGpt2Pattern, "Isolated"),
            (std::vector<std::string>{"a", "\u180e\u180e", "b"}));
  // Llama 3: case-insensitive contractions, numbers by three, newlines kept with the punctuation.
  EXPECT_EQ(regex_split("I'M 1234567!\n\nx", kLlama3Pattern, "Isolated"),
            (std::vector<std::string>{"I", "'M", " ", "123", "456", "7", "!\n\n", "x"}));
  EXPECT_EQ(regex_split("1234", kQwen2Pattern, "Isolated"), (std::vector<std::string>{"1", "2", "3", "4"}));
  EXPECT_EQ(regex_split("a1b22", "\\p{N}", "Removed"), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(regex_split("a1b22", "\\p{N}", "MergedWithPrevious"), (std::vector<std::string>{"a1", "b2", "2"}));
  EXPECT_EQ(regex_split("a1b22", "\\p{N}", "MergedWithNext"), (std::vector<std::string>{"a", "1b", "2", "2"}));
  EXPECT_EQ(regex_split("a1b22", "\\p{N}", "Contiguous"), (std::vector<std::string>{"a", "1", "b", "22"}));
  EXPECT_EQ(regex_split("a1b22", "\\p{N}", "Isolated", true), (std::vector<std::string>{"a", "1", "b", "2", "2"}));
}

TEST(Utf8, LossyReplacesMaximalSubpartsAndTailDetection) {
  EXPECT_EQ(lossy_utf8("ok"), "ok");
  EXPECT_EQ(lossy_utf8("\xE4\xB8" "a"), "\xEF\xBF\xBD" "a");        // one U+FFFD for the cut sequence
  EXPECT_EQ(lossy_utf8("\xE0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD");   // E0 80 is never valid: two
  EXPECT_EQ(lossy_utf8("\xF0\x9F\x98"), "\xEF\xBF\xBD");
  EXPECT_EQ(lossy_utf8("\xFF\xC0\xAF"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(unfinished_utf8_tail("a\xF0\x9F\x98"), 3u);
  EXPECT_EQ(unfinished_utf8_tail("a\xE4"), 1u);
  EXPECT_EQ(unfinished_utf8_tail("a\xE0\x80"), 0u);  // cannot be completed
  EXPECT_EQ(unfinished_utf8_tail("\xE4\xB8\xAD"), 0u);
  EXPECT_EQ(unfinished_utf8_tail(""), 0u);
}

TEST(StreamDecoder, HoldsBackAPartialCharacterFromByteTokens) {
  auto t = make_tokenizer(byte_level_toy({}));
  const std::string text = "a\xE4\xB8\xAD\xF0\x9F\x98\x80!";  // a 中 😀 !
  const std::vector<int64_t> ids = t->encode(text);
  ASSERT_EQ(ids.size(), 9u);  // one byte each
  StreamDecoder stream(*t);
  std::vector<std::string> out;
  for (int64_t id : ids) out.push_back(stream.push(id));
  EXPECT_EQ(out, (std::vector<std::string>{"a", "", "", "\xE4\xB8\xAD", "", "", "", "\xF0\x9F\x98\x80", "!"}));
  EXPECT_EQ(stream.flush(), "");
  // A sequence that never completes: held, then U+FFFD once it is known to be bad, or at flush.
  EXPECT_EQ(stream.push(ids[1]), "");
  EXPECT_EQ(stream.push(ids[0]), "\xEF\xBF\xBD" "a");
  EXPECT_EQ(stream.push(ids[4]), "");
  EXPECT_EQ(stream.flush(), "\xEF\xBF\xBD");
  // SentencePiece: the first token's leading space is stripped once, later ones keep theirs.
  auto spm = make_tokenizer(spm_toy(true, true));
  StreamDecoder s2(*spm, true);
  std::string all;
  const std::vector<int64_t> sids = spm->encode("hi hi h\xC3\xA9");
  for (int64_t id : sids) all += s2.push(id);
  EXPECT_EQ(all + s2.flush(), spm->decode(sids, true));
}

TEST(TokenizerErrors, EveryRefusalIsOneLineNamingTheSource) {
  auto t = make_tokenizer(byte_level_toy({}));
  EXPECT_THROW(t->encode("bad \xFF byte"), std::invalid_argument);
  EXPECT_THROW(t->decode({256}), std::invalid_argument);
  EXPECT_THROW(t->decode({-1}), std::invalid_argument);
  EXPECT_THROW(t->token(1000), std::invalid_argument);
  EXPECT_EQ(t->id("not there"), -1);
  EXPECT_EQ(t->bos_token_id(), -1);
  EXPECT_EQ(t->eos_token_id(), -1);
  EXPECT_THROW(make_tokenizer(byte_level_toy({{"x", "missing"}})), std::invalid_argument);
  TokenizerSpec no_result = byte_level_toy({});
  no_result.merges = {{"a", "b"}};  // "ab" is not in the vocabulary
  EXPECT_THROW(make_tokenizer(no_result), std::invalid_argument);
  TokenizerSpec sw = byte_level_toy({});
  sw.added = {{300, "<x>"}};
  sw.added[0].single_word = true;
  EXPECT_THROW(make_tokenizer(sw), std::runtime_error);
  TokenizerSpec norm = spm_toy(true, true);
  norm.added[0].normalized = true;
  EXPECT_THROW(make_tokenizer(norm), std::runtime_error);
  TokenizerSpec empty_added = byte_level_toy({});
  empty_added.added = {{300, ""}};
  EXPECT_THROW(make_tokenizer(empty_added), std::invalid_argument);
  TokenizerSpec bad_id = byte_level_toy({});
  bad_id.prefix = {999};
  EXPECT_THROW(make_tokenizer(bad_id), std::invalid_argument);
  TokenizerSpec bad_re = byte_level_toy({});
  PreTokenizerStep split;
  split.pattern = "(unclosed";
  bad_re.pre_tokenizer.insert(bad_re.pre_tokenizer.begin(), split);
  try {
    make_tokenizer(bad_re);
    FAIL() << "no throw";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("toy: regex '(unclosed' does not compile"), std::string::npos) << e.what();
  }
  TokenizerSpec bad_behavior = byte_level_toy({});
  split.pattern = "x";
  split.behavior = "Sideways";
  bad_behavior.pre_tokenizer.insert(bad_behavior.pre_tokenizer.begin(), split);
  EXPECT_THROW(make_tokenizer(bad_behavior), std::runtime_error);
  EXPECT_THROW(regex_split("x", "x", "Sideways"), std::invalid_argument);
  TokenizerSpec bad_ms = byte_level_toy({});
  PreTokenizerStep ms;
  ms.kind = PreTokenizerStep::Kind::kMetaspace;
  ms.prepend_scheme = "sometimes";
  bad_ms.pre_tokenizer = {ms};
  EXPECT_THROW(make_tokenizer(bad_ms), std::runtime_error);
  TokenizerSpec bad_strip = spm_toy(true, true);
  bad_strip.decoder.back().content = "ab";
  EXPECT_THROW(make_tokenizer(bad_strip), std::invalid_argument);
}

// The smallest tokenizer.json around a component under test.
std::string tokenizer_json(const std::string& component) {
  return R"({"version": "1.0", "truncation": null, "padding": null, "added_tokens": [
    {"id": 3, "content": "<|e|>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false,
     "special": true}],
    "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
              "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
              "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b"]})" +
         component + "}";
}

std::string json_error(const TempDir& dir, const std::string& component) {
  dir.write("tokenizer.json", tokenizer_json(component));
  try {
    load_tokenizer(dir.file(""));
  } catch (const std::exception& e) {
    return e.what();
  }
  return "no error";
}

TEST(TokenizerJson, ReadsTheComponentsAndRefusesOthersNamingFileAndKey) {
  TempDir dir;
  dir.write("tokenizer.json", tokenizer_json(R"(, "normalizer": null, "pre_tokenizer": null,
      "post_processor": {"type": "TemplateProcessing", "single": [{"Sequence": {"id": "A", "type_id": 0}},
        {"SpecialToken": {"id": "<|e|>", "type_id": 0}}], "pair": [],
        "special_tokens": {"<|e|>": {"id": "<|e|>", "ids": [3], "tokens": ["<|e|>"]}}},
      "decoder": null)"));
  dir.write("tokenizer_config.json", R"({"eos_token": {"content": "<|e|>"}, "bos_token": null})");
  auto t = load_tokenizer(dir.file("tokenizer.json"));
  EXPECT_EQ(t->encode("aab<|e|>"), (std::vector<int64_t>{0, 2, 3, 3}));
  EXPECT_EQ(t->encode("aab", false), (std::vector<int64_t>{0, 2}));
  EXPECT_EQ(t->eos_token_id(), 3);
  EXPECT_EQ(t->bos_token_id(), -1);
  EXPECT_EQ(t->vocab_size(), 4);
  EXPECT_TRUE(t->is_special(3));
  EXPECT_FALSE(t->is_special(0));
  EXPECT_EQ(t->special_token_ids(), (std::vector<int64_t>{3}));
  EXPECT_EQ(t->decode({0, 2, 3}), "a ab <|e|>");  // no decoder: HF joins with spaces
  EXPECT_EQ(t->id("<|e|>"), 3);

  auto expect_refusal = [&](const std::string& component, const std::string& what) {
    const std::string msg = json_error(dir, component);
    EXPECT_NE(msg.find("tokenizer.json: " + what), std::string::npos) << msg;
  };
  expect_refusal(R"(, "normalizer": {"type": "NFKC"})", "normalizer.type 'NFKC' is not implemented");
  expect_refusal(R"(, "normalizer": {"type": "Replace", "pattern": {"Regex": " "}, "content": "x"})",
                 "normalizer.pattern Regex is not implemented");
  expect_refusal(R"(, "pre_tokenizer": {"type": "Sequence", "pretokenizers": [{"type": "Whitespace"}]})",
                 "pre_tokenizer.pretokenizers[0].type 'Whitespace' is not implemented");
  expect_refusal(R"(, "pre_tokenizer": {"type": "Split", "pattern": {"String": " "}, "behavior": "Up"})",
                 "pre_tokenizer.behavior 'Up' is not implemented");
  expect_refusal(R"(, "pre_tokenizer": {"type": "Split", "pattern": {"Glob": " "}, "behavior": "Isolated"})",
                 "pre_tokenizer.pattern must be");
  expect_refusal(R"(, "post_processor": {"type": "RobertaProcessing"})",
                 "post_processor.type 'RobertaProcessing' is not implemented");
  expect_refusal(R"(, "post_processor": {"type": "TemplateProcessing", "single": [], "special_tokens": {}})",
                 "post_processor.single has no sequence A");
  expect_refusal(R"(, "post_processor": {"type": "TemplateProcessing", "special_tokens": {},
      "single": [{"SpecialToken": {"id": "<x>", "type_id": 0}}]})", "post_processor.special_tokens has no entry");
  expect_refusal(R"(, "decoder": {"type": "WordPiece"})", "decoder.type 'WordPiece' is not implemented");
  expect_refusal(R"(, "decoder": {"type": "Strip", "content": "ab", "start": 1, "stop": 0})",
                 "decoder.content 'ab' (not one ASCII character) is not implemented");
  expect_refusal(R"(, "decoder": {"type": "Strip", "content": " ", "start": -1, "stop": 0})",
                 "decoder start and stop must be non-negative integers");
  expect_refusal(R"(, "pre_tokenizer": {"type": "Metaspace", "replacement": "_", "prepend_scheme": "odd"})",
                 "pre_tokenizer.prepend_scheme 'odd' is not implemented");

  auto expect_whole = [&](const std::string& doc, const std::string& what) {
    dir.write("tokenizer.json", doc);
    try {
      load_tokenizer_json(dir.file("tokenizer.json"));
      ADD_FAILURE() << "no error for " << what;
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  std::string doc = tokenizer_json("");
  expect_whole(std::string(doc).replace(doc.find("\"BPE\""), 5, "\"Unigram\""),
               "model.type 'Unigram' is not implemented");
  expect_whole(std::string(doc).replace(doc.find("\"truncation\": null"), 18, "\"truncation\": {}"),
               "truncation (not null) is not implemented");
  expect_whole(std::string(doc).replace(doc.find("\"a b\""), 5, "\"a c\""), "merge 0 ('a' 'c') names a token");
  expect_whole(std::string(doc).replace(doc.find("\"a b\""), 5, "\"ab\""), "model.merges[0] 'ab' is not 'a b'");
  expect_whole(std::string(doc).replace(doc.find("\"single_word\": false"), 20, "\"single_word\": true"),
               "added_tokens[0].single_word true is not implemented");
  expect_whole(std::string(doc).replace(doc.find("\"dropout\": null"), 15, "\"dropout\": 0.1"),
               "model.dropout (non-zero) is not implemented");
  expect_whole(std::string(doc).replace(doc.find("\"unk_token\": null"), 17, "\"unk_token\": \"<u>\""),
               "model.unk_token '<u>' is not in the vocabulary");
  expect_whole(std::string(doc).replace(doc.find("\"b\": 1"), 6, "\"b\": 0"), "gives id 0 to two tokens");
  expect_whole("{\"model\": ", "tokenizer.json");  // malformed JSON names the file
  EXPECT_THROW(load_tokenizer_json(dir.file("missing.json")), std::runtime_error);
}

// The streaming tokenizer.json reader (vocab and merges straight from the text) against the whole-document tree:
// the same spec where it reads the document, the tree reader's error where it gives the document to it.
TEST(TokenizerJson, StreamedVocabAndMergesGiveTheTreeReadersSpecAndErrors) {
  TempDir dir;
  auto both = [&](const std::string& doc) {
    dir.write("tokenizer.json", doc);
    std::pair<std::string, std::string> errors;
    try {
      const TokenizerSpec s = read_tokenizer_json(dir.file("tokenizer.json"), true);
      const TokenizerSpec t = read_tokenizer_json(dir.file("tokenizer.json"), false);
      EXPECT_EQ(s.vocab, t.vocab);
      EXPECT_EQ(s.merges, t.merges);
      EXPECT_EQ(s.unk_id, t.unk_id);
      EXPECT_EQ(s.byte_fallback, t.byte_fallback);
      EXPECT_EQ(s.added.size(), t.added.size());
      EXPECT_EQ(s.pre_tokenizer.size(), t.pre_tokenizer.size());
      EXPECT_EQ(s.decoder.size(), t.decoder.size());
      EXPECT_EQ(s.prefix, t.prefix);
      EXPECT_EQ(s.suffix, t.suffix);
      return errors;
    } catch (const std::exception& e) {
      errors.first = e.what();
    }
    try {
      read_tokenizer_json(dir.file("tokenizer.json"), false);
    } catch (const std::exception& e) {
      errors.second = e.what();
    }
    return errors;
  };
  // Read by both: escapes in tokens, both merge forms, model members after vocab and merges, keys after model.
  const std::string good = R"({"version": "1.0", "added_tokens": [{"id": 5, "content": "<|e|>", "special": true}],
    "model": {"type": "BPE", "vocab": {"a": 0, "\u0120b": 1, "\"": 2, "a\u0120b": 3, "<u>": 4},
              "merges": ["a \u0120b", ["a", "\""]], "unk_token": "<u>", "byte_fallback": true},
    "pre_tokenizer": {"type": "Sequence", "pretokenizers": [{"type": "Digits", "individual_digits": true},
      {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true}]},
    "post_processor": {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<|e|>", "type_id": 0}},
      {"Sequence": {"id": "A", "type_id": 0}}], "pair": [],
      "special_tokens": {"<|e|>": {"id": "<|e|>", "ids": [5], "tokens": ["<|e|>"]}}},
    "decoder": {"type": "ByteLevel"}})";
  EXPECT_EQ(both(good), (std::pair<std::string, std::string>{}));
  dir.write("tokenizer.json", good);
  const TokenizerSpec s = read_tokenizer_json(dir.file("tokenizer.json"));
  EXPECT_EQ(s.vocab, (std::vector<std::string>{"a", "\xC4\xA0" "b", "\"", "a\xC4\xA0" "b", "<u>"}));
  EXPECT_EQ(s.merges.size(), 2u);
  EXPECT_EQ(s.unk_id, 4);
  EXPECT_EQ(s.prefix, (std::vector<int64_t>{5}));
  // Given to the tree reader: each gives its error, the same with and without streaming.
  auto with = [&](const std::string& from, const std::string& to) {
    std::string doc = good;
    return doc.replace(doc.find(from), from.size(), to);
  };
  for (const std::string& doc :
       {with("\"<u>\": 4", "\"a\": 4"),                  // a token twice (duplicate key)
        with("\"<u>\": 4", "\"<u>\": 4.0"),              // not an integer
        with("\"<u>\": 4", "\"<u>\": -4"), with("\"<u>\": 4", "\"\": 4"),
        with("\"<u>\": 4", "\"<u>\": 1"),                // an id twice
        with("\"a \\u0120b\"", "\"a\\u0120b\""),        // not 'a b'
        with("[\"a\", \"\\\"\"]", "[\"a\", \"\\\"\", \"a\"]"),  // a triple
        with("\"merges\": [", "\"merges\": [], \"merges\": ["),  // merges twice
        with("\"vocab\": {", "\"vocab\": [], \"x\": {"),     // vocab not an object, no vocab
        with("\"type\": \"BPE\"", "\"type\": \"Unigram\""),
        with("\"decoder\": {", "\"decoder\": {{"),          // malformed JSON after the model
        with("\"version\": \"1.0\"", "\"model\": {}")}) {  // model twice
    const auto [streamed, tree] = both(doc);
    EXPECT_FALSE(tree.empty()) << doc;
    EXPECT_EQ(streamed, tree) << doc;
  }
}

TEST(TokenizerLoad, PathsThatAreNotATokenizer) {
  TempDir dir;
  EXPECT_THROW(load_tokenizer(dir.file("nothing")), std::runtime_error);
  EXPECT_THROW(load_tokenizer(dir.file("")), std::runtime_error);  // a folder without tokenizer.json
  dir.write("vocab.txt", "a\n");
  try {
    load_tokenizer(dir.file("vocab.txt"));
    FAIL() << "no throw";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("vocab.txt: not a .gguf file"), std::string::npos) << e.what();
  }
}

GgufTokenizerData gguf_toy(const std::string& model, const std::string& pre) {
  GgufTokenizerData d;
  d.source = "toy.gguf";
  d.model = model;
  d.pre = pre;
  for (int b = 0; b < 256; ++b) d.tokens.push_back(bytes_to_unicode(std::string(1, static_cast<char>(b))));
  d.tokens.push_back("<|end|>");
  d.tokens.push_back("ab");
  d.token_types.assign(d.tokens.size(), 1);
  d.token_types[256] = 3;
  d.merges = {"a b"};
  d.eos_id = 256;
  return d;
}

TEST(GgufSpec, ByteLevelPreTokenizersAndTheirRefusals) {
  for (const char* pre : {"smollm", "llama-bpe", "qwen2", "gpt2", "default"}) {
    auto t = make_tokenizer(spec_from_gguf(gguf_toy("gpt2", pre)));
    EXPECT_EQ(tokens_of(*t, t->encode("ab<|end|>12")), (std::vector<std::string>{"ab", "<|end|>", "1", "2"})) << pre;
    EXPECT_EQ(t->eos_token_id(), 256);
    EXPECT_TRUE(t->is_special(256));
  }
  auto expect_refusal = [](GgufTokenizerData d, const std::string& what) {
    try {
      make_tokenizer(spec_from_gguf(d));
      ADD_FAILURE() << "no error for " << what;
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()).find("toy.gguf: " + what), std::string::npos) << e.what();
    }
  };
  expect_refusal(gguf_toy("gpt2", "deepseek-coder"), "tokenizer.ggml.pre 'deepseek-coder' is not implemented");
  expect_refusal(gguf_toy("bert", ""), "tokenizer.ggml.model 'bert' is not implemented");
  GgufTokenizerData d = gguf_toy("gpt2", "gpt2");
  d.token_types.pop_back();
  expect_refusal(d, "tokenizer.ggml.token_type has 257 entries for 258 tokens");
  d = gguf_toy("gpt2", "gpt2");
  d.token_types[0] = 9;
  expect_refusal(d, "tokenizer.ggml.token_type[0] is 9");
  d = gguf_toy("gpt2", "gpt2");
  d.merges = {"ab"};
  expect_refusal(d, "tokenizer.ggml.merges[0] 'ab' is not two tokens and a space");
  d.merges.clear();
  expect_refusal(d, "tokenizer.ggml.merges is missing or empty");
  d = gguf_toy("gpt2", "gpt2");
  d.eos_id = 999;
  expect_refusal(d, "tokenizer.ggml.eos_token_id 999 is outside the vocabulary");
  d = gguf_toy("gpt2", "gpt2");
  d.tokens.clear();
  expect_refusal(d, "tokenizer.ggml.tokens is empty");
  d = gguf_toy("llama", "");
  expect_refusal(d, "tokenizer.ggml.scores has 0 entries for 258 tokens");
}

TEST(GgufSpec, SentencePieceMergesRebuiltFromScores) {
  // Pieces ▁, h, i, ▁h, hi: the pair whose merged piece scores higher merges first.
  GgufTokenizerData d;
  d.source = "spm.gguf";
  d.model = "llama";
  const std::string u = "\xE2\x96\x81";
  d.tokens = {"<unk>", "<s>", "</s>", u, "h", "i", u + "h", "hi"};
  d.token_types = {2, 3, 3, 1, 1, 1, 1, 1};
  d.scores = {0, 0, 0, -1, -2, -3, -4, -5};  // ▁h before hi
  d.bos_id = 1, d.eos_id = 2, d.unk_id = 0;
  auto t = make_tokenizer(spec_from_gguf(d));
  EXPECT_EQ(tokens_of(*t, t->encode("hi hi")), (std::vector<std::string>{"<s>", u + "h", "i", u + "h", "i"}));
  EXPECT_EQ(t->decode(t->encode("hi hi"), true), "hi hi");
  d.scores = {0, 0, 0, -1, -2, -3, -5, -4};  // hi before ▁h
  t = make_tokenizer(spec_from_gguf(d));
  EXPECT_EQ(tokens_of(*t, t->encode("hi hi")), (std::vector<std::string>{"<s>", u, "hi", u, "hi"}));
  d.add_bos = 0;
  EXPECT_EQ(make_tokenizer(spec_from_gguf(d))->encode("h").size(), 1u);
  d.add_space_prefix = 0;  // no ▁ before the text, and none stripped when decoding
  t = make_tokenizer(spec_from_gguf(d));
  EXPECT_EQ(tokens_of(*t, t->encode("hi")), (std::vector<std::string>{"hi"}));
  EXPECT_EQ(t->decode(t->encode(" hi")), " hi");
}

TEST(FromGguf, ReadsTheMetadataAndNamesTheFileOnRefusal) {
  TempDir dir;
  std::vector<std::string> tokens;
  for (int b = 0; b < 256; ++b) tokens.push_back(bytes_to_unicode(std::string(1, static_cast<char>(b))));
  tokens.push_back("ab");
  gf::Builder b;
  b.kv("tokenizer.ggml.model", gf::string_value("gpt2"))
      .kv("tokenizer.ggml.pre", gf::string_value("smollm"))
      .kv("tokenizer.ggml.tokens", gf::string_array(tokens))
      .kv("tokenizer.ggml.merges", gf::string_array({"a b"}))
      .kv("tokenizer.ggml.eos_token_id", gf::scalar<uint32_t>(gf::ValueType::UINT32, 256));
  dir.write("t.gguf", b.build());
  auto t = load_tokenizer(dir.file("t.gguf"));
  EXPECT_EQ(tokens_of(*t, t->encode("ab 12")), (std::vector<std::string>{"ab", kG, "1", "2"}));
  EXPECT_EQ(t->eos_token_id(), 256);

  gf::Builder wrong;
  wrong.kv("tokenizer.ggml.model", gf::scalar<uint32_t>(gf::ValueType::UINT32, 1));
  dir.write("w.gguf", wrong.build());
  try {
    from_gguf(dir.file("w.gguf"));
    FAIL() << "no throw";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("w.gguf: tokenizer.ggml.model"), std::string::npos) << e.what();
  }
  gf::Builder none;
  none.kv("general.architecture", gf::string_value("llama"));
  dir.write("n.gguf", none.build());
  EXPECT_THROW(from_gguf(dir.file("n.gguf")), std::runtime_error);
  gf::Builder no_tokens;
  no_tokens.kv("tokenizer.ggml.model", gf::string_value("gpt2"));
  dir.write("m.gguf", no_tokens.build());
  EXPECT_THROW(from_gguf(dir.file("m.gguf")), std::runtime_error);
}

}  // namespace
}  // namespace qkv::text
