// GNU gettext .mo catalogs (the compiled translations Debian packages ship under /usr/share/locale): a strict,
// bounds-checked reader (either byte order, contexts, plural forms) and the catalog as source/target text pairs.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "qkv/data/tsv.h"

namespace qkv::data {

// One message. In the file the original is "msgctxt\x04msgid" (context optional) + "\0msgid_plural" (plural only)
// and the translation is the plural forms separated by "\0".
struct MoEntry {
  std::string context;              // msgctxt; meaningful only when has_context
  bool has_context = false;
  std::string msgid;                // the English source
  std::string msgid_plural;         // meaningful only when plural
  bool plural = false;
  std::vector<std::string> msgstr;  // translations: one form, or one per plural form (>= 1, may be "")
};

struct MoCatalog {
  bool big_endian = false;       // byte order of the file (magic 0x950412de read either way)
  uint32_t revision = 0;         // major revision (high 16 bits) is 0 or 1
  std::string header;            // the translation of the empty msgid (the PO header), "" when absent
  std::vector<MoEntry> entries;  // every other message, in file order (sorted by original string)

  // A header field, e.g. header_field("Language") -> "fr", "Plural-Forms", "Content-Type". "" when absent.
  std::string header_field(std::string_view name) const;
  // The charset of Content-Type ("UTF-8"), "" when the header has none.
  std::string charset() const;
  // nplurals of Plural-Forms, or 0 when absent or unreadable.
  int64_t nplurals() const;
};

// Parses .mo bytes. `name` (a path) prefixes every error. Throws std::invalid_argument "[mo] NAME: ..." on:
// a short file or a wrong magic (saying which bytes were found), an unsupported major revision, a string table
// or hash table past the end of the file (offset + count overflow included), a string whose offset + length is
// outside the file or that lacks its terminating NUL, more than one header entry. Revision 1's system-dependent
// strings (a table after the hash table) are not read.
MoCatalog parse_mo(std::string_view bytes, const std::string& name = "<mo>");
// Reads a file and parses it; std::runtime_error "[mo] cannot open 'PATH'" when it cannot be read.
MoCatalog load_mo(const std::string& path);

struct MoPairOptions {
  bool include_plural = true;    // plural entries give (msgid, msgstr[0])
  bool include_context = true;   // entries with a context keep their msgid as the source (context dropped)
  bool skip_multiline = true;    // drop messages whose source or translation contains '\n'
  int64_t max_chars = 0;         // > 0: drop pairs whose source or translation has more code points than this
};

// The translated messages as (source, target) pairs: untranslated entries (empty msgstr[0]) are dropped, and so
// are duplicates of an earlier identical (source, target) pair. Order follows the file.
std::vector<TextPair> mo_to_pairs(const MoCatalog& catalog, const MoPairOptions& options = {});

}  // namespace qkv::data
