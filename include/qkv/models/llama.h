// Llama-style decoder-only language models under Hugging Face's names: Llama, Mistral (sliding window), Qwen 2 (q/k/v
// biases, a window on the upper layers) and Gemma 2 (logit soft-capping, sliding window on alternating layers,
// (1 + w) RMSNorm, sandwich norms, scaled embeddings); rotary scalings linear, llama3 and yarn.
// RMSNorm, rotary positions (HF's rotate_half pairing), grouped-query attention and a gated MLP (SwiGLU / GeGLU).
// One forward: inference with constants, training on a tape, decoding with one nn::KvCache per layer.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "qkv/core/gguf.h"
#include "qkv/core/ids.h"
#include "qkv/core/rng.h"
#include "qkv/core/tensor.h"
#include "qkv/models/outputs.h"
#include "qkv/nn/context.h"
#include "qkv/nn/embedding.h"
#include "qkv/nn/kv_cache.h"
#include "qkv/nn/layer_norm.h"
#include "qkv/nn/linear.h"
#include "qkv/nn/module.h"
#include "qkv/ops/positional/rope.h"

namespace qkv::models {

// The activation of the gate branch of the MLP: down(act(gate(x)) · up(x)).
enum class GatedActivation {
  kSilu,      // "silu": SwiGLU (Llama, Mistral)
  kGelu,      // "gelu": exact erf form
  kGeluTanh,  // "gelu_pytorch_tanh" / "gelu_new": GeGLU (Gemma 2)
};

// The hyper-parameters, under HF config.json's names. Defaults are Llama's; from_json_file fills Mistral's, Qwen 2's
// and Gemma 2's switches from model_type.
struct LlamaConfig {
  std::string model_type = "llama";  // "llama", "mistral", "qwen2" or "gemma2"
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;             // E
  int64_t intermediate_size = 0;       // F
  int64_t num_hidden_layers = 0;       // L
  int64_t num_attention_heads = 0;     // Hq
  int64_t num_key_value_heads = 0;     // Hkv, divides Hq (GQA; Hkv == 1: MQA)
  int64_t head_dim = 0;                // D (HF's default E / Hq)
  float rms_norm_eps = 1e-6f;
  float rope_theta = 10000.0f;
  RopeScaling rope_scaling;  // rope_parameters' rope_type and its fields (default: none)
  int64_t max_position_embeddings = 2048;  // positions must stay below it
  bool tie_word_embeddings = false;        // logits = x · embed_tokensᵀ (no lm_head.weight)
  GatedActivation hidden_act = GatedActivation::kSilu;
  bool attention_bias = false;  // q/k/v/o projections with a bias
  bool qkv_bias = false;        // q/k/v projections with a bias, o_proj without (Qwen 2)
  bool mlp_bias = false;        // gate/up/down projections with a bias
  // Sliding window W (0: none): query i sees keys j with i - W < j <= i (HF's convention, window_size (W - 1, 0)).
  int64_t sliding_window = 0;
  std::vector<bool> layer_sliding;  // per layer: whether the window applies (all layers for Mistral)
  float attn_logit_softcapping = 0.0f;   // c > 0: scores become c·tanh(scores / c) (Gemma 2); 0: none
  float final_logit_softcapping = 0.0f;  // the same on the final logits
  float attention_scale = 0.0f;          // 0: 1 / sqrt(D); Gemma 2: query_pre_attn_scalar^-1/2
  bool norm_unit_offset = false;         // RMSNorm gain is 1 + weight (Gemma)
  bool scale_embeddings = false;         // embeddings times sqrt(E) (Gemma)
  bool sandwich_norms = false;           // Gemma 2: norms after attention and around the MLP
  int64_t bos_token_id = -1;             // -1 when the config has none
  int64_t eos_token_id = -1;             // the first one when the config lists several

