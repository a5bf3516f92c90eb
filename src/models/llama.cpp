// Llama / Mistral / Qwen 2 / Gemma 2 decoders: config.json reading (rotary scalings included), the modules under
// HF's names, the one forward (tape or constants, with or without per-layer KV caches) and strict loading of
// model.safetensors.
#include "qkv/models/llama.h"

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

constexpr const char* kOp = "llama";

std::string join(const std::string& dir, const std::string& name) {
  return dir.empty() || dir.back() == '/' ? dir + name : dir + "/" + name;
}

[[noreturn]] void refuse(const std::string& path, const std::string& what) {
  throw std::runtime_error("[llama] " + path + ": " + what);
}

// A token id field: an integer, a list of integers (the first is taken) or null / absent (-1).
int64_t token_id(const files::JsonObject& o, const std::string& key) {
  const json::Value* v = o.get(key);
  if (!v || v->is_null()) return -1;
  if (v->type() == json::Value::Type::kArray) {
    if (v->items().empty()) return -1;
    const json::Value& first = v->items().front();
    if (first.type() != json::Value::Type::kNumber || first.as_number() < 0 ||
        first.as_number() != std::floor(first.as_number()))
      refuse(o.path, "\"" + key + "\" must hold non-negative integers");
    return static_cast<int64_t>(first.as_number());
  }
  return o.integer(key);
}

GatedActivation activation(const std::string& name, const std::string& path) {
  if (name == "silu" || name == "swish") return GatedActivation::kSilu;
  if (name == "gelu") return GatedActivation::kGelu;
  if (name == "gelu_pytorch_tanh" || name == "gelu_new") return GatedActivation::kGeluTanh;
  refuse(path, "activation \"" + name + "\" is not supported (silu, gelu, gelu_pytorch_tanh)");
}

// The keys of a rope_parameters / rope_scaling object that this model reads. As in HF, a key that the rope_type does
// not use is ignored (HF warns); any other key is refused.
const std::set<std::string>& rope_keys() {
  static const std::set<std::string> keys{
      "rope_type", "type",    "rope_theta", "factor",   "low_freq_factor",  "high_freq_factor", "beta_fast",
      "beta_slow", "mscale",  "truncate",   "attention_factor", "mscale_all_dim", "partial_rotary_factor",
      "original_max_position_embeddings"};
  return keys;
}

