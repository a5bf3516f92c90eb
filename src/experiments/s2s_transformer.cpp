// The Transformer of the experiments' encoder-decoders: models::Seq2SeqTransformer with key-padding masks,
// construction, teacher-forced logits on the tape and greedy decoding through the KV-cached step model.
#include "qkv/decode/search.h"
#include "qkv/decode/transformer_step.h"
#include "qkv/models/transformer.h"
#include "seq2seq_train.h"

namespace qkv::experiments {

S2SModel make_transformer_s2s(int64_t src_vocab, int64_t tgt_vocab, const S2SSize& size, uint64_t seed) {
  models::TransformerSeq2SeqConfig c;
  c.src_vocab = src_vocab;
  c.tgt_vocab = tgt_vocab;
  c.transformer.layer.d_model = size.d_model;
  c.transformer.layer.nhead = size.heads;
  c.transformer.layer.dim_feedforward = size.ff;
  c.transformer.layer.dropout = size.dropout;
  c.transformer.num_encoder_layers = size.layers;
  c.transformer.num_decoder_layers = size.layers;
  Rng rng(seed);
  S2SModel m;
  m.kind = S2SKind::kTransformer;
  m.transformer = std::make_shared<models::Seq2SeqTransformer>(c, rng);
  m.module = m.transformer.get();
  return m;
}

ad::Var transformer_s2s_logits(nn::Context& g, S2SModel& m, const data::Seq2SeqBatch& b) {
  models::Seq2SeqMasks masks;
  masks.src.key_padding_mask = b.src.padding_mask;
  masks.memory.key_padding_mask = b.src.padding_mask;
  masks.tgt.key_padding_mask = b.tgt_in.padding_mask;
  return m.transformer->forward(g, b.src.ids, b.tgt_in.ids, masks);
}

std::vector<std::vector<int64_t>> transformer_s2s_greedy(S2SModel& m, const data::Padded& src, int64_t max_len) {
  m.transformer->eval();
  decode::TransformerCachedStep step(*m.transformer, src.ids, data::Vocabulary::kPad);
  decode::SearchOptions so;
  so.max_len = max_len;
  so.bos = data::Vocabulary::kBos;
  so.eos = data::Vocabulary::kEos;
  std::vector<std::vector<int64_t>> out;
  for (decode::Hypothesis& h : decode::greedy_search(step, so)) {
    if (!h.tokens.empty() && h.tokens.back() == data::Vocabulary::kEos) h.tokens.pop_back();
    out.push_back(std::move(h.tokens));
  }
  m.transformer->train();
  return out;
}

}  // namespace qkv::experiments