  // Reads a HF config.json of model_type "llama", "mistral", "qwen2" or "gemma2": rope_parameters (transformers 5)
  // or rope_theta + rope_scaling (earlier) of rope_type default, linear, llama3 or yarn. A field value this model
  // does not implement (another rope_type or rope key, an unknown activation, bidirectional attention, ...) and
  // missing or ill-typed fields throw std::runtime_error "[llama] <path>: <what>".
  static LlamaConfig from_json_file(const std::string& path);
  // Sizes positive, Hq % Hkv == 0, layer_sliding of L entries, rope_scaling's fields (rope_inv_freq's checks), ...;
  // throws std::invalid_argument "[llama] ...".
  void validate() const;
};

// The config of a GGUF file's model, from its metadata ({arch}.embedding_length, .block_count, .attention.*,
// .rope.*, the tokenizer's bos / eos ids, ...); std::runtime_error "[llama] <file>: ..." naming the key.
LlamaConfig llama_config_from_gguf(const gguf::File& file);

// Self-attention with rotary positions and grouped-query heads. Parameters "q_proj.weight" (Hq·D, E),
// "k_proj.weight", "v_proj.weight" (Hkv·D, E), "o_proj.weight" (E, Hq·D) (+ biases when attention_bias; q/k/v
// biases only when qkv_bias).
class LlamaAttention : public nn::Module {
 public:
  LlamaAttention(const LlamaConfig& config, int64_t layer, Rng& rng);
  // x: (B, T, E), positions offset .. offset + T - 1  ->  (B, T, E). With a cache, the new keys and values are
  // appended to it (offset must equal cache->length()) and the queries attend to every cached position.
  // positions: T global positions of x's rows instead (context parallelism, c.sequence_shard(): the rotary angles
  // are the global ones and the attention runs through the shard, across the processes; no cache then).
  // rope: the angles of those positions (rope_table with D = head_dim, base rope_theta, rope_scaling), made once by
  // the model for all its layers; null: made here. T rows, or B·T rows (row b's positions at [b·T, (b + 1)·T):
  // per-row positions, also with a cache, as nn::AttendRotary takes them).
  // last: 0, or n > 0 for the outputs of x's last min(n, T) rows only (B, n, E): the keys and values of every row
  // go to the attention (and the cache), the queries of those rows only (a prefill's last layer, whose other rows
  // no logit reads). Not under a sequence shard.
  // probs: null, or where the attention probabilities go, (B, Hq, Tq, T_keys) with T_keys every cached position
  // (the new ones included): recomputed exactly from q and the keys beside the fused kernel, which still gives the
  // output (scale, soft-cap, window, causal alignment, mask and GQA as the layer runs them). Not under a sequence
  // shard.
  // attention_mask: undefined, or HF's (B, T_keys) padding mask over every key (the cached ones first): nonzero =
  // the key takes part, combined with the causal mask and the window. A paged cache is then read through a gathered
  // copy of its pages (a ragged one refuses it).
  // Projections and head counts are this class's; everything else runs in the attention core (nn::attend).
  ad::Var forward(const nn::Context& c, const ad::Var& x, int64_t offset, nn::KvCache* cache,
                  const std::vector<int64_t>* positions = nullptr,
                  const std::shared_ptr<const RopeTable>& rope = nullptr, int64_t last = 0,
                  Tensor* probs = nullptr, const Tensor& attention_mask = Tensor()) const;

  nn::Linear q_proj, k_proj, v_proj, o_proj;

 private:
  LlamaConfig config_;
  bool sliding_;
};

// down_proj(act(gate_proj(x)) · up_proj(x)).
class LlamaMlp : public nn::Module {
 public:
  LlamaMlp(const LlamaConfig& config, Rng& rng);
  ad::Var forward(const nn::Context& c, const ad::Var& x) const;  // (..., E) -> (..., E)

  nn::Linear gate_proj, up_proj, down_proj;

 private:
  GatedActivation act_;
};

// Pre-norm block: x + attn(norm(x)), then + mlp(norm(.)). With sandwich_norms (Gemma 2) the attention and MLP
// outputs are normalised again before the residual add: children "input_layernorm", "post_attention_layernorm",
// "pre_feedforward_layernorm", "post_feedforward_layernorm". Without them, HF's Llama names: "input_layernorm"
// before attention and "post_attention_layernorm" before the MLP.
class LlamaDecoderLayer : public nn::Module {
 public:
  LlamaDecoderLayer(const LlamaConfig& config, int64_t layer, Rng& rng);
  // last: as LlamaAttention's; the residual stream and the MLP then run on those rows only.
  // probs, attention_mask: as LlamaAttention's (the layer's attention probabilities, when not null; HF's (B, T_keys)
  // padding mask, nonzero = the key takes part).
  ad::Var forward(const nn::Context& c, const ad::Var& x, int64_t offset, nn::KvCache* cache,
                  const std::vector<int64_t>* positions = nullptr,
                  const std::shared_ptr<const RopeTable>& rope = nullptr, int64_t last = 0,
                  Tensor* probs = nullptr, const Tensor& attention_mask = Tensor()) const;

