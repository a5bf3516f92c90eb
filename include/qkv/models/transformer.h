// Token-level transformer models: the encoder-decoder of "Attention Is All You Need" (embeddings, sinusoidal
// positions, nn::Transformer, a "generator" projection) and a decoder-only causal language model (GPT-style).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "qkv/core/rng.h"
#include "qkv/core/tensor.h"
#include "qkv/models/outputs.h"
#include "qkv/nn/dropout.h"
#include "qkv/nn/embedding.h"
#include "qkv/nn/kv_cache.h"
#include "qkv/nn/layer_norm.h"
#include "qkv/nn/linear.h"
#include "qkv/nn/module.h"
#include "qkv/nn/transformer.h"
#include "qkv/ops/embedding.h"

namespace qkv::models {

// ids (B, T) -> (B, T) float: 1 where ids == pad_id (a kBlock key_padding_mask), else 0.
Tensor padding_mask(const Ids& ids, int64_t pad_id);

struct TransformerSeq2SeqConfig {
  int64_t src_vocab = 0;           // > 0
  int64_t tgt_vocab = 0;           // > 0
  nn::TransformerConfig transformer;
  bool scale_embeddings = true;    // token embeddings * sqrt(d_model), as the paper and PyTorch's tutorial
};

// The masks of one forward; tgt.is_causal is on by default (teacher forcing must not see the future).
struct Seq2SeqMasks {
  nn::AttentionMasks src;          // encoder self-attention, e.g. key_padding_mask = padding_mask(src, pad)
  nn::AttentionMasks tgt = causal_self_attention();
  nn::AttentionMasks memory;       // decoder cross-attention, e.g. key_padding_mask = padding_mask(src, pad)

  static nn::AttentionMasks causal_self_attention() {
    nn::AttentionMasks m;
    m.is_causal = true;
    return m;
  }
};

// Parameters: "src_tok_emb.weight" (Vs, E), "tgt_tok_emb.weight" (Vt, E), "transformer.*" (torch.nn.Transformer's
// names), "generator.weight" (Vt, E), "generator.bias" (Vt). A PyTorch equivalent (batch_first=True):
//   x = dropout(emb(ids) * sqrt(E) + PE[:T]);  logits = generator(transformer(xs, xt, masks...))
// with PE the sinusoidal table of qkv::sinusoidal_table (PyTorch tutorial's PositionalEncoding).
// Dropout children "pos_dropout" (no parameters) follow train()/eval().
class Seq2SeqTransformer : public nn::Module {
 public:
  Seq2SeqTransformer(const TransformerSeq2SeqConfig& config, Rng& rng);

  // src: ids (B, Ts)  tgt: ids (B, Tt)  ->  logits (B, Tt, Vt). Records its backward when `c` trains.
  ad::Var forward(const nn::Context& c, const Ids& src, const Ids& tgt, const Seq2SeqMasks& masks = {}) const;
  // HF's model(src, tgt, output_attentions=..., output_hidden_states=...), for inference (eval mode): logits
  // (B, Tt, Vt), the memory and what options ask (Seq2SeqLMOutput: encoder, decoder and cross-attention weights per
  // layer and head, 0 at masked keys; each stack's L + 1 hidden states, the first its embeddings with positions).
  // attention_layers: layer indices in [0, max(encoder layers, decoder layers)), else std::invalid_argument.
  Seq2SeqLMOutput forward(const Ids& src, const Ids& tgt, const Seq2SeqMasks& masks,
                          const ForwardOptions& options) const;
  // src: ids (B, Ts) -> memory (B, Ts, E). record: null, or what the encoder stack records (nn::StackRecord).
  ad::Var encode(const nn::Context& c, const Ids& src, const nn::AttentionMasks& src_masks = {},
                 nn::StackRecord* record = nullptr) const;
  // tgt: ids (B, Tt)  memory: (B, Ts, E)  ->  logits (B, Tt, Vt). record: null, or what the decoder stack records.
  // cache: null (positions start at 0), or incremental decoding (inference only; nn::DecoderCache with one entry
  // per decoder layer): tgt holds the positions after the cache->length ones the cache holds (the tgt masks sized
  // for the new length, a causal one aligned bottom-right), the memory's keys and values are projected into the
  // cache by the first call (later calls may pass memory undefined; memory_masks still cover its Ts keys).
  ad::Var decode(const nn::Context& c, const Ids& tgt, const ad::Var& memory,
                 const nn::AttentionMasks& tgt_masks = Seq2SeqMasks::causal_self_attention(),
                 const nn::AttentionMasks& memory_masks = {}, nn::StackRecord* record = nullptr,
                 nn::DecoderCache* cache = nullptr) const;
  // Inference forms of the three (in training() mode dropout draws from pos_dropout's Rng).
  Tensor forward(const Ids& src, const Ids& tgt, const Seq2SeqMasks& masks = {}) {
    return forward(nn::Context(&pos_dropout.rng()), src, tgt, masks).value;
  }
  Tensor encode(const Ids& src, const nn::AttentionMasks& src_masks = {}) {
    return encode(nn::Context(&pos_dropout.rng()), src, src_masks).value;
  }
  Tensor decode(const Ids& tgt, const Tensor& memory,
                const nn::AttentionMasks& tgt_masks = Seq2SeqMasks::causal_self_attention(),
                const nn::AttentionMasks& memory_masks = {}) {
    return decode(nn::Context(&pos_dropout.rng()), tgt, memory, tgt_masks, memory_masks).value;
  }

