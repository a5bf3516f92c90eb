// Batched decoding (greedy or beam) of many sources and the two scores of a run: exact match and token accuracy.
#include <algorithm>

#include "qkv/core/error.h"
#include "qkv/data/vocab.h"
#include "qkv/train/run_model.h"

namespace qkv::train {

std::vector<std::vector<int64_t>> decode_all(TextModel& model, const std::vector<std::vector<int64_t>>& sources,
                                             const DecodeSettings& s) {
  QKV_CHECK_ARG(s.max_len >= 1 && s.beam >= 1 && s.batch >= 1, "[decode] max_len, beam and batch must be >= 1");
  std::vector<std::vector<int64_t>> out;
  out.reserve(sources.size());
  const decode::SearchOptions opts{s.max_len, data::Vocabulary::kBos, data::Vocabulary::kEos};
  for (size_t start = 0; start < sources.size(); start += static_cast<size_t>(s.batch)) {
    const size_t end = std::min(sources.size(), start + static_cast<size_t>(s.batch));
    const std::vector<std::vector<int64_t>> chunk(sources.begin() + static_cast<std::ptrdiff_t>(start),
                                                  sources.begin() + static_cast<std::ptrdiff_t>(end));
    auto step = model.decoder(chunk);
    std::vector<decode::Hypothesis> best;
    if (s.beam == 1) {
      best = decode::greedy_search(*step, opts);
    } else {
      for (auto& hyps : decode::beam_search(*step, opts, {s.beam, decode::LengthPenalty::kGnmt, s.alpha}))
        best.push_back(hyps.empty() ? decode::Hypothesis{} : hyps.front());
    }
    for (auto& h : best) {
      if (h.finished && !h.tokens.empty()) h.tokens.pop_back();  // drop EOS
      out.push_back(std::move(h.tokens));
    }
  }
  return out;
}

EvalResult evaluate(TextModel& model, const std::vector<data::Example>& examples, int64_t limit,
                    const DecodeSettings& settings) {
  const size_t n = limit <= 0 ? examples.size() : std::min(examples.size(), static_cast<size_t>(limit));
  EvalResult r;
  if (n == 0) return r;
  std::vector<std::vector<int64_t>> sources;
  for (size_t i = 0; i < n; ++i) sources.push_back(examples[i].src);
  const auto outputs = decode_all(model, sources, settings);
  int64_t exact = 0, correct = 0, total = 0;
  for (size_t i = 0; i < n; ++i) {
    std::vector<int64_t> ref = examples[i].tgt, out = outputs[i];
    exact += out == ref;
    ref.push_back(data::Vocabulary::kEos);
    out.push_back(data::Vocabulary::kEos);  // outputs are cut before EOS (max_len exceeds every reference)
    for (size_t j = 0; j < ref.size(); ++j) correct += j < out.size() && out[j] == ref[j];
    total += static_cast<int64_t>(ref.size());
  }
  r.examples = static_cast<int64_t>(n);
  r.tokens = total;
  r.exact_match = static_cast<double>(exact) / static_cast<double>(n);
  r.token_accuracy = static_cast<double>(correct) / static_cast<double>(total);
  return r;
}

}  // namespace qkv::train
