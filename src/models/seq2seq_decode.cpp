// Seq2Seq greedy decoding: argmax per step from bos until every row has emitted eos or max_len is reached,
// collecting the per-step alignments.
#include <algorithm>

#include "qkv/core/error.h"
#include "qkv/models/seq2seq.h"
#include "qkv/ops/shape_ops.h"

namespace qkv::models {

Seq2SeqDecoded Seq2Seq::greedy_decode(const Ids& src, const std::vector<int64_t>& src_lengths, int64_t max_len,
                                      int64_t bos, int64_t eos) const {
  const int64_t v = config_.tgt_vocab;
  QKV_CHECK_ARG(max_len >= 1, "[Seq2Seq] greedy_decode max_len ", max_len, " must be >= 1");
  QKV_CHECK_ARG(bos >= 0 && bos < v && eos >= 0 && eos < v, "[Seq2Seq] greedy_decode bos ", bos, " and eos ", eos,
                " must be in [0, ", v, ")");
  const Seq2SeqEncoded enc = encode(src, src_lengths);
  const int64_t nb = src.shape[0];
  Seq2SeqState state = initial_state(enc);
  std::vector<int64_t> prev(static_cast<size_t>(nb), bos);
  std::vector<bool> done(static_cast<size_t>(nb), false);
  std::vector<std::vector<int64_t>> steps;
  std::vector<Tensor> weights;
  Seq2SeqDecoded res;
  res.lengths.assign(static_cast<size_t>(nb), 0);
  for (int64_t t = 0; t < max_len; ++t) {
    Seq2SeqStep st = decode_step(enc, state, prev);
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
      tok[bi] = std::max_element(row, row + v) - row;  // first maximum: lowest id on ties
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

}  // namespace qkv::models
