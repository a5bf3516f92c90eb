// Padding, seq2seq / LM batch construction and the seeded epoch sampler.
#include "qkv/data/batch.h"

#include <algorithm>

#include "qkv/core/error.h"
#include "qkv/data/vocab.h"

namespace qkv::data {

Padded pad_sequences(const std::vector<std::vector<int64_t>>& seqs, int64_t pad, int64_t min_len) {
  QKV_CHECK_ARG(!seqs.empty(), "[pad_sequences] needs at least one sequence");
  QKV_CHECK_ARG(min_len >= 0, "[pad_sequences] min_len must be >= 0, got ", min_len);
  const int64_t B = static_cast<int64_t>(seqs.size());
  int64_t T = min_len;
  for (const auto& s : seqs) T = std::max<int64_t>(T, static_cast<int64_t>(s.size()));
  Padded p;
  p.ids.shape = {B, T};
  p.ids.data.assign(static_cast<size_t>(B * T), pad);
  p.padding_mask = Tensor::ones({B, T});
  float* m = p.padding_mask.data();
  for (int64_t b = 0; b < B; ++b) {
    const auto& s = seqs[static_cast<size_t>(b)];
    std::copy(s.begin(), s.end(), p.ids.data.begin() + b * T);
    std::fill(m + b * T, m + b * T + static_cast<int64_t>(s.size()), 0.0f);
    p.lengths.push_back(static_cast<int64_t>(s.size()));
  }
  return p;
}

Seq2SeqBatch make_seq2seq_batch(const std::vector<const Example*>& examples, bool add_src_eos) {
  QKV_CHECK_ARG(!examples.empty(), "[make_seq2seq_batch] needs at least one example");
  std::vector<std::vector<int64_t>> src, tin, tout;
  for (const Example* e : examples) {
    QKV_CHECK_ARG(e != nullptr, "[make_seq2seq_batch] null example");
    src.push_back(e->src);
    if (add_src_eos) src.back().push_back(Vocabulary::kEos);
    tin.push_back({Vocabulary::kBos});
    tin.back().insert(tin.back().end(), e->tgt.begin(), e->tgt.end());
    tout.push_back(e->tgt);
    tout.back().push_back(Vocabulary::kEos);
  }
  Seq2SeqBatch b;
  b.src = pad_sequences(src, Vocabulary::kPad, 1);
  b.tgt_in = pad_sequences(tin, Vocabulary::kPad);
  b.tgt_out = pad_sequences(tout, Vocabulary::kPad);
  for (int64_t n : b.tgt_out.lengths) b.num_target_tokens += n;
  return b;
}

LmBatch make_lm_batch(const std::vector<const Example*>& examples) {
  QKV_CHECK_ARG(!examples.empty(), "[make_lm_batch] needs at least one example");
  std::vector<std::vector<int64_t>> in, out;
  LmBatch b;
  for (const Example* e : examples) {
    QKV_CHECK_ARG(e != nullptr, "[make_lm_batch] null example");
    std::vector<int64_t> x = e->src;
    x.push_back(Vocabulary::kBos);
    x.insert(x.end(), e->tgt.begin(), e->tgt.end());
    // target at position i is x[i + 1] (or EOS after the last token), scored only from the BOS on.
    std::vector<int64_t> y(x.size(), Vocabulary::kPad);
    const size_t first = e->src.size();  // the BOS position
    for (size_t i = first; i < x.size(); ++i) y[i] = i + 1 < x.size() ? x[i + 1] : Vocabulary::kEos;
    b.prompt_lengths.push_back(static_cast<int64_t>(first + 1));
    b.num_target_tokens += static_cast<int64_t>(x.size() - first);
    in.push_back(std::move(x));
    out.push_back(std::move(y));
  }
  b.input = pad_sequences(in, Vocabulary::kPad);
  b.targets = pad_sequences(out, Vocabulary::kPad).ids.data;
  return b;
}

std::vector<int64_t> shuffled_indices(int64_t n, Rng& rng) {
  QKV_CHECK_ARG(n >= 0, "[shuffled_indices] n must be >= 0, got ", n);
  std::vector<int64_t> idx(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) idx[static_cast<size_t>(i)] = i;
  for (int64_t i = n - 1; i > 0; --i)
    std::swap(idx[static_cast<size_t>(i)], idx[static_cast<size_t>(rng.below(static_cast<uint64_t>(i + 1)))]);
  return idx;
}

Sampler::Sampler(int64_t n, int64_t batch_size, uint64_t seed) : n_(n), batch_size_(batch_size), seed_(seed) {
  QKV_CHECK_ARG(n >= 1, "[Sampler] needs at least one example, got ", n);
  QKV_CHECK_ARG(batch_size >= 1, "[Sampler] batch_size must be >= 1, got ", batch_size);
  reshuffle();
}

void Sampler::reshuffle() {
  // splitmix64 of (seed, epoch): independent streams per epoch.
  uint64_t z = seed_ + 0x9E3779B97F4A7C15ULL * static_cast<uint64_t>(epoch_ + 1);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  z ^= z >> 31;
  Rng rng(z);
  order_ = shuffled_indices(n_, rng);
}

std::vector<int64_t> Sampler::next() {
  if (pos_ >= n_) {
    ++epoch_;
    pos_ = 0;
    reshuffle();
  }
  const int64_t end = std::min(n_, pos_ + batch_size_);
  std::vector<int64_t> out(order_.begin() + pos_, order_.begin() + end);
  pos_ = end;
  return out;
}

void Sampler::seek(int64_t epoch, int64_t position) {
  QKV_CHECK_ARG(epoch >= 0 && position >= 0 && position <= n_, "[Sampler] seek(", epoch, ", ", position,
                ") is outside epoch >= 0, position in [0, ", n_, "]");
  epoch_ = epoch;
  pos_ = position;
  reshuffle();
}

}  // namespace qkv::data
