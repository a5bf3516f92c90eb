// Parallel corpora as text: one "source<TAB>target" pair per line. Blank lines are skipped; a non-blank line with no
// tab, or with more than one (a third column, as in Tatoeba exports: keep two with `cut -f1,2`), is an error naming
// the file and line.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace qkv::data {

struct TextPair {
  std::string src;
  std::string tgt;
  bool operator==(const TextPair& o) const { return src == o.src && tgt == o.tgt; }
};

// Parses TSV text. `name` is used in errors: invalid_argument "[tsv] NAME:LINE: line has no tab (expected
// source<TAB>target)" for a line with no tab,
// "[tsv] NAME:LINE: line has N tab-separated fields (expected exactly source<TAB>target...)" for a line with more, "[tsv] NAME: empty corpus (no source<TAB>target lines)" when no pair
// is found. A trailing '\r' (CRLF files) is dropped.
std::vector<TextPair> parse_tsv(std::string_view text, const std::string& name = "<tsv>");
// Reads a file and parses it; runtime_error "[tsv] cannot open 'PATH'" when it cannot be read.
std::vector<TextPair> load_tsv(const std::string& path);

}  // namespace qkv::data