// rope_parameters (transformers >= 5) or rope_theta + rope_scaling (earlier), standardized as HF standardizes them
// (modeling_rope_utils.py): a non-empty rope_scaling wins over rope_parameters; the object's rope_theta, else the
// top-level one, else 10000; for llama3 and yarn, original_max_position_embeddings from the top level, else the
// object, else max_position_embeddings; yarn's factor null: max_position_embeddings / original; beta_fast and
// beta_slow 0 or null: 32 and 1. Returns rope_theta and fills `s`.
float read_rope(const files::JsonObject& o, int64_t max_position_embeddings, RopeScaling& s) {
  s = RopeScaling{};
  const json::Value* scaling = o.get("rope_scaling");
  const bool old = scaling && !scaling->is_null() &&
                   !(scaling->type() == json::Value::Type::kObject && scaling->members().empty());
  const std::string name = old ? "rope_scaling" : "rope_parameters";
  const json::Value* p = old ? scaling : o.get("rope_parameters");
  const double top_theta = o.number_or("rope_theta", 10000.0);
  if (!p || p->is_null()) return static_cast<float>(top_theta);
  if (p->type() != json::Value::Type::kObject) refuse(o.path, "\"" + name + "\" must be an object or null");
  for (const auto& [key, value] : p->members())
    if (!rope_keys().count(key) && !value.is_null()) refuse(o.path, name + "." + key + " is not supported");
  const files::JsonObject r{*p, o.path, kOp};
  if (r.number_or("partial_rotary_factor", 1.0) != 1.0)
    refuse(o.path, name + ".partial_rotary_factor is not supported (the rotary embedding covers the whole head)");
  const std::string type = r.string_or("rope_type", r.string_or("type", "default"));
  const auto required = [&](const std::string& key) {
    if (!r.has(key)) refuse(o.path, name + "." + key + " is required for rope_type \"" + type + "\"");
    return static_cast<float>(r.number_or(key, 0.0));
  };
  const auto original_length = [&] {
    return o.has("original_max_position_embeddings")
               ? o.integer("original_max_position_embeddings")
               : r.integer_or("original_max_position_embeddings", max_position_embeddings);
  };
  using Type = RopeScaling::Type;
  if (type == "linear") {
    s.type = Type::kLinear;
    s.factor = required("factor");
  } else if (type == "llama3") {
    s.type = Type::kLlama3;
    s.factor = required("factor");
    s.low_freq_factor = required("low_freq_factor");
    s.high_freq_factor = required("high_freq_factor");
    s.original_max_position_embeddings = original_length();
  } else if (type == "yarn") {
    s.type = Type::kYarn;
    s.original_max_position_embeddings = original_length();
    const json::Value* factor = p->find("factor");
    if (!factor) refuse(o.path, name + ".factor is required for rope_type \"yarn\"");
    s.factor = static_cast<float>(
        factor->is_null() && s.original_max_position_embeddings > 0
            ? static_cast<double>(max_position_embeddings) / static_cast<double>(s.original_max_position_embeddings)
            : r.number_or("factor", 0.0));
    if (r.has("attention_factor")) {
      s.attention_factor = static_cast<float>(r.number_or("attention_factor", 0.0));
      if (!(s.attention_factor > 0.0f)) refuse(o.path, name + ".attention_factor must be > 0");
    }
    s.mscale = static_cast<float>(r.number_or("mscale", 0.0));
    s.mscale_all_dim = static_cast<float>(r.number_or("mscale_all_dim", 0.0));
    const double beta_fast = r.number_or("beta_fast", 0.0), beta_slow = r.number_or("beta_slow", 0.0);
    s.beta_fast = beta_fast != 0.0 ? static_cast<float>(beta_fast) : 32.0f;  // HF: get("beta_fast") or 32
    s.beta_slow = beta_slow != 0.0 ? static_cast<float>(beta_slow) : 1.0f;
    s.truncate = r.boolean_or("truncate", true);
  } else if (type != "default") {
    refuse(o.path, name + ".rope_type \"" + type + "\" is not supported (default, linear, llama3, yarn)");
  }
  return static_cast<float>(r.number_or("rope_theta", top_theta));
}

// "layer_types" (one "sliding_attention" or "full_attention" per layer), when the config has it, into `sliding`
// (one entry per layer already).
void read_layer_types(const files::JsonObject& o, std::vector<bool>& sliding) {
  const json::Value* types = o.get("layer_types");
  if (!types || types->is_null()) return;
  if (types->type() != json::Value::Type::kArray || types->items().size() != sliding.size())
    refuse(o.path, "\"layer_types\" must list one type per layer");
  for (size_t i = 0; i < types->items().size(); ++i) {
    const json::Value& t = types->items()[i];
    if (t.type() != json::Value::Type::kString ||
        (t.as_string() != "sliding_attention" && t.as_string() != "full_attention"))
      refuse(o.path, "layer_types[" + std::to_string(i) + "] must be \"sliding_attention\" or \"full_attention\"");
    sliding[i] = t.as_string() == "sliding_attention";
  }
}

// The options of the attention of q (B, Hq, Tq, D) over k, v (B, Hkv, Tk, D): causal bottom-right (the new
// positions follow the cached ones), HF's sliding window W as window_size (W - 1, 0) and logit soft-capping, so
// the fused kernels skip key tiles outside the window; the caller sets enable_gqa (query head h reads kv head
// h / (Hq / Hkv); K/V never copied).
AttentionOptions attention_options(float scale, int64_t window, float softcap, Precision precision) {
  AttentionOptions o;
  o.precision = precision;
  o.scale = scale;
  o.causal = Causal::kBottomRight;
  if (window > 0) {
    o.window_left = window - 1;
    o.window_right = 0;
  }
  o.softcap = softcap;
  return o;
}

}  // namespace

