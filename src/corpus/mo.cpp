// The .mo reader: a 28-byte header (magic, revision, N, O, T, S, H), two tables of N (length, offset) pairs and
// NUL-terminated strings. Every read is bounds-checked in 64-bit arithmetic before it happens.
#include "qkv/corpus/mo.h"

#include <fstream>
#include <iterator>
#include <set>
#include <sstream>
#include <stdexcept>
#include <utility>

#include "qkv/core/error.h"
#include "qkv/data/tokenizer.h"

namespace qkv::data {
namespace {

constexpr uint32_t kMagic = 0x950412de;

std::string hex4(std::string_view b) {
  static const char* d = "0123456789abcdef";
  std::string s;
  for (size_t i = 0; i < 4 && i < b.size(); ++i) {
    const auto u = static_cast<unsigned char>(b[i]);
    if (i) s += ' ';
    s += d[u >> 4];
    s += d[u & 15];
  }
  return s;
}

class Reader {
 public:
  Reader(std::string_view bytes, const std::string& name) : b_(bytes), name_(name) {}

  template <typename... Args>
  [[noreturn]] void fail(Args&&... args) const {
    throw std::invalid_argument(detail::concat("[mo] ", name_, ": ", std::forward<Args>(args)...));
  }

  uint32_t u32(uint64_t at, bool big) const {
    if (at + 4 > b_.size()) fail("read of 4 bytes at offset ", at, " is past the end of the ", b_.size(), "-byte file");
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) {
      const uint32_t byte = static_cast<unsigned char>(b_[at + i]);
      v |= big ? byte << (8 * (3 - i)) : byte << (8 * i);
    }
    return v;
  }

  // String i of the table at `table` ("original" or "translation").
  std::string_view str(uint64_t table, uint64_t i, bool big, const char* which) const {
    const uint64_t len = u32(table + 8 * i, big), off = u32(table + 8 * i + 4, big);
    if (off + len + 1 > b_.size())
      fail(which, " string ", i, " at offset ", off, " with length ", len, " runs past the end of the ", b_.size(),
           "-byte file");
    if (b_[off + len] != '\0') fail(which, " string ", i, " at offset ", off, " is not NUL-terminated");
    return b_.substr(off, len);
  }

  size_t size() const { return b_.size(); }

 private:
  std::string_view b_;
  const std::string& name_;
};

std::vector<std::string> split_nul(std::string_view s) {
  std::vector<std::string> out;
  size_t start = 0;
  for (;;) {
    const size_t z = s.find('\0', start);
    out.emplace_back(s.substr(start, z == std::string_view::npos ? std::string_view::npos : z - start));
    if (z == std::string_view::npos) break;
    start = z + 1;
  }
  return out;
}

std::string trim(std::string_view s) {
  size_t a = 0, b = s.size();
  while (a < b && (s[a] == ' ' || s[a] == '\t' || s[a] == '\r')) ++a;
  while (b > a && (s[b - 1] == ' ' || s[b - 1] == '\t' || s[b - 1] == '\r')) --b;
  return std::string(s.substr(a, b - a));
}

int64_t code_points(std::string_view s) {
  int64_t n = 0;
  for (size_t i = 0; i < s.size();) {
    const size_t len = utf8_sequence_length(s, i);
    i += len ? len : 1;
    ++n;
  }
  return n;
}

}  // namespace

