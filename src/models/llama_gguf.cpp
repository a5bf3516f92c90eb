// Llama-family models from GGUF files (llama.cpp's format): the config from the file's metadata, the tensors under
// HF's names (llama.cpp's converter renames them and permutes the rows of attn_q / attn_k for its adjacent-pair
// RoPE; here they are put back in HF's order), into the same LlamaForCausalLM that HF folders load into.
#include <cmath>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "qkv/core/error.h"
#include "qkv/core/gguf.h"
#include "qkv/kernels/quant.h"
#include "qkv/models/llama.h"
#include "qkv/nn/init.h"

namespace qkv::models {
namespace {

[[noreturn]] void refuse(const std::string& path, const std::string& what) {
  throw std::runtime_error("[llama] " + path + ": " + what);
}

int64_t int_or(const gguf::File& f, const std::string& key, int64_t fallback) {
  const gguf::Value* v = f.find(key);
  return v ? v->as_int() : fallback;
}

double float_or(const gguf::File& f, const std::string& key, double fallback) {
  const gguf::Value* v = f.find(key);
  if (!v) return fallback;
  return v->type() == gguf::ValueType::FLOAT32 || v->type() == gguf::ValueType::FLOAT64
             ? v->as_float()
             : static_cast<double>(v->as_int());
}

int64_t required_int(const gguf::File& f, const std::string& key) {
  const int64_t v = f.get(key).as_int();
  if (v < 0) refuse(f.path(), "key '" + key + "' must be >= 0, got " + std::to_string(v));
  return v;
}

// The architectures whose GGUF tensors this loader maps onto LlamaForCausalLM.
bool is_llama_like(const std::string& arch) { return arch == "llama" || arch == "qwen2" || arch == "gemma2"; }

// HF row r of a (H·D, E) q or k projection is llama.cpp's row permuted_row(r): within a head, HF's rotate_half
// pairs (i, i + D/2) are llama.cpp's adjacent pairs (2i, 2i + 1).
int64_t permuted_row(int64_t r, int64_t d) {
  const int64_t h = r / d, w = r % d, half = d / 2;
  return h * d + (w % half) * 2 + w / half;
}

// A tensor of the file under its HF name: permuted (attn_q / attn_k of the "llama" arch: rows back in HF's order)
// and unit_offset (Gemma's norms, which llama.cpp stores as 1 + w).
struct GgufTensorName {
  std::string hf, gguf;
  bool permuted = false, unit_offset = false;
};

}  // namespace

LlamaConfig llama_config_from_gguf(const gguf::File& f) {
  const std::string arch = f.get("general.architecture").as_string();
  if (!is_llama_like(arch))
    refuse(f.path(), "general.architecture '" + arch + "' is not supported (llama, qwen2, gemma2)");
  const std::string p = arch + ".";
  LlamaConfig c;
  c.model_type = arch == "llama" ? "llama" : arch;
  const gguf::TensorInfo& embd = f.get_tensor("token_embd.weight");
  if (embd.ne.size() != 2) refuse(f.path(), "tensor 'token_embd.weight' must be a matrix");
  c.hidden_size = required_int(f, p + "embedding_length");
  c.vocab_size = int_or(f, p + "vocab_size", embd.ne[1]);
  c.intermediate_size = required_int(f, p + "feed_forward_length");
  c.num_hidden_layers = required_int(f, p + "block_count");
  c.num_attention_heads = required_int(f, p + "attention.head_count");
  if (c.num_attention_heads == 0) refuse(f.path(), "key '" + p + "attention.head_count' must be > 0");
  c.num_key_value_heads = int_or(f, p + "attention.head_count_kv", c.num_attention_heads);
  c.head_dim = int_or(f, p + "attention.key_length", c.hidden_size / c.num_attention_heads);
  if (int_or(f, p + "attention.value_length", c.head_dim) != c.head_dim)
    refuse(f.path(), "key '" + p + "attention.value_length' differs from the key length " +
                         std::to_string(c.head_dim) + " (not supported)");
  if (int_or(f, p + "rope.dimension_count", c.head_dim) != c.head_dim)
    refuse(f.path(), "key '" + p + "rope.dimension_count' " +
                         std::to_string(int_or(f, p + "rope.dimension_count", 0)) +
                         " rotates part of a head of " + std::to_string(c.head_dim) + " (not supported)");
  c.rms_norm_eps = static_cast<float>(float_or(f, p + "attention.layer_norm_rms_epsilon", 1e-5));
  c.rope_theta = static_cast<float>(float_or(f, p + "rope.freq_base", 10000.0));
  c.max_position_embeddings = int_or(f, p + "context_length", 2048);
  c.tie_word_embeddings = f.tensor("output.weight") == nullptr;
  c.layer_sliding.assign(static_cast<size_t>(c.num_hidden_layers), false);
  if (const gguf::Value* v = f.find(p + "rope.scaling.type")) {
    const std::string type = v->as_string();
    const double factor = float_or(f, p + "rope.scaling.factor", 1.0);
    if (type == "linear" && factor != 1.0) {
      c.rope_scaling.type = RopeScaling::Type::kLinear;
      c.rope_scaling.factor = static_cast<float>(factor);
    } else if (type == "yarn") {
      c.rope_scaling.type = RopeScaling::Type::kYarn;
      c.rope_scaling.factor = static_cast<float>(factor);
      c.rope_scaling.original_max_position_embeddings =
          int_or(f, p + "rope.scaling.original_context_length", c.max_position_embeddings);
      c.rope_scaling.beta_fast = static_cast<float>(float_or(f, p + "rope.scaling.yarn_beta_fast", 32.0));
      c.rope_scaling.beta_slow = static_cast<float>(float_or(f, p + "rope.scaling.yarn_beta_slow", 1.0));
    } else if (type != "none" && !(type == "linear" && factor == 1.0)) {
      refuse(f.path(), "key '" + p + "rope.scaling.type' = '" + type + "' is not supported (none, linear, yarn)");
    }
  }
  if (const gguf::TensorInfo* t = f.tensor("rope_freqs.weight")) {  // llama3's scaling, as frequency factors
    if (t->ne.size() != 1 || t->ne[0] != c.head_dim / 2)
      refuse(f.path(), "tensor 'rope_freqs.weight' must hold head_dim / 2 = " + std::to_string(c.head_dim / 2) +
                           " factors");
    c.rope_scaling.freq_factors.resize(static_cast<size_t>(t->ne[0]));
    kernels::dequantize_row(t->type, t->data, c.rope_scaling.freq_factors.data(), t->ne[0]);
  }
  if (arch == "qwen2") c.qkv_bias = f.tensor("blk.0.attn_q.bias") != nullptr;
  if (arch == "llama") c.attention_bias = f.tensor("blk.0.attn_q.bias") != nullptr;
  if (arch == "gemma2") {
    c.hidden_act = GatedActivation::kGeluTanh;
    c.sliding_window = int_or(f, p + "attention.sliding_window", 4096);
    for (int64_t i = 0; i < c.num_hidden_layers; ++i)  // llama.cpp's gemma2: even layers slide
      c.layer_sliding[static_cast<size_t>(i)] = c.sliding_window > 0 && i % 2 == 0;
    c.attn_logit_softcapping = static_cast<float>(float_or(f, p + "attn_logit_softcapping", 50.0));
    c.final_logit_softcapping = static_cast<float>(float_or(f, p + "final_logit_softcapping", 30.0));
    // llama.cpp's gemma2: query_pre_attn_scalar is the head size, except Gemma 2 27B's (46 layers): E / H
    const int64_t qpas = c.num_hidden_layers == 46 ? c.hidden_size / c.num_attention_heads : c.head_dim;
    c.attention_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(qpas)));
    c.norm_unit_offset = true;
    c.scale_embeddings = true;
    c.sandwich_norms = true;
  }
  c.bos_token_id = int_or(f, "tokenizer.ggml.bos_token_id", -1);
  c.eos_token_id = int_or(f, "tokenizer.ggml.eos_token_id", -1);
  try {
    c.validate();
  } catch (const std::invalid_argument& e) {
    refuse(f.path(), e.what());
  }
  return c;
}

