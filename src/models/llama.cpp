// Llama / Mistral / Qwen 2 / Gemma 2 decoders: the model with its one forward (tape or constants, with or without
// per-layer KV caches) and strict loading of model.safetensors. The config is read in llama_config.cpp, the
// attention is in llama_attention.cpp, the MLP and the decoder layer in llama_layer.cpp, GGUF files in llama_gguf.cpp.
#include "qkv/models/llama.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <new>
#include <set>
#include <string>
#include <vector>

#include "model_files.h"
#include "qkv/core/error.h"
#include "qkv/core/safetensors.h"
#include "qkv/ops/attention.h"
#include "qkv/ops/attention_varlen.h"
#include "qkv/ops/functional.h"
#include "qkv/ops/lowp.h"
#include "qkv/nn/init.h"
#include "qkv/nn/serialize.h"

namespace qkv::models {
namespace {

std::string join(const std::string& dir, const std::string& name) {
  return dir.empty() || dir.back() == '/' ? dir + name : dir + "/" + name;
}

// HF's padding mask (B, T_keys) as the attention's keep mask (1 = the key takes part); undefined when it is empty or
// holds ones only, so that the layers run as without a mask.
Tensor keep_mask(const Ids& mask, const Ids& ids, int64_t cached) {
  if (mask.shape.empty() && mask.data.empty()) return Tensor();
  const int64_t b = ids.shape[0], keys = cached + ids.shape[1];
  QKV_CHECK_ARG(mask.shape == (Shape{b, keys}) && static_cast<int64_t>(mask.data.size()) == b * keys,
                "[llama] attention_mask ", str(mask.shape), " holding ", mask.data.size(),
                " values must be empty or (B, T_keys) = ", str(Shape{b, keys}), ": the ", cached,
                " cached positions and the ids ", str(ids.shape));
  if (std::all_of(mask.data.begin(), mask.data.end(), [](int64_t k) { return k != 0; })) return Tensor();
  Tensor keep = Tensor::empty({b, keys});
  for (size_t i = 0; i < mask.data.size(); ++i) keep.data()[i] = mask.data[i] != 0 ? 1.0f : 0.0f;
  return keep;
}

}  // namespace

// --- modules ---------------------------------------------------------------------------------------------------

LlamaModel::LlamaModel(const LlamaConfig& c, Rng& rng)
    : embed_tokens((c.validate(), c.vocab_size), c.hidden_size, rng),
      norm(c.hidden_size, c.rms_norm_eps, c.norm_unit_offset),
      // HF multiplies by sqrt(E) rounded to the weights' dtype (float32).
      embed_scale_(c.scale_embeddings ? static_cast<float>(std::sqrt(static_cast<double>(c.hidden_size))) : 1.0f),
      head_dim_(c.head_dim),
      rope_theta_(c.rope_theta),
      rope_scaling_(c.rope_scaling) {
  register_module("embed_tokens", &embed_tokens);
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    layers.push_back(std::make_unique<LlamaDecoderLayer>(c, i, rng));
    register_module("layers." + std::to_string(i), layers.back().get());
  }
  register_module("norm", &norm);
}