MoCatalog parse_mo(std::string_view bytes, const std::string& name) {
  Reader r(bytes, name);
  if (bytes.size() < 28)
    r.fail("file of ", bytes.size(), " bytes is too short for a .mo header (28 bytes)");
  MoCatalog cat;
  if (r.u32(0, false) == kMagic) {
    cat.big_endian = false;
  } else if (r.u32(0, true) == kMagic) {
    cat.big_endian = true;
  } else {
    r.fail("not a .mo file: magic bytes are ", hex4(bytes), " (expected de 12 04 95 or 95 04 12 de)");
  }
  const bool be = cat.big_endian;
  cat.revision = r.u32(4, be);
  if ((cat.revision >> 16) > 1)
    r.fail("unsupported major revision ", cat.revision >> 16, " (revision 0x", std::hex, cat.revision, std::dec,
           "; only 0 and 1 exist)");
  const uint64_t n = r.u32(8, be), orig = r.u32(12, be), trans = r.u32(16, be);
  const uint64_t hash_size = r.u32(20, be), hash_off = r.u32(24, be);
  if (orig + 8 * n > bytes.size())
    r.fail("original-string table at offset ", orig, " with ", n, " entries runs past the end of the ", bytes.size(),
           "-byte file");
  if (trans + 8 * n > bytes.size())
    r.fail("translation table at offset ", trans, " with ", n, " entries runs past the end of the ", bytes.size(),
           "-byte file");
  if (hash_size > 0 && hash_off + 4 * hash_size > bytes.size())
    r.fail("hash table at offset ", hash_off, " with ", hash_size, " slots runs past the end of the ", bytes.size(),
           "-byte file");

  bool have_header = false;
  cat.entries.reserve(n);
  for (uint64_t i = 0; i < n; ++i) {
    const std::string_view o = r.str(orig, i, be, "original");
    const std::string_view t = r.str(trans, i, be, "translation");
    MoEntry e;
    std::string_view id = o;
    const size_t ctx = id.find('\x04');
    if (ctx != std::string_view::npos) {
      e.has_context = true;
      e.context = std::string(id.substr(0, ctx));
      id = id.substr(ctx + 1);
    }
    const size_t nul = id.find('\0');
    if (nul != std::string_view::npos) {
      e.plural = true;
      e.msgid_plural = std::string(id.substr(nul + 1));
      id = id.substr(0, nul);
      if (e.msgid_plural.find('\0') != std::string::npos)
        r.fail("original string ", i, " has more than one plural part");
    }
    e.msgid = std::string(id);
    e.msgstr = split_nul(t);
    if (!e.plural && e.msgstr.size() > 1)
      r.fail("translation ", i, " of the singular message '", e.msgid.substr(0, 40), "' holds ", e.msgstr.size(),
             " NUL-separated forms");
    if (e.msgid.empty() && !e.has_context && !e.plural) {
      if (have_header) r.fail("more than one header entry (empty msgid)");
      have_header = true;
      cat.header = e.msgstr[0];
      continue;
    }
    cat.entries.push_back(std::move(e));
  }
  return cat;
}

MoCatalog load_mo(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  QKV_CHECK_RUNTIME(in.good(), "[mo] cannot open '", path, "'");
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  QKV_CHECK_RUNTIME(!in.bad(), "[mo] cannot read '", path, "'");
  return parse_mo(bytes, path);
}

std::string MoCatalog::header_field(std::string_view field) const {
  std::istringstream lines(header);
  std::string line;
  while (std::getline(lines, line)) {
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    if (trim(std::string_view(line).substr(0, colon)) == field) return trim(std::string_view(line).substr(colon + 1));
  }
  return "";
}

std::string MoCatalog::charset() const {
  const std::string ct = header_field("Content-Type");
  const size_t at = ct.find("charset=");
  if (at == std::string::npos) return "";
  std::string cs = ct.substr(at + 8);
  const size_t end = cs.find_first_of("; \t");
  return end == std::string::npos ? cs : cs.substr(0, end);
}

int64_t MoCatalog::nplurals() const {
  const std::string pf = header_field("Plural-Forms");
  const size_t at = pf.find("nplurals=");
  if (at == std::string::npos) return 0;
  int64_t v = 0;
  size_t i = at + 9;
  bool any = false;
  while (i < pf.size() && pf[i] >= '0' && pf[i] <= '9' && v < 1000) {
    v = v * 10 + (pf[i++] - '0');
    any = true;
  }
  return any ? v : 0;
}

std::vector<TextPair> mo_to_pairs(const MoCatalog& catalog, const MoPairOptions& options) {
  std::vector<TextPair> out;
  std::set<std::pair<std::string, std::string>> seen;
  for (const MoEntry& e : catalog.entries) {
    if (e.plural && !options.include_plural) continue;
    if (e.has_context && !options.include_context) continue;
    const std::string& tgt = e.msgstr[0];
    if (e.msgid.empty() || tgt.empty()) continue;
    if (options.skip_multiline && (e.msgid.find('\n') != std::string::npos || tgt.find('\n') != std::string::npos))
      continue;
    if (options.max_chars > 0 && (code_points(e.msgid) > options.max_chars || code_points(tgt) > options.max_chars))
      continue;
    if (!seen.insert({e.msgid, tgt}).second) continue;
    out.push_back({e.msgid, tgt});
  }
  return out;
}

}  // namespace qkv::data
