// Seq2SeqTransformer and DecoderOnlyTransformer as tape forwards through Graph's layers, step for step as
// src/models/transformer.cpp.
#include "qkv/train/transformer_models.h"

#include <cmath>

#include "functional_internal.h"
#include "qkv/core/error.h"

namespace qkv::train {
using detail::check_ids;

Var seq2seq_transformer_logits(Graph& g, const models::Seq2SeqTransformer& m, const Ids& src, const Ids& tgt,
                               const models::Seq2SeqMasks& masks) {
  check_ids(src, "Seq2SeqTransformer", "src");
  check_ids(tgt, "Seq2SeqTransformer", "tgt");
  QKV_CHECK_ARG(src.shape[0] == tgt.shape[0], "[Seq2SeqTransformer] src ids ", str(src.shape), " and tgt ids ",
                str(tgt.shape), " must have the same batch size");
  const auto& cfg = m.config();
  const float emb_scale = std::sqrt(static_cast<float>(cfg.transformer.layer.d_model));
  auto embed = [&](const nn::Embedding& table, const Ids& ids) {
    Var x = g.embedding(table, ids);
    if (cfg.scale_embeddings) x = scale(x, emb_scale);
    return g.dropout(m.pos_dropout, add_sinusoidal(x));
  };
  const Var memory = g.encoder(m.transformer.encoder, embed(m.src_tok_emb, src), masks.src);
  const Var y = g.decoder(m.transformer.decoder, embed(m.tgt_tok_emb, tgt), memory, masks.tgt, masks.memory);
  return g.linear(m.generator, y);
}

Var decoder_only_logits(Graph& g, const models::DecoderOnlyTransformer& m, const Ids& ids,
                        const Tensor& key_padding_mask) {
  check_ids(ids, "DecoderOnlyTransformer", "input");
  const int64_t B = ids.shape[0], T = ids.shape[1];
  QKV_CHECK_ARG(T <= m.config().max_len, "[DecoderOnlyTransformer] ids ", str(ids.shape),
                " are longer than max_len ", m.config().max_len);
  Var x = g.dropout(m.emb_dropout, add_learned_positions(g.embedding(m.tok_emb, ids), g.param(m.pos_emb.weight)));
  nn::AttentionMasks masks;
  masks.is_causal = true;
  if (key_padding_mask.defined()) {
    QKV_CHECK_ARG(key_padding_mask.shape() == Shape({B, T}), "[DecoderOnlyTransformer] key_padding_mask ",
                  str(key_padding_mask.shape()), " must be (B, T) = ", str(Shape{B, T}));
    masks.key_padding_mask = key_padding_mask;
  }
  for (const auto& layer : m.layers) x = g.encoder_layer(*layer, x, masks);
  return g.linear(m.lm_head, g.layer_norm(m.norm, x));
}

}  // namespace qkv::train
