// Llama-family models from GGUF files (llama.cpp's format): the config from the file's metadata, the tensors under
// HF's names (llama.cpp's converter renames them and permutes the rows of attn_q / attn_k for its adjacent-pair
// RoPE; here they are put back in HF's order), into the same LlamaForCausalLM that HF folders load into.
#include <cmath>
#include <algorithm>
#include <cstring>
#include <memory>
#include <optional>
#include <map>
#include <string>
#include <vector>

#include "qkv/core/error.h"
#include "qkv/core/gguf.h"
#include "qkv/kernels/quant.h"
#include "qkv/kernels/quant_gemm.h"
#include "qkv/nn/serialize.h"
#include "qkv/ops/lowp.h"
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
    if (c.attention_bias || (qwen && c.qkv_bias)) {
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

namespace {

// The nn::Linear behind each HF linear weight name of a model (q/k/v/o, gate/up/down, lm_head).
std::map<std::string, nn::Linear*> linears_by_name(LlamaForCausalLM& m) {
  std::map<std::string, nn::Linear*> out;
  for (size_t i = 0; i < m.model.layers.size(); ++i) {
    LlamaDecoderLayer& l = *m.model.layers[i];
    const std::string p = "model.layers." + std::to_string(i) + ".";
    out[p + "self_attn.q_proj.weight"] = &l.self_attn.q_proj;
    out[p + "self_attn.k_proj.weight"] = &l.self_attn.k_proj;
    out[p + "self_attn.v_proj.weight"] = &l.self_attn.v_proj;
    out[p + "self_attn.o_proj.weight"] = &l.self_attn.o_proj;
    out[p + "mlp.gate_proj.weight"] = &l.mlp.gate_proj;
    out[p + "mlp.up_proj.weight"] = &l.mlp.up_proj;
    out[p + "mlp.down_proj.weight"] = &l.mlp.down_proj;
  }
  if (m.lm_head) out["lm_head.weight"] = m.lm_head.get();
  return out;
}

// A 2-D tensor of the file as the kernels read it in place, rows in HF's order: a view of the mapping, or for
// llama's permuted attn_q / attn_k a copy of its rows (bytes as stored, reordered; no float32 copy).
kernels::QuantMatrix stored_matrix(const std::shared_ptr<const gguf::File>& file, const GgufTensorName& n,
                                   const LlamaConfig& c) {
  const gguf::TensorInfo& t = file->get_tensor(n.gguf);
  if (t.ne.size() != 2) refuse(file->path(), "tensor '" + n.gguf + "' must be a matrix");
  if (!n.permuted) return kernels::QuantMatrix::from_tensor(t, file);
  const int64_t rows = t.ne[1], row_bytes = gguf::row_bytes(t.type, t.ne[0]);
  if (rows % c.head_dim != 0)
    refuse(file->path(), "tensor '" + n.gguf + "' has " + std::to_string(rows) + " rows, not whole heads of " +
                             std::to_string(c.head_dim));
  auto bytes = std::make_shared<std::vector<uint8_t>>(static_cast<size_t>(rows * row_bytes));
  for (int64_t r = 0; r < rows; ++r)
    std::memcpy(bytes->data() + r * row_bytes, t.data + permuted_row(r, c.head_dim) * row_bytes,
                static_cast<size_t>(row_bytes));
  // The copy is read once to repack where the products read only the tiles; then it need not stay.
  return kernels::QuantMatrix::view(t.type, rows, t.ne[0], bytes->data(), bytes).packed_only();
}

}  // namespace

std::unique_ptr<LlamaForCausalLM> LlamaForCausalLM::from_gguf(const std::string& path,
                                                               std::optional<Precision> precision) {
  const auto file = std::make_shared<const gguf::File>(gguf::File::open(path));
  const gguf::File& f = *file;
  const LlamaConfig config = llama_config_from_gguf(f);
  Rng rng(0);
  std::unique_ptr<LlamaForCausalLM> m;
  {
    const nn::SkipInit skip;  // every weight is loaded below (strictly): nothing drawn, nothing written
    m = std::make_unique<LlamaForCausalLM>(config, rng);
  }
  const std::vector<GgufTensorName> names = llama_gguf_names(config);
  std::map<std::string, Tensor*> params;
  for (auto& [name, p] : m->named_parameters()) params[name] = p;
  for (const gguf::TensorInfo& t : f.tensors()) {  // strict: every tensor of the file has a place
    const bool known = t.name == "rope_freqs.weight" ||
                       std::any_of(names.begin(), names.end(), [&](const GgufTensorName& n) { return n.gguf == t.name; });
    if (!known) refuse(path, "tensor '" + t.name + "' has no place in a " + config.model_type + " model");
  }
  for (const auto& param : params) {  // and every parameter of the model a tensor of the file
    const std::string& name = param.first;
    if (std::none_of(names.begin(), names.end(), [&](const GgufTensorName& n) { return n.hf == name; }))
      refuse(path, "no tensor of the file holds " + name);
  }
  std::map<std::string, nn::Linear*> linears;
  Precision stored = Precision::kFloat32;  // kInt8 when a linear weight has an integer block product
  if (!precision) {
    linears = linears_by_name(*m);
    for (const GgufTensorName& n : names)
      if ((linears.count(n.hf) || n.hf == "model.embed_tokens.weight") &&
          kernels::quant_gemm_integer(f.get_tensor(n.gguf).type))
        stored = Precision::kInt8;
  }
  for (const GgufTensorName& n : names) {
    auto it = params.find(n.hf);
    if (it == params.end()) refuse(path, "tensor '" + n.gguf + "' (" + n.hf + ") has no place in the model");
    const gguf::TensorInfo& t = f.get_tensor(n.gguf);
    if (t.shape() != it->second->shape())
      refuse(path, "tensor '" + n.gguf + "' has shape " + str(t.shape()) + " where " + n.hf + " is " +
                       str(it->second->shape()));
    if (!precision && linears.count(n.hf)) {  // kept as stored
      nn::Linear& lin = *linears[n.hf];
      lin.use_stored_linear_weight(lin.weight, LinearWeight::quantized(stored_matrix(file, n, config)), stored);
      file->release_pages(t);  // repacked (where the kernels repack): the mapped pages need not stay
      continue;
    }
    if (!precision && n.hf == "model.embed_tokens.weight" && t.type != gguf::Type::F32) {
      m->model.embed_tokens.use_stored(LinearWeight::quantized(stored_matrix(file, n, config)));
      file->release_pages(t);  // lookups read the rows they need back from the file
      continue;
    }
    const Tensor x = gguf_tensor_as_hf(f, n, config);
    nn::check_finite({{n.hf, x}}, path + ": ");
    it->second->copy_from(x);
  }
  m->eval();
  m->set_precision(precision.value_or(stored));
  file->release_pages();  // what was read to load or repack is not kept twice; what products read comes back
  return m;
}

}  // namespace qkv::models