// --- config ----------------------------------------------------------------------------------------------------

LlamaConfig LlamaConfig::from_json_file(const std::string& path) {
  const json::Value doc = files::read_json(path, kOp);
  if (doc.type() != json::Value::Type::kObject) refuse(path, "must hold a JSON object");
  const files::JsonObject o{doc, path, kOp};
  LlamaConfig c;
  c.model_type = o.string_or("model_type", "");
  const bool gemma = c.model_type == "gemma2", mistral = c.model_type == "mistral", qwen2 = c.model_type == "qwen2";
  if (!gemma && !mistral && !qwen2 && c.model_type != "llama")
    refuse(path, "model_type \"" + c.model_type + "\" is not supported (llama, mistral, qwen2, gemma2)");
  c.vocab_size = o.integer("vocab_size");
  c.hidden_size = o.integer("hidden_size");
  c.intermediate_size = o.integer("intermediate_size");
  c.num_hidden_layers = o.integer("num_hidden_layers");
  c.num_attention_heads = o.integer("num_attention_heads");
  if (c.num_attention_heads == 0) refuse(path, "num_attention_heads must be > 0");
  c.num_key_value_heads = o.integer_or("num_key_value_heads", c.num_attention_heads);
  c.head_dim = o.integer_or("head_dim", c.hidden_size / c.num_attention_heads);
  c.rms_norm_eps = static_cast<float>(o.number_or("rms_norm_eps", 1e-6));
  c.max_position_embeddings = o.integer_or("max_position_embeddings", gemma ? 8192 : qwen2 ? 32768 : 2048);
  c.rope_theta = read_rope(o, c.max_position_embeddings, c.rope_scaling);
  c.tie_word_embeddings = o.boolean_or("tie_word_embeddings", gemma);
  // Qwen 2's projections: biases on q, k and v only, whatever attention_bias / mlp_bias say (HF ignores them).
  c.attention_bias = !qwen2 && o.boolean_or("attention_bias", false);
  c.qkv_bias = qwen2;
  c.mlp_bias = !qwen2 && o.boolean_or("mlp_bias", false);
  const std::string act = gemma ? o.string_or("hidden_activation", o.string_or("hidden_act", "gelu_pytorch_tanh"))
                                : o.string_or("hidden_act", "silu");
  c.hidden_act = activation(act, path);
  c.layer_sliding.assign(static_cast<size_t>(c.num_hidden_layers), false);
  if (mistral) {
    c.sliding_window = o.integer_or("sliding_window", 0);
    c.layer_sliding.assign(static_cast<size_t>(c.num_hidden_layers), c.sliding_window > 0);
  }
  if (qwen2) {  // HF's Qwen2Config: the window (absent: 4096; null: none) on layers >= max_window_layers
    const json::Value* window = o.get("sliding_window");
    if (o.boolean_or("use_sliding_window", false))
      c.sliding_window = !window ? 4096 : window->is_null() ? 0 : o.integer("sliding_window");
    const int64_t full = o.integer_or("max_window_layers", 28);
    for (int64_t i = 0; i < c.num_hidden_layers; ++i) c.layer_sliding[static_cast<size_t>(i)] = i >= full;
    read_layer_types(o, c.layer_sliding);
    if (c.sliding_window == 0) c.layer_sliding.assign(c.layer_sliding.size(), false);
  }
  if (gemma) {
    if (o.boolean_or("use_bidirectional_attention", false))
      refuse(path, "use_bidirectional_attention is not supported (causal decoders only)");
    c.sliding_window = o.integer_or("sliding_window", 4096);
    for (int64_t i = 0; i < c.num_hidden_layers; ++i) c.layer_sliding[static_cast<size_t>(i)] = (i + 1) % 2 != 0;
    read_layer_types(o, c.layer_sliding);
    if (c.sliding_window == 0) c.layer_sliding.assign(c.layer_sliding.size(), false);
    c.attn_logit_softcapping = static_cast<float>(o.number_or("attn_logit_softcapping", 50.0));
    c.final_logit_softcapping = static_cast<float>(o.number_or("final_logit_softcapping", 30.0));
    const double qpas = o.number_or("query_pre_attn_scalar", 256.0);
    if (!(qpas > 0.0)) refuse(path, "query_pre_attn_scalar must be > 0");
    c.attention_scale = static_cast<float>(1.0 / std::sqrt(qpas));
    c.norm_unit_offset = true;
    c.scale_embeddings = true;
    c.sandwich_norms = true;
  }
  c.bos_token_id = token_id(o, "bos_token_id");
  c.eos_token_id = token_id(o, "eos_token_id");
  try {
    c.validate();
  } catch (const std::invalid_argument& e) {
    refuse(path, e.what());
  }
  return c;
}

