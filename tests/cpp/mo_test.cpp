// Tests of the .mo reader: hand-built catalogs in both byte orders (contexts, plurals, header), every structural
// corruption it must reject with a clear "[mo]" error, random damage that must never crash, and the git catalogs.
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "qkv/core/rng.h"
#include "qkv/corpus/mo.h"

namespace qkv::data {
namespace {

// Lays out a .mo file as msgfmt does: 28-byte header, original table, translation table, no hash table, strings.
std::string build_mo(const std::vector<std::pair<std::string, std::string>>& msgs, bool big_endian,
                     uint32_t revision = 0) {
  std::string out;
  auto u32 = [&](uint32_t v) {
    for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>(big_endian ? (v >> (8 * (3 - i))) & 0xff : (v >> (8 * i)) & 0xff));
  };
  const uint32_t n = static_cast<uint32_t>(msgs.size());
  const uint32_t orig = 28, trans = orig + 8 * n, strings = trans + 8 * n;
  u32(0x950412de);
  u32(revision);
  u32(n);
  u32(orig);
  u32(trans);
  u32(0);
  u32(strings);
  std::string blob;
  std::vector<std::pair<uint32_t, uint32_t>> o, t;
  for (const auto& [a, b] : msgs) {
    o.push_back({static_cast<uint32_t>(a.size()), strings + static_cast<uint32_t>(blob.size())});
    blob += a;
    blob.push_back('\0');
  }
  for (const auto& [a, b] : msgs) {
    t.push_back({static_cast<uint32_t>(b.size()), strings + static_cast<uint32_t>(blob.size())});
    blob += b;
    blob.push_back('\0');
  }
  for (const auto& [len, off] : o) { u32(len); u32(off); }
  for (const auto& [len, off] : t) { u32(len); u32(off); }
  return out + blob;
}

void put32(std::string& s, size_t at, uint32_t v) {  // little-endian overwrite
  for (int i = 0; i < 4; ++i) s[at + i] = static_cast<char>((v >> (8 * i)) & 0xff);
}

const std::vector<std::pair<std::string, std::string>>& sample() {
  static const std::vector<std::pair<std::string, std::string>> m = {
      {"", "Project-Id-Version: demo\nLanguage: fr\nContent-Type: text/plain; charset=UTF-8\n"
           "Plural-Forms: nplurals=2; plural=(n > 1);\n"},
      {"Open", "Ouvrir"},
      {std::string("%d file") + '\0' + "%d files", std::string("%d fichier") + '\0' + "%d fichiers"},
      {std::string("menu") + '\x04' + "Open", "Ouvrir\xe2\x80\xa6"},
      {"Untranslated", ""},
      {"two\nlines", "deux\nlignes"},
  };
  return m;
}

// The message of the exception `fn` throws, or "" when it throws nothing.
template <typename F>
std::string error_of(F&& fn) {
  try {
    fn();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

TEST(Mo, ParsesLittleEndianWithHeaderPluralAndContext) {
  const MoCatalog c = parse_mo(build_mo(sample(), false), "fr.mo");
  EXPECT_FALSE(c.big_endian);
  EXPECT_EQ(c.header_field("Language"), "fr");
  EXPECT_EQ(c.charset(), "UTF-8");
  EXPECT_EQ(c.nplurals(), 2);
  ASSERT_EQ(c.entries.size(), 5u);  // the header is not an entry
  EXPECT_EQ(c.entries[0].msgid, "Open");
  EXPECT_EQ(c.entries[0].msgstr, std::vector<std::string>{"Ouvrir"});
  EXPECT_TRUE(c.entries[1].plural);
  EXPECT_EQ(c.entries[1].msgid, "%d file");
  EXPECT_EQ(c.entries[1].msgid_plural, "%d files");
  EXPECT_EQ(c.entries[1].msgstr, (std::vector<std::string>{"%d fichier", "%d fichiers"}));
  EXPECT_TRUE(c.entries[2].has_context);
  EXPECT_EQ(c.entries[2].context, "menu");
  EXPECT_EQ(c.entries[2].msgid, "Open");
  EXPECT_FALSE(c.entries[0].has_context);
}

TEST(Mo, BigEndianGivesTheSameCatalog) {
  const MoCatalog le = parse_mo(build_mo(sample(), false)), be = parse_mo(build_mo(sample(), true));
  EXPECT_TRUE(be.big_endian);
  EXPECT_EQ(be.header, le.header);
  ASSERT_EQ(be.entries.size(), le.entries.size());
  for (size_t i = 0; i < le.entries.size(); ++i) {
    EXPECT_EQ(be.entries[i].msgid, le.entries[i].msgid);
    EXPECT_EQ(be.entries[i].msgstr, le.entries[i].msgstr);
    EXPECT_EQ(be.entries[i].context, le.entries[i].context);
  }
}

TEST(Mo, EmptyCatalogAndRevisionOneAreAccepted) {
  EXPECT_TRUE(parse_mo(build_mo({}, false)).entries.empty());
  EXPECT_EQ(parse_mo(build_mo({{"a", "b"}}, false, 0x00010001)).revision, 0x00010001u);
}

TEST(Mo, PairsDropUntranslatedMultilineAndDuplicates) {
  const MoCatalog c = parse_mo(build_mo(sample(), false));
  const std::vector<TextPair> p = mo_to_pairs(c);
  // Open, %d file (plural form 0), menu|Open (different target, kept); untranslated and multi-line dropped.
  ASSERT_EQ(p.size(), 3u);
  EXPECT_EQ(p[0], (TextPair{"Open", "Ouvrir"}));
  EXPECT_EQ(p[1], (TextPair{"%d file", "%d fichier"}));
  MoPairOptions o;
  o.include_plural = false;
  o.include_context = false;
  o.skip_multiline = false;
  const std::vector<TextPair> q = mo_to_pairs(c, o);
  ASSERT_EQ(q.size(), 2u);
  EXPECT_EQ(q[1], (TextPair{"two\nlines", "deux\nlignes"}));
  o = {};
  o.max_chars = 6;  // "Ouvrir…" is 7 code points (the ellipsis is one), "%d fichier" 10
  EXPECT_EQ(mo_to_pairs(c, o).size(), 1u);
}

TEST(Mo, ShortFileIsRejected) {
  const std::string e = error_of([] { parse_mo(std::string("\xde\x12\x04\x95", 4), "x.mo"); });
  EXPECT_NE(e.find("[mo] x.mo:"), std::string::npos) << e;
  EXPECT_NE(e.find("too short"), std::string::npos) << e;
}

TEST(Mo, WrongMagicNamesTheBytesFound) {
  std::string b = build_mo(sample(), false);
  b[0] = 'P';
  const std::string e = error_of([&] { parse_mo(b, "x.mo"); });
  EXPECT_NE(e.find("not a .mo file"), std::string::npos) << e;
  EXPECT_NE(e.find("50 12 04 95"), std::string::npos) << e;
}

TEST(Mo, UnknownMajorRevisionIsRejected) {
  const std::string e = error_of([] { parse_mo(build_mo({{"a", "b"}}, false, 0x00020000)); });
  EXPECT_NE(e.find("unsupported major revision 2"), std::string::npos) << e;
}

TEST(Mo, TablePastTheEndIsRejectedEvenWhenOffsetsOverflow32Bits) {
  std::string b = build_mo(sample(), false);
  put32(b, 8, 0xFFFFFFFFu);  // N: the tables would need 32 GiB
  EXPECT_NE(error_of([&] { parse_mo(b); }).find("original-string table"), std::string::npos);
  b = build_mo(sample(), false);
  put32(b, 16, 0xFFFFFFF0u);  // T near 2^32: T + 8N wraps in 32-bit arithmetic
  EXPECT_NE(error_of([&] { parse_mo(b); }).find("translation table"), std::string::npos);
  b = build_mo(sample(), false);
  put32(b, 20, 1000);  // S: hash table of 1000 slots at H = string area
  EXPECT_NE(error_of([&] { parse_mo(b); }).find("hash table"), std::string::npos);
}

TEST(Mo, StringPastTheEndOrWithoutNulIsRejected) {
  std::string b = build_mo(sample(), false);
  put32(b, 28 + 8 * 1, 0x7FFFFFFFu);  // length of original string 1
  std::string e = error_of([&] { parse_mo(b); });
  EXPECT_NE(e.find("original string 1"), std::string::npos) << e;
  EXPECT_NE(e.find("runs past the end"), std::string::npos) << e;
  b = build_mo(sample(), false);
  const uint32_t n = static_cast<uint32_t>(sample().size());
  put32(b, 28 + 8 * n + 8 * 1 + 4, static_cast<uint32_t>(b.size()) - 1);  // translation 1: the last byte, length 1
  put32(b, 28 + 8 * n + 8 * 1, 1);                                         // (its NUL would lie past the end)
  e = error_of([&] { parse_mo(b); });
  EXPECT_NE(e.find("translation string 1"), std::string::npos) << e;
  b = build_mo({{"ab", "cd"}}, false);
  b[b.size() - 1] = 'x';  // the NUL after "cd"
  e = error_of([&] { parse_mo(b); });
  EXPECT_NE(e.find("not NUL-terminated"), std::string::npos) << e;
}

TEST(Mo, DuplicateHeaderAndMultiFormSingularAreRejected) {
  EXPECT_NE(error_of([] { parse_mo(build_mo({{"", "a: b\n"}, {"", "c: d\n"}}, false)); }).find("more than one header"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse_mo(build_mo({{"x", std::string("a") + '\0' + "b"}}, false)); })
                .find("NUL-separated forms"),
            std::string::npos);
}

TEST(Mo, EveryTruncationThrowsInvalidArgument) {
  const std::string full = build_mo(sample(), true);
  for (size_t len = 0; len < full.size(); ++len)
    EXPECT_THROW(parse_mo(std::string_view(full).substr(0, len)), std::invalid_argument) << "length " << len;
}

TEST(Mo, RandomByteDamageNeverCrashes) {
  const std::string full = build_mo(sample(), false);
  Rng rng(7);
  int rejected = 0;
  for (int trial = 0; trial < 2000; ++trial) {
    std::string b = full;
    const int flips = 1 + static_cast<int>(rng.below(4));
    for (int k = 0; k < flips; ++k) b[rng.below(b.size())] = static_cast<char>(rng.below(256));
    try {
      parse_mo(b);
    } catch (const std::invalid_argument& e) {
      EXPECT_EQ(std::string(e.what()).rfind("[mo] ", 0), 0u) << e.what();
      ++rejected;
    }
  }
  EXPECT_GT(rejected, 100);  // damage to the header and tables is caught
}

TEST(Mo, MissingFileIsARuntimeError) {
  try {
    load_mo("/nonexistent/dir/x.mo");
    FAIL() << "no exception";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("[mo] cannot open '/nonexistent/dir/x.mo'"), std::string::npos);
  }
}

TEST(Mo, DebianGitCatalogsParse) {
  const std::string fr = "/usr/share/locale/fr/LC_MESSAGES/git.mo", zh = "/usr/share/locale/zh_CN/LC_MESSAGES/git.mo";
  ASSERT_TRUE(std::filesystem::exists(fr) && std::filesystem::exists(zh))
      << "git's catalogs are missing: scripts/install-deps.sh installs Debian's git package, which ships them";
  const MoCatalog f = load_mo(fr), z = load_mo(zh);
  EXPECT_EQ(f.charset(), "UTF-8");
  EXPECT_EQ(z.charset(), "UTF-8");
  EXPECT_EQ(f.nplurals(), 2);
  EXPECT_EQ(z.nplurals(), 2);  // git's zh_CN.po declares "nplurals=2; plural=(n != 1);"
  EXPECT_GT(f.entries.size(), 1000u);
  EXPECT_GT(z.entries.size(), 1000u);
  EXPECT_GT(mo_to_pairs(f).size(), 1000u);
}

}  // namespace
}  // namespace qkv::data
