// The data of a `qkv train` run: a built-in task or a TSV corpus, split into train/test, its vocabulary (built from
// the training split) and the examples as ids.
#pragma once

#include <string>
#include <vector>

#include "qkv/data/batch.h"
#include "qkv/data/tsv.h"
#include "qkv/data/vocab.h"
#include "qkv/train/run_config.h"

namespace qkv::train {

struct RunData {
  data::Vocabulary vocab;
  std::vector<data::Example> train, test;
  std::vector<data::TextPair> test_text;
};

// Loads the task or TSV of `c` (errors as data::parse_tsv / data::make_task). Sets c.data_hash (TSV), and fills
// c.max_decode_len and c.max_positions (decoder) when they are 0. With `vocab` given, encodes with it instead
// of building one (eval / translate / resume); the caller compares.
RunData load_run_data(RunConfig& c, const data::Vocabulary* vocab = nullptr);

// FNV-1a 64 of a file's bytes as 16 hex digits; runtime_error when unreadable.
std::string file_hash(const std::string& path);

// One line describing the first difference of two vocabularies ("sizes 14 and 16", "id 5: 'a' vs 'b'", ...).
std::string vocab_difference(const data::Vocabulary& a, const data::Vocabulary& b);

}  // namespace qkv::train
