// Loading a run's data: built-in task or TSV (with a seeded held-out split), vocabulary, ids, length limits.
#include "qkv/train/run_data.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "qkv/core/error.h"
#include "qkv/core/rng.h"
#include "qkv/data/tasks.h"
#include "qkv/data/tokenizer.h"

namespace qkv::train {

std::string file_hash(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  QKV_CHECK_RUNTIME(in.good(), "[tsv] cannot open '", path, "'");
  uint64_t h = 1469598103934665603ULL;
  char buf[65536];
  while (in.read(buf, sizeof buf) || in.gcount() > 0) {
    for (std::streamsize i = 0; i < in.gcount(); ++i) {
      h ^= static_cast<unsigned char>(buf[i]);
      h *= 1099511628211ULL;
    }
  }
  char out[17];
  std::snprintf(out, sizeof out, "%016llx", static_cast<unsigned long long>(h));
  return out;
}

std::string vocab_difference(const data::Vocabulary& a, const data::Vocabulary& b) {
  if (a.kind() != b.kind())
    return std::string("tokenizers ") + data::tokenizer_name(a.kind()) + " and " + data::tokenizer_name(b.kind());
  const int64_t n = std::min(a.size(), b.size());
  for (int64_t i = 0; i < n; ++i)
    if (a.token(i) != b.token(i)) return "id " + std::to_string(i) + ": '" + a.token(i) + "' vs '" + b.token(i) + "'";
  if (a.size() != b.size())
    return "sizes " + std::to_string(a.size()) + " and " + std::to_string(b.size());
  return "none";
}

RunData load_run_data(RunConfig& c, const data::Vocabulary* given) {
  std::vector<data::TextPair> train, test;
  data::TokenizerKind kind = data::TokenizerKind::kChar;
  if (!c.task.empty()) {
    data::TaskOptions o;
    o.train_size = c.train_size;
    o.test_size = c.test_size;
    o.min_len = c.min_len;
    o.max_len = c.max_len;
    o.alphabet = c.alphabet;
    o.seed = c.seed;
    data::Task t = data::make_task(c.task, o);
    train = std::move(t.train);
    test = std::move(t.test);
    kind = t.tokenizer;
  } else {
    kind = data::tokenizer_from_string(c.tokenizer);
    std::vector<data::TextPair> all = data::load_tsv(c.data);
    std::string hash = file_hash(c.data);
    if (!c.test_data.empty()) {
      train = std::move(all);
      test = data::load_tsv(c.test_data);
      hash.append("+").append(file_hash(c.test_data));
    } else {
      // A seeded held-out split: shuffle once, the last test_fraction of the lines are the test set.
      Rng rng(c.seed ^ 0x7E57DA7AULL);
      const std::vector<int64_t> order = data::shuffled_indices(static_cast<int64_t>(all.size()), rng);
      int64_t n_test = static_cast<int64_t>(c.test_fraction * static_cast<double>(all.size()) + 0.5);
      if (c.test_fraction > 0.0 && n_test == 0 && all.size() >= 2) n_test = 1;
      const int64_t n_train = static_cast<int64_t>(all.size()) - n_test;
      for (int64_t i = 0; i < static_cast<int64_t>(all.size()); ++i)
        (i < n_train ? train : test).push_back(all[static_cast<size_t>(order[static_cast<size_t>(i)])]);
    }
    c.data_hash = hash;
    // Overlong pairs are skipped and counted, never silently: a 200k-character line would make its batches that
    // long (hours, gigabytes).
    struct Dropped {
      std::string file;
      size_t dropped = 0, total = 0, longest = 0;
    };
    auto drop_long = [&](std::vector<data::TextPair>& pairs, const std::string& file) {
      Dropped r{file, 0, pairs.size(), 0};
      // std::erase_if keeps the survivors in order without assigning a pair onto itself (a self move-assignment
      // empties a std::string: every pair before the first dropped one lost its text).
      std::erase_if(pairs, [&](const data::TextPair& p) {
        const size_t n = std::max(data::tokenize(p.src, kind).size(), data::tokenize(p.tgt, kind).size());
        if (static_cast<int64_t>(n) <= c.max_tokens) return false;
        ++r.dropped;
        r.longest = std::max(r.longest, n);
        return true;
      });
      return r;
    };
    const Dropped dtrain = drop_long(train, c.test_data.empty() ? c.data + " (train split)" : c.data);
    const Dropped dtest = drop_long(test, c.test_data.empty() ? c.data + " (test split)" : c.test_data);
    QKV_CHECK_ARG(!train.empty(), "[train] every training pair of '", c.data, "' is longer than --max-tokens ",
                  c.max_tokens, " tokens (longest ", dtrain.longest, ")");
    for (const Dropped& r : {dtrain, dtest})
      if (r.dropped > 0)
        std::fprintf(stderr,
                     "qkv: warning: [tsv] %s: skipped %zu of %zu pairs with more than --max-tokens %lld %s tokens "
                     "on a side (longest %zu)\n",
                     r.file.c_str(), r.dropped, r.total, static_cast<long long>(c.max_tokens),
                     data::tokenizer_name(kind), r.longest);
  }
  RunData d;
  if (given) {
    d.vocab = *given;
  } else {
    std::vector<std::string> texts;
    for (const auto& p : train) {
      texts.push_back(p.src);
      texts.push_back(p.tgt);
    }
    d.vocab = data::Vocabulary::build(texts, kind);
  }
  int64_t longest_tgt = 0, longest_pair = 0;
  auto encode = [&](const std::vector<data::TextPair>& pairs, std::vector<data::Example>& out) {
    for (const auto& p : pairs) {
      data::Example e{d.vocab.encode(p.src), d.vocab.encode(p.tgt)};
      longest_tgt = std::max<int64_t>(longest_tgt, static_cast<int64_t>(e.tgt.size()));
      longest_pair = std::max<int64_t>(longest_pair, static_cast<int64_t>(e.src.size() + e.tgt.size()) + 2);
      out.push_back(std::move(e));
    }
  };
  encode(train, d.train);
  encode(test, d.test);
  d.test_text = std::move(test);
  if (c.max_decode_len == 0) c.max_decode_len = longest_tgt + 8;
  if (c.model == "decoder" && c.max_positions == 0) c.max_positions = longest_pair + 8;
  return d;
}

}  // namespace qkv::train
