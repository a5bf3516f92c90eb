// BERT encoder (HF BertModel, post-LN) assembled from qkv's modules, and SentenceEncoder: a sentence-transformers
// model folder (all-MiniLM-L6-v2) run end to end: WordPiece -> BERT -> mean pooling -> L2 normalisation.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "qkv/core/rng.h"
#include "qkv/core/tensor.h"
#include "qkv/models/outputs.h"
#include "qkv/models/wordpiece.h"
#include "qkv/nn/embedding.h"
#include "qkv/nn/feed_forward.h"
#include "qkv/nn/layer_norm.h"
#include "qkv/nn/module.h"
#include "qkv/nn/transformer.h"

namespace qkv::models {

// BERT's hyper-parameters under HF config.json's names. Defaults are all-MiniLM-L6-v2's.
struct BertConfig {
  int64_t vocab_size = 30522;
  int64_t hidden_size = 384;        // E
  int64_t num_hidden_layers = 6;
  int64_t num_attention_heads = 12;  // H; D = E / H
  int64_t intermediate_size = 1536;
  int64_t max_position_embeddings = 512;
  int64_t type_vocab_size = 2;
  float layer_norm_eps = 1e-12f;
  nn::Activation hidden_act = nn::Activation::kGelu;  // "gelu" is the exact erf form

  // Reads HF's config.json. Unsupported models (model_type other than "bert", relative positions, unknown
  // activations) and missing or ill-typed fields throw std::runtime_error "[bert] <path>: <what>".
  static BertConfig from_json_file(const std::string& path);
};

// Word + position + token-type (always 0) embeddings, then LayerNorm, as HF's BertEmbeddings (eval mode).
// Parameters: word_embeddings.weight (V, E), position_embeddings.weight (P, E), token_type_embeddings.weight
// (types, E), norm.{weight,bias} (E).
class BertEmbeddings : public nn::Module {
 public:
  // Tables drawn from rng (N(0, 1)), or uninitialised under nn::SkipInit (to be loaded).
  BertEmbeddings(const BertConfig& config, Rng& rng);

  // ids: (N) in [0, V)  positions: (N) in [0, P)  token_types: (N) in [0, types), or empty for all 0  ->  (N, E)
  Tensor forward(const std::vector<int64_t>& ids, const std::vector<int64_t>& positions,
                 const std::vector<int64_t>& token_types = {}) const;

  nn::Embedding word_embeddings;
  nn::Embedding position_embeddings;
  nn::Embedding token_type_embeddings;
  nn::LayerNorm norm;
};

// Parameters (qkv names; HF's map onto them in load_hf_state_dict):
//   embeddings.* (BertEmbeddings), encoder.layers.N.{self_attn.in_proj_weight, self_attn.in_proj_bias,
//   self_attn.out_proj.*, linear1.*, linear2.*, norm1.*, norm2.*}  (nn::TransformerEncoder: post-LN,
//   activation hidden_act, eps layer_norm_eps).
// Always in eval mode (dropout off): this is an inference model.
class BertModel : public nn::Module {
 public:
  // Random init from `rng` (every parameter is meant to be overwritten by load_hf_state_dict); under nn::SkipInit
  // every parameter starts at zero and nothing is drawn, for loading.
  BertModel(const BertConfig& config, Rng& rng);

  // HF BertModel weights -> this module, the only place where the two naming schemes meet. Names may carry a
  // "bert." prefix; query/key/value are stacked into in_proj (rows [Q; K; V]); pooler.* and buffers are ignored.
  // A missing tensor or a wrong shape throws std::runtime_error "[bert] ..." naming the HF tensor; nothing is
  // changed then.
  void load_hf_state_dict(const nn::StateDict& hf);
  // The inverse mapping: this module's weights under HF's names (used to write test checkpoints).
  nn::StateDict hf_state_dict() const;

  // The fast path. ids: the tokens of B sequences end to end; lengths: (B), each in [1, max_position_embeddings],
  // summing to ids.size()  ->  hidden states (N, E), N = ids.size(). Every sequence attends to itself only, so no
  // padding exists and none is computed; the linear layers run once over all N tokens.
  Tensor forward_packed(const std::vector<int64_t>& ids, const std::vector<int64_t>& lengths);