namespace {

std::vector<GgufTensorName> llama_gguf_names(const LlamaConfig& c) {
  std::vector<GgufTensorName> names;
  const bool gemma = c.model_type == "gemma2", qwen = c.model_type == "qwen2";
  const auto add = [&](std::string hf, std::string gg, bool permute = false, bool norm = false) {
    names.push_back({std::move(hf), std::move(gg), permute, norm && c.norm_unit_offset});
  };
  add("model.embed_tokens.weight", "token_embd.weight");
  add("model.norm.weight", "output_norm.weight", false, true);
  if (!c.tie_word_embeddings) add("lm_head.weight", "output.weight");
  const bool permute = c.model_type == "llama";  // llama.cpp's converter permutes q/k of its "llama" arch only
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string hf = "model.layers." + std::to_string(i) + ".", gg = "blk." + std::to_string(i) + ".";
    add(hf + "input_layernorm.weight", gg + "attn_norm.weight", false, true);
    add(hf + "self_attn.q_proj.weight", gg + "attn_q.weight", permute);
    add(hf + "self_attn.k_proj.weight", gg + "attn_k.weight", permute);
    add(hf + "self_attn.v_proj.weight", gg + "attn_v.weight");
    add(hf + "self_attn.o_proj.weight", gg + "attn_output.weight");
    if (c.attention_bias || qwen && c.qkv_bias) {
      add(hf + "self_attn.q_proj.bias", gg + "attn_q.bias", permute);
      add(hf + "self_attn.k_proj.bias", gg + "attn_k.bias", permute);
      add(hf + "self_attn.v_proj.bias", gg + "attn_v.bias");
    }
    if (c.attention_bias) add(hf + "self_attn.o_proj.bias", gg + "attn_output.bias");
    add(hf + "mlp.gate_proj.weight", gg + "ffn_gate.weight");
    add(hf + "mlp.up_proj.weight", gg + "ffn_up.weight");
    add(hf + "mlp.down_proj.weight", gg + "ffn_down.weight");
    if (gemma) {
      add(hf + "post_attention_layernorm.weight", gg + "post_attention_norm.weight", false, true);
      add(hf + "pre_feedforward_layernorm.weight", gg + "ffn_norm.weight", false, true);
      add(hf + "post_feedforward_layernorm.weight", gg + "post_ffw_norm.weight", false, true);
    } else {
      add(hf + "post_attention_layernorm.weight", gg + "ffn_norm.weight", false, true);
    }
  }
  return names;
}