ad::Var LlamaModel::forward(const nn::Context& c, const Ids& ids, std::vector<nn::KvCache>* caches,
                            const std::vector<int64_t>* positions, int64_t last, const ForwardOptions* options,
                            CausalLMOutput* record, const Ids& attention_mask) const {
  QKV_CHECK_ARG(ids.shape.size() == 2 && ids.shape[0] > 0 && ids.shape[1] > 0 &&
                    static_cast<int64_t>(ids.data.size()) == ids.shape[0] * ids.shape[1],
                "[llama] ids ", str(ids.shape), " must be a non-empty (B, T) holding B·T values, got ",
                ids.data.size());
  const int64_t v = embed_tokens.num_embeddings();
  for (size_t i = 0; i < ids.data.size(); ++i)
    QKV_CHECK_ARG(ids.data[i] >= 0 && ids.data[i] < v, "[llama] token id ", ids.data[i], " at ", i,
                  " is outside [0, vocab_size = ", v, ")");
  QKV_CHECK_ARG(!caches || caches->size() == layers.size(), "[llama] ", caches ? caches->size() : 0,
                " caches for ", layers.size(), " layers");
  const int64_t b = ids.shape[0], t = ids.shape[1];
  const auto given = positions != nullptr ? static_cast<int64_t>(positions->size()) : 0;
  QKV_CHECK_ARG(positions == nullptr || given == t || given == b * t, "[llama] ", given, " positions for ids ",
                str(ids.shape), " (T shared by the rows, or B*T: one set per row)");
  const bool per_row = positions != nullptr && given != t;
  QKV_CHECK_ARG(c.sequence_shard() == nullptr || (positions != nullptr && !per_row && !caches), "[llama] ids ",
                str(ids.shape), ": context parallelism needs the ids' global positions (T, shared by the rows) and "
                "no KV caches");
  const int64_t offset = caches && !caches->empty() ? (*caches)[0].length() : 0;
  const Tensor mask = keep_mask(attention_mask, ids, offset);
  QKV_CHECK_ARG(!mask.defined() || c.sequence_shard() == nullptr, "[llama] attention_mask ",
                str(attention_mask.shape), " with the ids ", str(ids.shape),
                " under context parallelism (a sequence shard): not supported");
  ad::Var x = embed_tokens.forward(c, ids);
  if (embed_scale_ != 1.0f) x = ad::scale(x, embed_scale_);
  // The rotary angles once for every layer: T rows, or B·T (row b's at [b·T, (b + 1)·T)), which the attention core
  // applies per row. The layers see the positions themselves only under a shard (the ring's global positions);
  // otherwise the table carries them, also through the caches (each row continuing from its own positions).
  const auto rope =
      std::make_shared<const RopeTable>(positions ? rope_table(*positions, head_dim_, rope_theta_, rope_scaling_)
                                                  : rope_table(offset, t, head_dim_, rope_theta_, rope_scaling_));
  const std::vector<int64_t>* layer_positions = c.sequence_shard() != nullptr ? positions : nullptr;
  QKV_CHECK_ARG(last >= 0, "[llama] last must be >= 0, got ", last, " for ids ", str(ids.shape));
  const bool attentions = record && options && options->output_attentions;
  const bool hidden = record && options && options->output_hidden_states;
  QKV_CHECK_ARG(!(attentions || hidden) || (last == 0 && c.sequence_shard() == nullptr), "[llama] ids ",
                str(ids.shape), ": attentions and hidden states are recorded for every row (last 0) and not under a "
                "sequence shard");
  const std::vector<bool> asked = attention_layers_asked(attentions ? *options : ForwardOptions(),
                                                         static_cast<int64_t>(layers.size()), "llama");
  if (attentions) record->attentions.assign(layers.size(), Tensor());
  if (hidden) record->hidden_states.assign(1, x.value);
  for (size_t i = 0; i < layers.size(); ++i) {
    x = layers[i]->forward(c, x, offset, caches ? &(*caches)[i] : nullptr, layer_positions, rope,
                           i + 1 == layers.size() ? last : 0, asked[i] ? &record->attentions[i] : nullptr, mask);
    if (hidden && i + 1 < layers.size()) record->hidden_states.push_back(x.value);
  }
  x = norm.forward(c, x);
  if (hidden) record->hidden_states.push_back(x.value);  // the last layer's output after the final norm, as HF
  return x;
}

LlamaForCausalLM::LlamaForCausalLM(const LlamaConfig& c, Rng& rng) : model(c, rng), config_(c) {
  register_module("model", &model);
  if (!c.tie_word_embeddings) {
    lm_head = std::make_unique<nn::Linear>(c.hidden_size, c.vocab_size, false, rng);
    register_module("lm_head", lm_head.get());
  }
}

ad::Var LlamaForCausalLM::forward(const nn::Context& c, const Ids& ids, std::vector<nn::KvCache>* caches,
                                  int64_t logits_to_keep, const std::vector<int64_t>* positions,
                                  const Ids& attention_mask) const {
  QKV_CHECK_ARG(logits_to_keep >= 0, "[llama] logits_to_keep must be >= 0, got ", logits_to_keep);
  // The last layer's queries, residual and MLP on the kept rows only (all rows run around a shard's ring).
  ad::Var h = model.forward(c, ids, caches, positions, c.sequence_shard() == nullptr ? logits_to_keep : 0, nullptr,
                            nullptr, attention_mask);
  const int64_t t = h.size(1);
  if (logits_to_keep > 0 && logits_to_keep < t) h = ad::slice(h, 1, t - logits_to_keep, t);
  return head(c, h);
}

