// `qkv search --model DIR --corpus FILE [--top-k K] QUERY ...`: the K corpus lines closest to each query by cosine
// similarity of their sentence embeddings: a small semantic search over a text file, one document per line.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

#include "commands.h"
#include "run_common.h"
#include "qkv/models/bert.h"

namespace qkv::cli {
namespace {

std::vector<std::string> corpus_lines(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("[search] cannot read corpus file " + path);
  std::vector<std::string> lines;
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") != std::string::npos) lines.push_back(line);
  }
  if (lines.empty()) throw std::runtime_error("[search] corpus file " + path + " has no non-blank line");
  return lines;
}

double cosine(const float* a, const float* b, int64_t d) {
  double ab = 0, aa = 0, bb = 0;
  for (int64_t j = 0; j < d; ++j) {
    ab += static_cast<double>(a[j]) * b[j];
    aa += static_cast<double>(a[j]) * a[j];
    bb += static_cast<double>(b[j]) * b[j];
  }
  return aa > 0 && bb > 0 ? ab / std::sqrt(aa * bb) : 0.0;
}

int run_search(const std::string& model, const std::string& corpus, const std::vector<std::string>& queries,
               int64_t top_k, const std::string& precision) {
  const Precision p = parse_precision(precision);
  const std::vector<std::string> docs = corpus_lines(corpus);
  const models::SentenceEncoder enc(model, p);
  const Tensor de = enc.encode(docs), qe = enc.encode(queries);
  const int64_t d = de.size(1), n = de.size(0);
  const int64_t k = std::min<int64_t>(top_k, n);
  for (size_t qi = 0; qi < queries.size(); ++qi) {
    std::vector<double> score(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) score[i] = cosine(qe.data() + static_cast<int64_t>(qi) * d, de.data() + i * d, d);
    std::vector<int64_t> order(static_cast<size_t>(n));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return score[a] > score[b]; });
    if (queries.size() > 1) std::printf("%s%s\n", qi ? "\n" : "", queries[qi].c_str());
    for (int64_t r = 0; r < k; ++r) std::printf("%.4f  %s\n", score[order[r]], docs[order[r]].c_str());
  }
  flush_stdout("search");
  return 0;
}

}  // namespace

void add_search(CLI::App& app) {
  auto* cmd = app.add_subcommand("search", "Top-k lines of a text file by cosine similarity to each query");
  auto model = std::make_shared<std::string>();
  auto corpus = std::make_shared<std::string>();
  auto queries = std::make_shared<std::vector<std::string>>();
  auto top_k = std::make_shared<int64_t>(5);
  auto precision = std::make_shared<std::string>();
  cmd->add_option("--model", *model, "sentence-transformers folder (config.json, vocab.txt, model.safetensors)")
      ->required();
  cmd->add_option("--corpus", *corpus, "Text file, one document per line (blank lines are skipped)")->required();
  cmd->add_option("-k,--top-k", *top_k, "How many lines to list per query")->capture_default_str()
      ->check(at_least(1));
  cmd->add_option("queries", *queries, "One or more queries")->required();
  add_precision_option(cmd, *precision);
  cmd->callback([=]() {
    run_search(*model, *corpus, *queries, *top_k, *precision);
  });
}

}  // namespace qkv::cli
