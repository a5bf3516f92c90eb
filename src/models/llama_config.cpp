// LlamaConfig: reading HF config.json for Llama, Mistral, Qwen 2 and Gemma 2 (rotary scalings included) and the
// checks every config passes, whichever file it came from.
#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "model_files.h"
#include "qkv/core/error.h"
#include "qkv/models/llama.h"

namespace qkv::models {
namespace {

constexpr const char* kOp = "llama";

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

}  // namespace qkv::models