void LlamaConfig::validate() const {
  QKV_CHECK_ARG(vocab_size > 0 && hidden_size > 0 && intermediate_size > 0 && num_hidden_layers >= 0 &&
                    num_attention_heads > 0 && num_key_value_heads > 0 && head_dim > 0,
                "[llama] config sizes must be positive: vocab ", vocab_size, ", hidden ", hidden_size,
                ", intermediate ", intermediate_size, ", layers ", num_hidden_layers, ", heads ",
                num_attention_heads, ", kv heads ", num_key_value_heads, ", head_dim ", head_dim);
  QKV_CHECK_ARG(num_attention_heads % num_key_value_heads == 0, "[llama] num_attention_heads ", num_attention_heads,
                " must be a multiple of num_key_value_heads ", num_key_value_heads);
  QKV_CHECK_ARG(head_dim % 2 == 0, "[llama] head_dim ", head_dim, " must be even (rotary pairs)");
  QKV_CHECK_ARG(static_cast<int64_t>(layer_sliding.size()) == num_hidden_layers, "[llama] layer_sliding has ",
                layer_sliding.size(), " entries for ", num_hidden_layers, " layers");
  QKV_CHECK_ARG(sliding_window >= 0, "[llama] sliding_window must be >= 0, got ", sliding_window);
  QKV_CHECK_ARG(rms_norm_eps >= 0.0f && std::isfinite(rms_norm_eps), "[llama] rms_norm_eps must be finite and >= 0");
  QKV_CHECK_ARG(rope_theta > 0.0f && std::isfinite(rope_theta), "[llama] rope_theta must be positive, got ",
                rope_theta);
  try {
    rope_inv_freq(head_dim, rope_theta, rope_scaling);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(std::string("[llama] rope scaling: ") + e.what());
  }
  QKV_CHECK_ARG(attn_logit_softcapping >= 0.0f && final_logit_softcapping >= 0.0f && attention_scale >= 0.0f &&
                    std::isfinite(attn_logit_softcapping) && std::isfinite(final_logit_softcapping) &&
                    std::isfinite(attention_scale),
                "[llama] softcaps and attention_scale must be finite and >= 0");
}

// --- modules ---------------------------------------------------------------------------------------------------

LlamaAttention::LlamaAttention(const LlamaConfig& c, int64_t layer, Rng& rng)
    : q_proj(c.hidden_size, c.num_attention_heads * c.head_dim, c.attention_bias || c.qkv_bias, rng),
      k_proj(c.hidden_size, c.num_key_value_heads * c.head_dim, c.attention_bias || c.qkv_bias, rng),
      v_proj(c.hidden_size, c.num_key_value_heads * c.head_dim, c.attention_bias || c.qkv_bias, rng),
      o_proj(c.num_attention_heads * c.head_dim, c.hidden_size, c.attention_bias, rng),
      config_(c),
      sliding_(c.sliding_window > 0 && c.layer_sliding.at(static_cast<size_t>(layer))) {
  register_module("q_proj", &q_proj);
  register_module("k_proj", &k_proj);
  register_module("v_proj", &v_proj);
  register_module("o_proj", &o_proj);
}

