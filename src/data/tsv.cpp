// TSV parallel-corpus loader: strict about missing tabs and extra fields (file:line in the error), lenient about
// CRLF.
#include "qkv/data/tsv.h"

#include <algorithm>
#include <fstream>
#include <sstream>

#include "qkv/core/error.h"

namespace qkv::data {

std::vector<TextPair> parse_tsv(std::string_view text, const std::string& name) {
  std::vector<TextPair> out;
  size_t start = 0;
  int64_t line_no = 0;
  while (start < text.size()) {
    size_t nl = text.find('\n', start);
    if (nl == std::string_view::npos) nl = text.size();
    std::string_view line = text.substr(start, nl - start);
    start = nl + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.find_first_not_of(" \t") == std::string_view::npos && line.find('\t') == std::string_view::npos)
      continue;  // blank
    const size_t tab = line.find('\t');
    QKV_CHECK_ARG(tab != std::string_view::npos, "[tsv] ", name, ":", line_no,
                  ": line has no tab (expected source<TAB>target)");
    const std::string_view tgt = line.substr(tab + 1);
    QKV_CHECK_ARG(tgt.find('\t') == std::string_view::npos, "[tsv] ", name, ":", line_no, ": line has ",
                  1 + std::count(line.begin(), line.end(), '\t'),
                  " tab-separated fields (expected exactly source<TAB>target; keep two columns, e.g. cut -f1,2)");
    out.push_back({std::string(line.substr(0, tab)), std::string(tgt)});
  }
  QKV_CHECK_ARG(!out.empty(), "[tsv] ", name, ": empty corpus (no source<TAB>target lines)");
  return out;
}

std::vector<TextPair> load_tsv(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  QKV_CHECK_RUNTIME(in.good(), "[tsv] cannot open '", path, "'");
  std::ostringstream ss;
  ss << in.rdbuf();
  return parse_tsv(ss.str(), path);
}

}  // namespace qkv::data