Tensor gguf_tensor_as_hf(const gguf::File& f, const GgufTensorName& n, const LlamaConfig& c) {
  const gguf::TensorInfo& t = f.get_tensor(n.gguf);
  if (!kernels::can_dequantize(t.type))
    refuse(f.path(), "tensor '" + n.gguf + "' has type " + gguf::type_name(t.type) + ", which qkv cannot read");
  Tensor x = kernels::dequantize(t);
  if (n.permuted) {  // rows back in HF's order, head by head
    const int64_t rows = x.size(0), cols = x.numel() / std::max<int64_t>(rows, 1), d = c.head_dim;
    if (rows % d != 0)
      refuse(f.path(), "tensor '" + n.gguf + "' has " + std::to_string(rows) + " rows, not whole heads of " +
                           std::to_string(d));
    Tensor y = Tensor::empty(x.shape());
    const float* src = x.data();
    float* dst = y.data();
    for (int64_t r = 0; r < rows; ++r)
      std::memcpy(dst + r * cols, src + permuted_row(r, d) * cols, static_cast<size_t>(cols) * sizeof(float));
    x = y;
  }
  if (n.unit_offset) {  // llama.cpp stores Gemma's RMSNorm gains as 1 + w; HF's weight is w
    float* p = x.data();
    for (int64_t i = 0; i < x.numel(); ++i) p[i] -= 1.0f;
  }
  return x;
}

}  // namespace

std::unique_ptr<LlamaForCausalLM> LlamaForCausalLM::from_gguf(const std::string& path, Precision precision) {
  const gguf::File f = gguf::File::open(path);
  const LlamaConfig config = llama_config_from_gguf(f);
  Rng rng(0);
  std::unique_ptr<LlamaForCausalLM> m;
  {
    const nn::SkipInit skip;  // every weight is loaded below (strictly): nothing drawn
    m = std::make_unique<LlamaForCausalLM>(config, rng);
  }
  nn::StateDict state;
  for (const GgufTensorName& n : llama_gguf_names(config)) state[n.hf] = gguf_tensor_as_hf(f, n, config);
  m->load_hf_state_dict(state, path);
  m->eval();
  m->set_precision(precision);
  return m;
}

}  // namespace qkv::models