ad::Var LlamaAttention::forward(const nn::Context& c, const ad::Var& x, int64_t offset, nn::KvCache* cache,
                                const std::vector<int64_t>* positions,
                                const std::shared_ptr<const RopeTable>& rope, int64_t last) const {
  const LlamaConfig& k = config_;
  QKV_CHECK_ARG(x.dim() == 3 && x.size(2) == k.hidden_size, "[llama] attention input ", str(x.shape()),
                " must be (B, T, ", k.hidden_size, ")");
  const int64_t b = x.size(0), t = x.size(1), d = k.head_dim, hkv = k.num_key_value_heads;
  QKV_CHECK_ARG(last >= 0, "[llama] last must be >= 0, got ", last, " for the attention input ", str(x.shape()));
  const nn::SequenceShard* shard = c.sequence_shard();
  // The queries of the last tq rows (all by default): causal and window masks are aligned bottom-right, so those
  // rows see the keys they see in the full product.
  const int64_t tq = last > 0 && last < t ? last : t;
  QKV_CHECK_ARG(shard == nullptr || tq == t, "[llama] the last ", last, " rows of the attention input ",
                str(x.shape()), " under context parallelism (every shard's queries run around the ring)");
  // (B, T, H·D) -> (B, H, T, D)
  ad::Var q = ad::permute(
      ad::reshape(q_proj.forward(c, tq < t ? ad::slice(x, 1, t - tq, t) : x), {b, tq, k.num_attention_heads, d}),
      {0, 2, 1, 3});
  ad::Var kk = ad::permute(ad::reshape(k_proj.forward(c, x), {b, t, hkv, d}), {0, 2, 1, 3});
  ad::Var v = ad::permute(ad::reshape(v_proj.forward(c, x), {b, t, hkv, d}), {0, 2, 1, 3});
  if (positions != nullptr)
    QKV_CHECK_ARG(static_cast<int64_t>(positions->size()) == t && !cache, "[llama] ", positions->size(),
                  " positions for the attention input ", str(x.shape()), cache ? " with a KV cache" : "");
  const std::shared_ptr<const RopeTable> angles =
      rope != nullptr ? rope
                      : std::make_shared<const RopeTable>(
                            positions != nullptr ? rope_table(*positions, d, k.rope_theta, k.rope_scaling)
                                                 : rope_table(offset, t, d, k.rope_theta, k.rope_scaling));
  q = ad::rope(q, tq < t ? std::make_shared<const RopeTable>(rope_table_rows(*angles, t - tq, tq)) : angles,
               RopeVariant::kHalfSplit);
  kk = ad::rope(kk, angles, RopeVariant::kHalfSplit);
  const float scale = k.attention_scale > 0.0f ? k.attention_scale : 1.0f / std::sqrt(static_cast<float>(d));
  AttentionOptions o =
      attention_options(scale, sliding_ ? k.sliding_window : 0, k.attn_logit_softcapping, attention_precision());
  if (cache) {
    QKV_CHECK_ARG(!c.tape(), "[llama] a KV cache is for inference only");
    QKV_CHECK_ARG(cache->ready() && cache->rows() == b && cache->length() == offset, "[llama] the KV cache holds ",
                  cache->rows(), " rows of length ", cache->length(), "; the input is ", str(x.shape()),
                  " at position ", offset);
    // bf16: the cache holds the rounded keys and values, as attention() would round them at every step.
    const bool bf16 = o.precision == Precision::kBFloat16;
    cache->append(bf16 ? round_to_bf16(kk.value) : kk.value, bf16 ? round_to_bf16(v.value) : v.value);
    if (cache->paged()) {  // the pages read in place; q (B, Hq, T, D) as (B, T, Hq, D), out (B, T, Hq, D)
      Tensor kp = cache->key_pages(), vp = cache->value_pages();
      const std::vector<int32_t> lens(static_cast<size_t>(b), static_cast<int32_t>(cache->length()));
      const Tensor out = attention_with_kvcache(q.value.transpose(1, 2), kp, vp, Tensor(), Tensor(), lens,
                                                cache->block_table(), cache->max_pages(), o)
                             .out;
      return o_proj.forward(c, ad::Var(out.reshape({b, tq, k.num_attention_heads * d})));
    }
    kk = ad::Var(cache->keys());
    v = ad::Var(cache->values());
  }
  o.enable_gqa = q.size(1) != kk.size(1);
  QKV_CHECK_ARG(shard == nullptr || !sliding_, "[llama] sliding_window ", k.sliding_window, " with the input ",
                str(x.shape()), ": context parallelism (ring attention) has no sliding window; use sliding_window 0");
  const ad::Var out = shard != nullptr ? shard->attention(q, kk, v, o) : ad::attention(q, kk, v, o);
  // (B, Hq, T, D) -> (B, T, Hq·D)
  return o_proj.forward(c, ad::reshape(ad::permute(out, {0, 2, 1, 3}), {b, tq, k.num_attention_heads * d}));
}

