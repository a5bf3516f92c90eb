// The RNN family of the experiments' encoder-decoders: models::Seq2Seq (GRU) without attention, with Bahdanau or
// with Luong-general attention; construction, teacher-forced logits on the tape, greedy decoding, alignments.
#include "qkv/decode/rnn_step.h"
#include "qkv/decode/search.h"
#include "qkv/models/seq2seq.h"
#include "seq2seq_train.h"

namespace qkv::experiments {

S2SModel make_rnn_s2s(S2SKind kind, int64_t src_vocab, int64_t tgt_vocab, const S2SSize& size, uint64_t seed) {
  models::Seq2SeqConfig c;
  c.src_vocab = src_vocab;
  c.tgt_vocab = tgt_vocab;
  c.embed_dim = size.embed;
  c.hidden_size = size.hidden;
  c.cell = models::RnnCell::kGRU;
  c.attention = kind == S2SKind::kBahdanau ? models::Seq2SeqAttention::kBahdanau
                : kind == S2SKind::kLuong  ? models::Seq2SeqAttention::kLuongGeneral
                                           : models::Seq2SeqAttention::kNone;
  Rng rng(seed);
  S2SModel m;
  m.kind = kind;
  m.rnn = std::make_shared<models::Seq2Seq>(c, rng);
  m.module = m.rnn.get();
  return m;
}

ad::Var rnn_s2s_logits(nn::Context& g, S2SModel& m, const data::Seq2SeqBatch& b) {
  return m.rnn->forward(g, b.src.ids, b.src.lengths, b.tgt_in.ids).logits;
}

std::vector<std::vector<int64_t>> rnn_s2s_greedy(S2SModel& m, const data::Padded& src, int64_t max_len) {
  decode::RnnStep step(*m.rnn, src.ids, src.lengths);
  decode::SearchOptions so;
  so.max_len = max_len;
  so.bos = data::Vocabulary::kBos;
  so.eos = data::Vocabulary::kEos;
  std::vector<std::vector<int64_t>> out;
  for (decode::Hypothesis& h : decode::greedy_search(step, so)) {
    if (!h.tokens.empty() && h.tokens.back() == data::Vocabulary::kEos) h.tokens.pop_back();
    out.push_back(std::move(h.tokens));
  }
  return out;
}

Tensor rnn_s2s_alignment(S2SModel& m, const data::Seq2SeqBatch& b) {
  if (m.kind == S2SKind::kRnn) return {};
  const models::Seq2SeqOutput o = m.rnn->forward(b.src.ids, b.src.lengths, b.tgt_in.ids);
  const int64_t tt = b.tgt_out.lengths[0], ts = b.src.lengths[0];
  return o.alignments.select(0, 0).slice(0, 0, tt).slice(1, 0, ts).contiguous();
}

}  // namespace qkv::experiments
