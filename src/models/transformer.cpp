// models::Seq2SeqTransformer (embeddings + sinusoidal positions + nn::Transformer + generator) and
// models::DecoderOnlyTransformer (GPT-style causal LM). Forward only; the layers do the attention.
#include "qkv/models/transformer.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "qkv/core/error.h"
#include "qkv/nn/positional/sinusoidal.h"
#include "qkv/ops/elementwise.h"
#include "qkv/ops/functional.h"

namespace qkv::models {
namespace {

void check_ids(const Ids& ids, const char* op, const char* name) {
  QKV_CHECK_ARG(ids.shape.size() == 2, "[", op, "] ", name, " ids ", str(ids.shape), " must be (B, T)");
  QKV_CHECK_ARG(static_cast<int64_t>(ids.data.size()) == shape_numel(ids.shape), "[", op, "] ", name, " ids ",
                str(ids.shape), " hold ", ids.data.size(), " values");
}

const TransformerSeq2SeqConfig& checked(const TransformerSeq2SeqConfig& c) {
  QKV_CHECK_ARG(c.src_vocab > 0 && c.tgt_vocab > 0, "[Seq2SeqTransformer] src_vocab ", c.src_vocab,
                " and tgt_vocab ", c.tgt_vocab, " must be > 0");
  QKV_CHECK_ARG(c.transformer.layer.d_model > 0, "[Seq2SeqTransformer] d_model must be > 0, got ",
                c.transformer.layer.d_model);
  return c;
}

const DecoderOnlyConfig& checked(const DecoderOnlyConfig& c) {
  QKV_CHECK_ARG(c.vocab > 0 && c.max_len > 0 && c.num_layers >= 0, "[DecoderOnlyTransformer] vocab ", c.vocab,
                " and max_len ", c.max_len, " must be > 0 and num_layers ", c.num_layers, " >= 0");
  QKV_CHECK_ARG(c.layer.d_model > 0, "[DecoderOnlyTransformer] d_model must be > 0, got ", c.layer.d_model);
  return c;
}

}  // namespace

Tensor padding_mask(const Ids& ids, int64_t pad_id) {
  check_ids(ids, "padding_mask", "the");
  Tensor m = Tensor::zeros(ids.shape);
  float* p = m.data();
  for (size_t i = 0; i < ids.data.size(); ++i) p[i] = ids.data[i] == pad_id ? 1.0f : 0.0f;
  return m;
}

// --- Seq2SeqTransformer --------------------------------------------------------------------------------------

Seq2SeqTransformer::Seq2SeqTransformer(const TransformerSeq2SeqConfig& c, Rng& rng)
    : src_tok_emb(checked(c).src_vocab, c.transformer.layer.d_model, rng),
      tgt_tok_emb(c.tgt_vocab, c.transformer.layer.d_model, rng),
      pos_dropout(c.transformer.layer.dropout, rng.next_u64()),
      transformer(c.transformer, rng),
      generator(c.transformer.layer.d_model, c.tgt_vocab, true, rng),
      config_(c) {
  register_module("src_tok_emb", &src_tok_emb);
  register_module("tgt_tok_emb", &tgt_tok_emb);
  register_module("pos_dropout", &pos_dropout);
  register_module("transformer", &transformer);
  register_module("generator", &generator);
}

ad::Var Seq2SeqTransformer::embed(const nn::Context& c, const nn::Embedding& table, const Ids& ids,
                                  const char* name, int64_t offset) const {
  check_ids(ids, "Seq2SeqTransformer", name);
  ad::Var x = table.forward(c, ids);  // (B, T, E)
  if (config_.scale_embeddings)
    x = ad::scale(x, std::sqrt(static_cast<float>(config_.transformer.layer.d_model)));
  return pos_dropout.forward(c, ad::add_sinusoidal(x, offset));
}

ad::Var Seq2SeqTransformer::encode(const nn::Context& c, const Ids& src, const nn::AttentionMasks& src_masks,
                                   nn::StackRecord* record) const {
  return transformer.encoder.forward(c, embed(c, src_tok_emb, src, "src"), src_masks, record);
}

ad::Var Seq2SeqTransformer::decode(const nn::Context& c, const Ids& tgt, const ad::Var& memory,
                                   const nn::AttentionMasks& tgt_masks, const nn::AttentionMasks& memory_masks,
                                   nn::StackRecord* record, nn::DecoderCache* cache) const {
  const ad::Var x = embed(c, tgt_tok_emb, tgt, "tgt", cache ? cache->length : 0);
  return generator.forward(c, transformer.decoder.forward(c, x, memory, tgt_masks, memory_masks, record, cache));
}

Seq2SeqLMOutput Seq2SeqTransformer::forward(const Ids& src, const Ids& tgt, const Seq2SeqMasks& masks,
                                            const ForwardOptions& options) const {
  check_ids(src, "Seq2SeqTransformer", "src");
  check_ids(tgt, "Seq2SeqTransformer", "tgt");
  QKV_CHECK_ARG(src.shape[0] == tgt.shape[0], "[Seq2SeqTransformer] src ids ", str(src.shape), " and tgt ids ",
                str(tgt.shape), " must have the same batch size");
  const int64_t le = transformer.encoder.num_layers(), ld = transformer.decoder.num_layers();
  const std::vector<bool> asked = attention_layers_asked(options, std::max(le, ld), "Seq2SeqTransformer");
  nn::StackRecord enc, dec;
  if (options.output_attentions) {
    enc.attention_layers.assign(asked.begin(), asked.begin() + le);
    dec.attention_layers.assign(asked.begin(), asked.begin() + ld);
  }
  enc.output_hidden_states = dec.output_hidden_states = options.output_hidden_states;
  const nn::Context c;
  Seq2SeqLMOutput out;
  const ad::Var memory = encode(c, src, masks.src, &enc);
  out.logits = decode(c, tgt, memory, masks.tgt, masks.memory, &dec).value;
  out.encoder_last_hidden_state = memory.value;
  out.encoder_attentions = std::move(enc.attentions);
  out.decoder_attentions = std::move(dec.attentions);
  out.cross_attentions = std::move(dec.cross_attentions);
  out.encoder_hidden_states = std::move(enc.hidden_states);
  out.decoder_hidden_states = std::move(dec.hidden_states);
  return out;
}

ad::Var Seq2SeqTransformer::forward(const nn::Context& c, const Ids& src, const Ids& tgt,
                                    const Seq2SeqMasks& masks) const {
  check_ids(src, "Seq2SeqTransformer", "src");
  check_ids(tgt, "Seq2SeqTransformer", "tgt");
  QKV_CHECK_ARG(src.shape[0] == tgt.shape[0], "[Seq2SeqTransformer] src ids ", str(src.shape), " and tgt ids ",
                str(tgt.shape), " must have the same batch size");
  return decode(c, tgt, encode(c, src, masks.src), masks.tgt, masks.memory);
}

// --- DecoderOnlyTransformer ----------------------------------------------------------------------------------

DecoderOnlyTransformer::DecoderOnlyTransformer(const DecoderOnlyConfig& c, Rng& rng)
    : tok_emb(checked(c).vocab, c.layer.d_model, rng),
      pos_emb(c.max_len, c.layer.d_model, rng),
      emb_dropout(c.layer.dropout, rng.next_u64()),
      norm(c.layer.d_model, c.layer.layer_norm_eps, true, c.layer.bias),
      lm_head(c.layer.d_model, c.vocab, false, rng),
      config_(c) {
  register_module("tok_emb", &tok_emb);
  register_module("pos_emb", &pos_emb);
  register_module("emb_dropout", &emb_dropout);
  for (int64_t i = 0; i < c.num_layers; ++i) {
    layers.push_back(std::make_unique<nn::TransformerEncoderLayer>(c.layer, rng));
    register_module("layers." + std::to_string(i), layers.back().get());
  }
  register_module("norm", &norm);
  register_module("lm_head", &lm_head);
}

ad::Var DecoderOnlyTransformer::forward(const nn::Context& c, const Ids& ids, const Tensor& key_padding_mask,
                                       const std::vector<int64_t>* positions,
                                       std::vector<nn::KvCache>* caches) const {
  return run(c, ids, key_padding_mask, positions, caches, nullptr, nullptr);
}

CausalLMOutput DecoderOnlyTransformer::forward(const Ids& ids, const ForwardOptions& options,
                                               const Tensor& key_padding_mask, std::vector<nn::KvCache>* caches,
                                               const std::vector<int64_t>* positions) const {
  CausalLMOutput out;
  out.logits = run(nn::Context(), ids, key_padding_mask, positions, caches, &options, &out).value;
  return out;
}

std::vector<nn::KvCache> DecoderOnlyTransformer::new_caches(int64_t rows, int64_t capacity) const {
  std::vector<nn::KvCache> caches(layers.size());
  for (size_t l = 0; l < layers.size(); ++l)
    caches[l].reset(rows, layers[l]->self_attn.num_heads(), layers[l]->self_attn.head_dim(), capacity);
  return caches;
}

ad::Var DecoderOnlyTransformer::run(const nn::Context& c, const Ids& ids, const Tensor& key_padding_mask,
                                    const std::vector<int64_t>* positions, std::vector<nn::KvCache>* caches,
                                    const ForwardOptions* options, CausalLMOutput* record) const {
  check_ids(ids, "DecoderOnlyTransformer", "input");
  const int64_t B = ids.shape[0], T = ids.shape[1];
  int64_t cached = 0;
  if (caches != nullptr) {
    QKV_CHECK_ARG(caches->size() == layers.size(), "[DecoderOnlyTransformer] ", caches->size(), " caches for ",
                  layers.size(), " layers (new_caches)");
    if (!caches->empty() && caches->front().ready()) cached = caches->front().length();
  }
  ad::Var x;
  if (positions == nullptr) {
    QKV_CHECK_ARG(T <= config_.max_len, "[DecoderOnlyTransformer] ids ", str(ids.shape), " are longer than max_len ",
                  config_.max_len);
    QKV_CHECK_ARG(cached + T <= config_.max_len, "[DecoderOnlyTransformer] ids ", str(ids.shape), " after ", cached,
                  " cached positions run past max_len ", config_.max_len);
    // (B, T, E) + pos_emb rows cached .. cached + T - 1
    x = ad::add_learned_positions(tok_emb.forward(c, ids), c.param(pos_emb.weight), cached);
  } else {
    const int64_t n = static_cast<int64_t>(positions->size());
    QKV_CHECK_ARG(n == T || n == B * T, "[DecoderOnlyTransformer] ", n, " positions for ids ", str(ids.shape),
                  " (T shared by the rows, or B*T)");
    for (const int64_t p : *positions)
      QKV_CHECK_ARG(p >= 0 && p < config_.max_len, "[DecoderOnlyTransformer] position ", p, " of ids ",
                    str(ids.shape), " is outside the max_len ", config_.max_len, " learned positions");
    // (B, T, E) + pos_emb rows `positions`, broadcast over the batch when shared
    x = ad::add(tok_emb.forward(c, ids), pos_emb.forward(c, Ids{*positions, n == T ? Shape{1, T} : Shape{B, T}}));
  }
  x = emb_dropout.forward(c, x);
  nn::AttentionMasks masks;
  masks.is_causal = true;  // with caches: bottom-right, the new rows sit after the cached positions
  if (key_padding_mask.defined()) {
    QKV_CHECK_ARG(key_padding_mask.shape() == Shape({B, cached + T}), "[DecoderOnlyTransformer] key_padding_mask ",
                  str(key_padding_mask.shape()), " must be (B, T_keys) = ", str(Shape{B, cached + T}));
    masks.key_padding_mask = key_padding_mask;
  }
  const bool hidden = record && options->output_hidden_states;
  std::vector<bool> asked(layers.size(), false);
  if (record) asked = attention_layers_asked(*options, static_cast<int64_t>(layers.size()), "DecoderOnlyTransformer");
  if (record && options->output_attentions) record->attentions.assign(layers.size(), Tensor());
  if (hidden) record->hidden_states.assign(1, x.value);
  for (size_t i = 0; i < layers.size(); ++i) {
    nn::KvCache* cache = caches != nullptr ? &(*caches)[i] : nullptr;
    x = layers[i]->forward(c, x, masks, cache, asked[i] ? &record->attentions[i] : nullptr);
    if (hidden && i + 1 < layers.size()) record->hidden_states.push_back(x.value);
  }
  x = norm.forward(c, x);
  if (hidden) {  // the last layer's output after the final norm, as HF (no layers: the normalised embeddings)
    if (layers.empty()) record->hidden_states.clear();
    record->hidden_states.push_back(x.value);
  }
  return lm_head.forward(c, x);
}

}  // namespace qkv::models