  LlamaAttention self_attn;
  LlamaMlp mlp;
  nn::RmsNorm input_layernorm;
  nn::RmsNorm post_attention_layernorm;
  std::unique_ptr<nn::RmsNorm> pre_feedforward_layernorm;   // sandwich_norms only
  std::unique_ptr<nn::RmsNorm> post_feedforward_layernorm;  // sandwich_norms only

 private:
  bool sandwich_;
};

// HF's LlamaModel / MistralModel / Qwen2Model / Gemma2Model: "embed_tokens", "layers.N", "norm".
class LlamaModel : public nn::Module {
 public:
  LlamaModel(const LlamaConfig& config, Rng& rng);
  // ids (B, T) -> final hidden states (B, T, E). caches: null, or one per layer (all of the same length).
  // positions: null (the caches' offset .. offset + T - 1), T positions shared by the rows, or B·T, one set per row
  // (transformers' position_ids (B, T), row-major), with or without caches: a left-padded batch with positions
  // cumsum(mask) - 1 puts each row's first token at position 0, and its cached steps continue from the positions
  // the caller passes (the row's own count of tokens). Required under c.sequence_shard() (T of them, the global
  // ones, no caches). Another count throws std::invalid_argument "[llama] N positions for ids (B, T) ...".
  // last: 0, or n > 0 for the hidden states of the last min(n, T) positions only (B, n, E): the last layer runs its
  // queries, residual and MLP on those rows (every layer's keys and values still cover all T). Not under a shard.
  // record: null, or where options' attentions and hidden states go (CausalLMOutput's; its logits untouched);
  // last must be 0 then, and no shard.
  // attention_mask: empty (every key takes part), or HF's padding mask (B, T_keys) over the cached positions and
  // then the ids' T (1 = token, 0 = padding; any nonzero counts as 1), combined with the causal mask and the windows
  // in every layer. Padding may sit anywhere (left, as generation pads, or right); positions stay as given (or the
  // cache's offset .. offset + T - 1, transformers' arange), so a left-padded row's tokens sit at shifted positions,
  // which rotary attention does not see beyond float rounding. A query whose every key is masked (a left-padded
  // row's padding, a row of zeros) gets attention output 0 and probabilities 0 (qkv::attention's fully masked
  // rule; transformers' eager attention spreads such a row uniformly over the keys): its hidden states and logits
  // are finite but belong to no sequence. With per-row positions cumsum(mask) - 1 (transformers' generate) the
  // row's tokens sit at the positions they have alone. A mask of ones only runs as no mask (the same bits). Not
  // under a shard.
  ad::Var forward(const nn::Context& c, const Ids& ids, std::vector<nn::KvCache>* caches,
                  const std::vector<int64_t>* positions = nullptr, int64_t last = 0,
                  const ForwardOptions* options = nullptr, CausalLMOutput* record = nullptr,
                  const Ids& attention_mask = {}) const;

  nn::Embedding embed_tokens;
  std::vector<std::unique_ptr<LlamaDecoderLayer>> layers;
  nn::RmsNorm norm;

 private:
  float embed_scale_;
  int64_t head_dim_;
  float rope_theta_;
  RopeScaling rope_scaling_;
};

// HF's *ForCausalLM: "model.*" and "lm_head.weight" (V, E), absent when the embeddings are tied.
class LlamaForCausalLM : public nn::Module {
 public:
  // Random init from rng (N(0, 1) embeddings, nn::Linear's init; meant to be overwritten by loading).
  LlamaForCausalLM(const LlamaConfig& config, Rng& rng);