LlamaMlp::LlamaMlp(const LlamaConfig& c, Rng& rng)
    : gate_proj(c.hidden_size, c.intermediate_size, c.mlp_bias, rng),
      up_proj(c.hidden_size, c.intermediate_size, c.mlp_bias, rng),
      down_proj(c.intermediate_size, c.hidden_size, c.mlp_bias, rng),
      act_(c.hidden_act) {
  register_module("gate_proj", &gate_proj);
  register_module("up_proj", &up_proj);
  register_module("down_proj", &down_proj);
}

ad::Var LlamaMlp::forward(const nn::Context& c, const ad::Var& x) const {
  const ad::Var gate = gate_proj.forward(c, x);
  ad::Var a;
  switch (act_) {
    case GatedActivation::kSilu: a = ad::silu(gate); break;
    case GatedActivation::kGelu: a = ad::gelu(gate, GeluApprox::kNone); break;
    case GatedActivation::kGeluTanh: a = ad::gelu(gate, GeluApprox::kTanh); break;
  }
  return down_proj.forward(c, ad::mul(a, up_proj.forward(c, x)));
}

LlamaDecoderLayer::LlamaDecoderLayer(const LlamaConfig& c, int64_t layer, Rng& rng)
    : self_attn(c, layer, rng),
      mlp(c, rng),
      input_layernorm(c.hidden_size, c.rms_norm_eps, c.norm_unit_offset),
      post_attention_layernorm(c.hidden_size, c.rms_norm_eps, c.norm_unit_offset),
      sandwich_(c.sandwich_norms) {
  register_module("self_attn", &self_attn);
  register_module("mlp", &mlp);
  register_module("input_layernorm", &input_layernorm);
  register_module("post_attention_layernorm", &post_attention_layernorm);
  if (sandwich_) {
    pre_feedforward_layernorm = std::make_unique<nn::RmsNorm>(c.hidden_size, c.rms_norm_eps, c.norm_unit_offset);
    post_feedforward_layernorm = std::make_unique<nn::RmsNorm>(c.hidden_size, c.rms_norm_eps, c.norm_unit_offset);
    register_module("pre_feedforward_layernorm", pre_feedforward_layernorm.get());
    register_module("post_feedforward_layernorm", post_feedforward_layernorm.get());
  }
}