  // The plain twin: ids, attention_mask (B, T) (1 = token, 0 = padding; right-padded)  ->  (B, T, E).
  // Padded keys are blocked through nn::TransformerEncoder's key_padding_mask; padded query rows hold garbage.
  Tensor forward(const Ids& ids, const Ids& attention_mask) const;

  // HF's BertModel(input_ids, attention_mask, token_type_ids, output_attentions=..., output_hidden_states=...)
  // through the plain path. ids (B, T), T in [1, max_position_embeddings]; attention_mask (B, T) (1 = token,
  // 0 = padding) or empty (every position a token); token_type_ids (B, T) or empty (all 0)  ->  last_hidden_state
  // (B, T, E) and what options ask (BaseModelOutput): attentions, one (B, H, T, T) per layer (each query row sums to
  // 1 over the tokens, padded keys get 0), what the viewer draws; hidden_states, the embeddings' output then each
  // layer's. The weights are recomputed beside the fused kernel (last_hidden_state is the same with or without
  // them); forward_packed, the embedding path, never pays for them. No pooler (its weights are not loaded).
  // attention_layers out of [0, L) throw std::invalid_argument.
  BaseModelOutput forward(const Ids& ids, const Ids& attention_mask, const ForwardOptions& options,
                          const Ids& token_type_ids = {}) const;

  const BertConfig& config() const { return config_; }

  BertEmbeddings embeddings;
  nn::TransformerEncoder encoder;

 private:
  BertConfig config_;
};

// Mean of the rows of each sequence: hidden (N, E), lengths (B) summing to N, each >= 1  ->  (B, E).
Tensor mean_pool_packed(const Tensor& hidden, const std::vector<int64_t>& lengths);
// Each row divided by max(||row||_2, 1e-12), as torch.nn.functional.normalize: x (B, E) -> (B, E).
Tensor l2_normalize_rows(const Tensor& x);

// A sentence-transformers model folder: Transformer (BERT) -> Pooling (mean) -> Normalize (when listed).
class SentenceEncoder {
 public:
  // Required: config.json, vocab.txt, model.safetensors. Read when present: tokenizer_config.json (lower-casing,
  // special tokens), sentence_bert_config.json (max_seq_length), modules.json (+ the pooling module's
  // config.json). A missing folder or file, or a broken one, throws std::runtime_error with one line naming it.
  // precision (qkv/core/precision.h): how the linear layers and attention compute; the weights are converted once
  // here (bf16-rounded, or int8 per output channel), never per call. docs/PRECISION.md gives the accuracy of each.
  explicit SentenceEncoder(const std::string& model_dir, Precision precision = Precision::kFloat32);
  ~SentenceEncoder();

  // texts: N strings (valid UTF-8)  ->  (N, E) float32 embeddings. Texts are truncated to max_seq_length tokens,
  // sorted by length and run batch_size at a time (batch_size >= 1) without padding.
  Tensor encode(const std::vector<std::string>& texts, int64_t batch_size = 32) const;

  // The word pieces of `text` ([CLS] ... [SEP], truncated as encode() does) and every layer's attention weights,
  // one (H, T, T) tensor per layer. With `second`, the pair [CLS] text [SEP] second [SEP] (token types 0 then 1),
  // as BERT's tokenizer encodes two sentences; a pair longer than max_seq_length throws std::invalid_argument.
  // mask: token positions (in [0, T)) replaced by [MASK] before the forward, to see what a token's absence does.
  struct TokenAttentions {
    std::vector<std::string> tokens;  // (T)
    std::vector<Tensor> weights;      // L x (H, T, T)
    int64_t first_length = 0;         // tokens of the first segment, [CLS] and its [SEP] included
  };
  TokenAttentions attentions(const std::string& text, const std::string* second = nullptr,
                             const std::vector<int64_t>& mask = {}) const;

  const WordPieceTokenizer& tokenizer() const { return *tokenizer_; }
  BertModel& model() const { return *model_; }
  int64_t max_seq_length() const { return max_seq_length_; }
  int64_t embedding_dim() const { return model_->config().hidden_size; }
  bool normalizes() const { return normalize_; }
  Precision precision() const { return model_->precision(); }

 private:
  std::unique_ptr<WordPieceTokenizer> tokenizer_;
  std::unique_ptr<BertModel> model_;
  int64_t max_seq_length_ = 0;
  bool normalize_ = false;
};

}  // namespace qkv::models