ad::Var LlamaForCausalLM::head(const nn::Context& c, const ad::Var& h) const {
  const nn::Embedding& e = model.embed_tokens;
  ad::Var logits = lm_head                ? lm_head->forward(c, h)
                   : e.stored().defined() ? ad::Var(linear(h.value, e.stored()))  // a quantized tied table
                                          : ad::linear(h, c.param(e.weight));
  const float cap = config_.final_logit_softcapping;
  if (cap > 0.0f) logits = ad::scale(ad::tanh(ad::scale(logits, 1.0f / cap)), cap);
  return logits;
}

CausalLMOutput LlamaForCausalLM::forward(const Ids& ids, const ForwardOptions& options,
                                         std::vector<nn::KvCache>* caches, const Ids& attention_mask,
                                         const std::vector<int64_t>* positions) const {
  const nn::Context c;
  CausalLMOutput out;
  out.logits = head(c, model.forward(c, ids, caches, positions, 0, &options, &out, attention_mask)).value;
  return out;
}

std::vector<nn::KvCache> LlamaForCausalLM::new_caches(int64_t rows, int64_t capacity, int64_t page_size,
                                                      Precision storage) const {
  std::vector<nn::KvCache> caches(model.layers.size());
  for (nn::KvCache& k : caches)
    k.reset(rows, config_.num_key_value_heads, config_.head_dim, capacity, page_size, storage);
  return caches;
}

void LlamaForCausalLM::load_hf_state_dict(const nn::StateDict& state_in, const std::string& source) {
  nn::StateDict state = state_in;
  if (!lm_head) state.erase("lm_head.weight");  // tied: HF ties it to the embeddings whatever the file holds
  try {
    nn::check_finite(state, "");
    load_state_dict(state, true);
  } catch (const std::invalid_argument& e) {
    throw std::runtime_error(std::string("[llama] ") + source + ": " + e.what());
  }
}

std::unique_ptr<LlamaForCausalLM> LlamaForCausalLM::from_pretrained(const std::string& dir,
                                                                     std::optional<Precision> stored_or) {
  if (files::is_regular_file(dir)) return from_gguf(dir, stored_or);  // a file: GGUF (a folder: HF's layout)
  const Precision precision = stored_or.value_or(Precision::kFloat32);
  QKV_CHECK_RUNTIME(files::exists(dir), "[llama] model folder ", dir, " does not exist");
  QKV_CHECK_RUNTIME(files::exists(join(dir, "config.json")), "[llama] model folder ", dir, " has no config.json");
  const std::string config_path = join(dir, "config.json");
  const LlamaConfig config = LlamaConfig::from_json_file(config_path);
  Rng rng(0);
  std::unique_ptr<LlamaForCausalLM> m;
  try {
    const nn::SkipInit skip;  // every weight is loaded below (strictly): nothing drawn
    m = std::make_unique<LlamaForCausalLM>(config, rng);
  } catch (const std::bad_alloc&) {
    const double e = static_cast<double>(config.hidden_size), l = static_cast<double>(config.num_hidden_layers);
    const double params = static_cast<double>(config.vocab_size) * e * (config.tie_word_embeddings ? 1 : 2) +
                          l * (3.0 * e * static_cast<double>(config.intermediate_size) +
                               2.0 * e * static_cast<double>(config.head_dim) *
                                   static_cast<double>(config.num_attention_heads + config.num_key_value_heads));
    throw std::runtime_error(detail::concat(
        "[llama] ", config_path, ": a model of about ", params, " parameters (vocab_size ", config.vocab_size,
        ", hidden_size ", config.hidden_size, ", intermediate_size ", config.intermediate_size,
        ", num_hidden_layers ", config.num_hidden_layers, ") does not fit in memory"));
  }
  std::string source;
  const std::map<std::string, Tensor> weights = files::read_weights(dir, "llama", source);
  m->load_hf_state_dict(weights, source);
  m->eval();
  m->set_precision(precision);  // loaded for inference: the linear weights prepared (packed) once, here
  return m;
}

}  // namespace qkv::models