ad::Var LlamaDecoderLayer::forward(const nn::Context& c, const ad::Var& x, int64_t offset, nn::KvCache* cache,
                                   const std::vector<int64_t>* positions,
                                   const std::shared_ptr<const RopeTable>& rope, int64_t last) const {
  const ad::Var h = self_attn.forward(c, input_layernorm.forward(c, x), offset, cache, positions, rope, last);
  const int64_t t = x.size(1);
  const ad::Var r = h.size(1) < t ? ad::slice(x, 1, t - h.size(1), t) : x;  // the residual of the rows it gave
  if (sandwich_) {
    const ad::Var y = ad::add(r, post_attention_layernorm.forward(c, h));
    return ad::add(y, post_feedforward_layernorm->forward(c, mlp.forward(c, pre_feedforward_layernorm->forward(c, y))));
  }
  const ad::Var y = ad::add(r, h);
  return ad::add(y, mlp.forward(c, post_attention_layernorm.forward(c, y)));
}

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
                            const std::vector<int64_t>* positions, int64_t last) const {
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
  QKV_CHECK_ARG(c.sequence_shard() == nullptr || (positions != nullptr && !caches), "[llama] ids ", str(ids.shape),
                ": context parallelism needs the ids' global positions and no KV caches");
  const int64_t offset = caches && !caches->empty() ? (*caches)[0].length() : 0;
  ad::Var x = embed_tokens.forward(c, ids);
  if (embed_scale_ != 1.0f) x = ad::scale(x, embed_scale_);
  // The rotary angles once for every layer (positions of the wrong count are refused by the first attention).
  const int64_t t = ids.shape[1];
  const bool given = positions != nullptr && static_cast<int64_t>(positions->size()) == t;
  const auto rope =
      std::make_shared<const RopeTable>(given ? rope_table(*positions, head_dim_, rope_theta_, rope_scaling_)
                                              : rope_table(offset, t, head_dim_, rope_theta_, rope_scaling_));
  QKV_CHECK_ARG(last >= 0, "[llama] last must be >= 0, got ", last, " for ids ", str(ids.shape));
  for (size_t i = 0; i < layers.size(); ++i)
    x = layers[i]->forward(c, x, offset, caches ? &(*caches)[i] : nullptr, positions, rope,
                           i + 1 == layers.size() ? last : 0);
  return norm.forward(c, x);
}

LlamaForCausalLM::LlamaForCausalLM(const LlamaConfig& c, Rng& rng) : model(c, rng), config_(c) {
  register_module("model", &model);
  if (!c.tie_word_embeddings) {
    lm_head = std::make_unique<nn::Linear>(c.hidden_size, c.vocab_size, false, rng);
    register_module("lm_head", lm_head.get());
  }
}

ad::Var LlamaForCausalLM::forward(const nn::Context& c, const Ids& ids, std::vector<nn::KvCache>* caches,
                                  int64_t logits_to_keep, const std::vector<int64_t>* positions) const {
  QKV_CHECK_ARG(logits_to_keep >= 0, "[llama] logits_to_keep must be >= 0, got ", logits_to_keep);
  // The last layer's queries, residual and MLP on the kept rows only (all rows run around a shard's ring).
  ad::Var h = model.forward(c, ids, caches, positions, c.sequence_shard() == nullptr ? logits_to_keep : 0);
  const int64_t t = h.size(1);
  if (logits_to_keep > 0 && logits_to_keep < t) h = ad::slice(h, 1, t - logits_to_keep, t);
  const nn::Embedding& e = model.embed_tokens;
  ad::Var logits = lm_head                ? lm_head->forward(c, h)
                   : e.stored().defined() ? ad::Var(linear(h.value, e.stored()))  // a quantized tied table
                                          : ad::linear(h, c.param(e.weight));
  const float cap = config_.final_logit_softcapping;
  if (cap > 0.0f) logits = ad::scale(ad::tanh(ad::scale(logits, 1.0f / cap)), cap);
  return logits;
}

std::vector<nn::KvCache> LlamaForCausalLM::new_caches(int64_t rows, int64_t capacity, int64_t page_size) const {
  std::vector<nn::KvCache> caches(model.layers.size());
  for (nn::KvCache& k : caches) k.reset(rows, config_.num_key_value_heads, config_.head_dim, capacity, page_size);
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
