// The oracle of RNN Seq2Seq decoding: greedy decoding written plainly over Seq2Seq::decode_step, every row kept in
// the batch until all have emitted eos. The library's path (decode::RnnStep + decode::greedy_search) must give its
// tokens.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "qkv/models/seq2seq.h"
#include "qkv/ops/shape_ops.h"

namespace qkv::testing {

struct RnnGreedyDecoded {
  Ids tokens;                    // (B, N), N <= max_len; after a row's eos the row is filled with eos
  std::vector<int64_t> lengths;  // per row: tokens up to and including the first eos, else N
  Tensor alignments;             // (B, N, Ts), 0 after a row's eos; undefined for kNone
};

// Argmax each step (lowest id on ties) from bos until every row has produced eos or max_len steps.
inline RnnGreedyDecoded rnn_greedy_decode(const models::Seq2Seq& model, const Ids& src,
                                          const std::vector<int64_t>& src_lengths, int64_t max_len, int64_t bos,
                                          int64_t eos) {
  const int64_t v = model.config().tgt_vocab;
  const models::Seq2SeqEncoded enc = model.encode(src, src_lengths);
  const int64_t nb = src.shape[0];
  models::Seq2SeqState state = model.initial_state(enc);
  std::vector<int64_t> prev(static_cast<size_t>(nb), bos);
  std::vector<bool> done(static_cast<size_t>(nb), false);
  std::vector<std::vector<int64_t>> steps;
  std::vector<Tensor> weights;
  RnnGreedyDecoded res;
  res.lengths.assign(static_cast<size_t>(nb), 0);
  for (int64_t t = 0; t < max_len; ++t) {
    models::Seq2SeqStep st = model.decode_step(enc, state, prev);
    const Tensor logits = st.logits.contiguous();  // (B, V)
    std::vector<int64_t> tok(static_cast<size_t>(nb));
    for (int64_t b = 0; b < nb; ++b) {
      const size_t bi = static_cast<size_t>(b);
      if (done[bi]) {
        tok[bi] = eos;
        if (st.weights.defined()) st.weights.select(0, b).fill(0.0f);
        continue;
      }
      const float* row = logits.data() + b * v;
      tok[bi] = std::max_element(row, row + v) - row;
      res.lengths[bi] = t + 1;
      if (tok[bi] == eos) done[bi] = true;
    }
    steps.push_back(tok);
    if (st.weights.defined()) weights.push_back(st.weights);
    state = st.state;
    prev = tok;
    if (std::all_of(done.begin(), done.end(), [](bool d) { return d; })) break;
  }
  const int64_t n = static_cast<int64_t>(steps.size());
  res.tokens.shape = {nb, n};
  res.tokens.data.resize(static_cast<size_t>(nb * n));
  for (int64_t t = 0; t < n; ++t)
    for (int64_t b = 0; b < nb; ++b)
      res.tokens.data[static_cast<size_t>(b * n + t)] = steps[static_cast<size_t>(t)][static_cast<size_t>(b)];
  if (!weights.empty()) res.alignments = stack(weights, 1);  // (B, N, Ts)
  return res;
}

}  // namespace qkv::testing