  // ids (B, T), values in [0, V)  ->  logits (B, T, V). caches: null (positions 0 .. T-1), or one per layer,
  // reset for B rows (new_caches): positions continue from the caches' length, which grows by T.
  // Records its backward when `c` trains (caches are for inference only).
  // logits_to_keep (HF's name): 0 = logits at every position; n > 0 = at the last min(n, T) positions only, so a
  // prompt's prefill runs the (E x V) head on one row instead of T, and the last layer its queries, o_proj and MLP
  // on those rows (LlamaModel's `last`; not under a sequence shard).
  // positions: optional, the T global positions of the ids' columns under context parallelism (c.sequence_shard():
  // ids hold this process's positions, and every attention runs around the ring); or B·T, one set per row
  // (transformers' position_ids; see LlamaModel); default the caches' length .. + T - 1.
  // attention_mask: empty, or HF's padding mask (B, T_keys), T_keys = the caches' length + T (see LlamaModel).
  ad::Var forward(const nn::Context& c, const Ids& ids, std::vector<nn::KvCache>* caches = nullptr,
                  int64_t logits_to_keep = 0, const std::vector<int64_t>* positions = nullptr,
                  const Ids& attention_mask = {}) const;
  Tensor logits(const Ids& ids) const { return forward(nn::Context(), ids).value; }
  // HF's model(ids, output_attentions=..., output_hidden_states=...), for inference: logits (B, T, V) at every
  // position and what options ask for (CausalLMOutput). caches: as above (a decode step's attentions are
  // (B, Hq, T, T_cache) over every cached key). The attention keeps its fused kernel; the probabilities of the asked
  // layers are recomputed beside it (LlamaAttention::forward's probs). attention_layers out of [0, L) throw
  // std::invalid_argument "[llama] ...".
  // attention_mask: HF's (B, T_keys) padding mask, as above: a padded batch gives each row, at its tokens, the
  // logits, attentions (0 at the padded keys) and hidden states it has alone. positions: null, T or B·T values, as
  // above (transformers' position_ids).
  CausalLMOutput forward(const Ids& ids, const ForwardOptions& options, std::vector<nn::KvCache>* caches = nullptr,
                         const Ids& attention_mask = {}, const std::vector<int64_t>* positions = nullptr) const;
  // One empty cache per layer for `rows` sequences; page_size > 0: paged caches (nn::KvCache), which the
  // attention reads in place through attention_with_kvcache's block table. storage: the caches' precision
  // (nn::KvCache::reset: kFloat32, or kBFloat16 with half the bytes).
  std::vector<nn::KvCache> new_caches(int64_t rows, int64_t capacity = 16, int64_t page_size = 0,
                                      Precision storage = Precision::kFloat32) const;

  // A GGUF file (see from_gguf), or a folder that transformers' save_pretrained wrote: config.json +
  // model.safetensors (or its shards). Throws std::runtime_error with one line naming the file and the problem (missing file, unsupported config, missing / unexpected /
  // misshapen / non-finite tensor). The model comes in eval mode with its precision set to `precision` (the linear
  // weights converted and packed once, for that precision only: see nn::Module::set_precision).
  // precision std::nullopt: a GGUF's weights as stored (see from_gguf); a folder's at kFloat32.
  static std::unique_ptr<LlamaForCausalLM> from_pretrained(const std::string& dir,
                                                           std::optional<Precision> precision = Precision::kFloat32);
  // A GGUF file (llama.cpp's format) of architecture "llama" (Llama 2 and 3, SmolLM, TinyLlama, Mistral), "qwen2"
  // or "gemma2": the config from its metadata (llama_config_from_gguf), the tensors mapped to HF's names (attn_q /
  // attn_k rows back in HF's rotate_half order; Gemma's norms back from 1 + w), tied embeddings when output.weight
  // is absent. Every tensor of the file must have its place (strict). precision:
  //   std::nullopt: the weights as the file stores them, read in place from the mapping (kernels::gemm_quant,
  //     kernels::embedding_rows; llama's attn_q / attn_k rows copied once into HF's order): no float32 copy of a
  //     linear weight or of a quantized token embedding; the model runs at kInt8 when a linear weight has an
  //     integer block product (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0), else at kFloat32; it is for inference.
  //   a Precision: every weight dequantized once to float32 (a reference run), then prepared for it.
  // Errors name the file and the key or tensor (std::runtime_error).
  static std::unique_ptr<LlamaForCausalLM> from_gguf(const std::string& path,
                                                     std::optional<Precision> precision = Precision::kFloat32);
  // Loads HF-named weights (strict: every parameter present with its shape, nothing else; lm_head.weight is
  // ignored when the embeddings are tied, as HF does). Nothing is changed on error. `source` names them in errors.
  void load_hf_state_dict(const nn::StateDict& state, const std::string& source);

  const LlamaConfig& config() const { return config_; }

  // The logits (..., V) of final hidden states h (..., E): lm_head (or the tied embeddings), then the final soft-cap.
  // The logit lens reads a layer's hidden state through model.norm and this.
  ad::Var head(const nn::Context& c, const ad::Var& h) const;

  LlamaModel model;
  std::unique_ptr<nn::Linear> lm_head;  // null when tied

 private:
  LlamaConfig config_;
};

}  // namespace qkv::models