  const TransformerSeq2SeqConfig& config() const { return config_; }

  nn::Embedding src_tok_emb;
  nn::Embedding tgt_tok_emb;
  nn::Dropout pos_dropout;
  nn::Transformer transformer;
  nn::Linear generator;

 private:
  // ids (B, T) -> dropout(table(ids) [· sqrt(E)] + PE[offset : offset + T])
  ad::Var embed(const nn::Context& c, const nn::Embedding& table, const Ids& ids, const char* name,
                int64_t offset = 0) const;
  TransformerSeq2SeqConfig config_;
};

struct DecoderOnlyConfig {
  int64_t vocab = 0;     // > 0
  int64_t max_len = 0;   // > 0: positions 0 .. max_len-1 (learned)
  int64_t num_layers = 2;
  nn::TransformerLayerConfig layer = default_layer();  // pre-LN, GELU, as GPT-2

  static nn::TransformerLayerConfig default_layer() {
    nn::TransformerLayerConfig c;
    c.activation = nn::Activation::kGelu;
    c.norm_first = true;
    return c;
  }
};

// GPT-style causal language model built from encoder layers with is_causal:
//   x = dropout(tok_emb(ids) + pos_emb(0..T-1));  x = layers(x, causal);  logits = lm_head(norm(x))
// Parameters: "tok_emb.weight" (V, E), "pos_emb.weight" (max_len, E), "layers.N.*" (TransformerEncoderLayer),
// "norm.weight", "norm.bias" (E), "lm_head.weight" (V, E) (no bias). Embeddings ~ N(0, 1) as nn.Embedding.
class DecoderOnlyTransformer : public nn::Module {
 public:
  DecoderOnlyTransformer(const DecoderOnlyConfig& config, Rng& rng);

  // ids: (B, T) with T <= max_len  ->  logits (B, T, V). key_padding_mask: optional (B, T_keys), nonzero = padding.
  // positions: optional (each < max_len): T global positions of the ids' columns shared by the rows, as under
  // context parallelism (c.sequence_shard(): ids hold this process's positions), or B·T, each row's own (row b's at
  // [b·T, (b + 1)·T), e.g. left-padded prompts); default cached .. cached + T - 1. Records its backward when `c`
  // trains.
  // caches: null, or one nn::KvCache per layer (new_caches) for incremental decoding (inference only): the ids are
  // the T positions after the `cached` ones the caches hold, a causal row sees every cached key, T_keys = cached + T.
  ad::Var forward(const nn::Context& c, const Ids& ids, const Tensor& key_padding_mask = {},
                  const std::vector<int64_t>* positions = nullptr,
                  std::vector<nn::KvCache>* caches = nullptr) const;
  // Inference (in training() mode dropout draws from emb_dropout's Rng).
  Tensor forward(const Ids& ids, const Tensor& key_padding_mask = {}) {
    return forward(nn::Context(&emb_dropout.rng()), ids, key_padding_mask).value;
  }
  // HF's model(ids, output_attentions=..., output_hidden_states=...), for inference (eval mode): logits (B, T, V)
  // and what options ask (CausalLMOutput: (B, H, T, T) per layer, 0 above the diagonal and at padded keys; L + 1
  // hidden states, the embeddings with positions first, the last after the final norm). caches, positions: as above
  // (a decode step's attentions are (B, H, T, T_keys) over every cached key).
  CausalLMOutput forward(const Ids& ids, const ForwardOptions& options, const Tensor& key_padding_mask = {},
                         std::vector<nn::KvCache>* caches = nullptr,
                         const std::vector<int64_t>* positions = nullptr) const;
  // One empty cache per layer for `rows` sequences, room for `capacity` positions (they grow as needed).
  std::vector<nn::KvCache> new_caches(int64_t rows, int64_t capacity = 16) const;

  const DecoderOnlyConfig& config() const { return config_; }

  nn::Embedding tok_emb;
  nn::Embedding pos_emb;
  nn::Dropout emb_dropout;
  std::vector<std::unique_ptr<nn::TransformerEncoderLayer>> layers;
  nn::LayerNorm norm;
  nn::Linear lm_head;

 private:
  // The forward of both public forms; record: null, or where options' attentions and hidden states go.
  ad::Var run(const nn::Context& c, const Ids& ids, const Tensor& key_padding_mask,
              const std::vector<int64_t>* positions, std::vector<nn::KvCache>* caches, const ForwardOptions* options,
              CausalLMOutput* record) const;

  DecoderOnlyConfig config_;
};

}  // namespace qkv::models
