// `qkv run-layer`: runs one PyTorch-trained transformer layer saved as safetensors (scripts/export_torch.py) on an
// input saved as safetensors, and writes the output. Config comes from the weights' shapes, their metadata and flags.
#include <charconv>
#include <cmath>
#include <memory>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>

#include "commands.h"
#include "qkv/core/rng.h"
#include "qkv/core/safetensors.h"
#include "qkv/nn/feed_forward.h"
#include "qkv/nn/serialize.h"
#include "qkv/nn/transformer.h"
#include "run_common.h"

namespace qkv::cli {
namespace {

struct RunLayerArgs {
  std::string weights, input, output;
  std::string layer;       // "encoder" | "decoder"; default from metadata "layer", else encoder
  std::optional<int64_t> nhead;  // unset: metadata "nhead"
  std::string activation;  // "": metadata "activation", else relu
  std::optional<bool> norm_first;
  std::optional<bool> batch_first;  // unset: metadata "batch_first", else true
  std::optional<float> eps;
  bool causal = false;
  std::string precision;
};

// A safetensors file with the on-disk dtype of each tensor (bool masks mean "blocked", float masks are added).
struct LoadedFile {
  SafeTensorsFile file;
  std::map<std::string, SafeTensorsDtype> dtypes;
};

LoadedFile load_with_dtypes(const std::string& path) {
  const SafeTensorsBytes bytes = read_safetensors_bytes(path);  // errors name the file
  LoadedFile out;
  for (const SafeTensorsEntry& e : bytes.header.entries) out.dtypes[e.name] = e.dtype;
  out.file = load_safetensors_from_memory(bytes.file.get(), bytes.size);
  return out;
}

std::string meta(const SafeTensorsFile& f, const std::string& key, const std::string& fallback) {
  auto it = f.metadata.find(key);
  return it == f.metadata.end() ? fallback : it->second;
}

bool parse_bool(const std::string& s, const std::string& what) {
  if (s == "true" || s == "True" || s == "1") return true;
  if (s == "false" || s == "False" || s == "0") return false;
  throw std::invalid_argument("[run-layer] " + what + " must be true or false, got '" + s + "'");
}

// A strictly positive integer from metadata text, or invalid_argument naming where it came from.
int64_t parse_count(const std::string& s, const std::string& where) {
  int64_t v = 0;
  const auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size() || v <= 0)
    throw std::invalid_argument("[run-layer] " + where + " must be an integer >= 1, got '" + s + "'");
  return v;
}

float parse_eps(const std::string& s, const std::string& path) {
  float v = 0;
  const auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size() || !(v > 0) || !std::isfinite(v))
    throw std::invalid_argument("[run-layer] metadata 'layer_norm_eps' of " + path +
                                " must be a finite number > 0, got '" + s + "'");
  return v;
}

const Tensor& require(const SafeTensorsFile& f, const std::string& name, const std::string& path) {
  auto it = f.tensors.find(name);
  if (it == f.tensors.end()) throw std::invalid_argument("[run-layer] " + path + " has no tensor '" + name + "'");
  return it->second;
}

// The masks of one attention block from tensors "<prefix>_mask" and "<prefix>_key_padding_mask", if present.
nn::AttentionMasks masks_from(const LoadedFile& in, const std::string& mask_name, const std::string& kpm_name,
                              bool causal, bool unbatched) {
  nn::AttentionMasks m;
  auto kind_of = [&](const std::string& name) {
    return in.dtypes.at(name) == SafeTensorsDtype::BOOL ? MaskKind::kBlock : MaskKind::kAdditive;
  };
  if (auto it = in.file.tensors.find(mask_name); it != in.file.tensors.end()) {
    m.mask = it->second;
    m.mask_kind = kind_of(mask_name);
  }
  if (auto it = in.file.tensors.find(kpm_name); it != in.file.tensors.end()) {
    m.key_padding_mask = unbatched && it->second.dim() == 1 ? it->second.unsqueeze(0) : it->second;
    m.key_padding_mask_kind = kind_of(kpm_name);
  }
  m.is_causal = causal;
  return m;
}

int run_layer(const RunLayerArgs& a) {
  const Precision precision = parse_precision(a.precision);
  const SafeTensorsFile weights = load_safetensors(a.weights);
  nn::check_finite(weights.tensors, "[run-layer] " + a.weights + ": ");
  const LoadedFile in = load_with_dtypes(a.input);

  std::string layer = a.layer.empty() ? meta(weights, "layer", "encoder") : a.layer;
  if (layer == "TransformerEncoderLayer") layer = "encoder";
  if (layer == "TransformerDecoderLayer") layer = "decoder";
  if (layer != "encoder" && layer != "decoder") {
    throw std::invalid_argument("[run-layer] --layer must be encoder or decoder, got '" + layer + "'");
  }
  const bool decoder = layer == "decoder";

  nn::TransformerLayerConfig c;
  c.d_model = require(weights, "norm1.weight", a.weights).size(0);
  c.dim_feedforward = require(weights, "linear1.weight", a.weights).size(0);
  if (a.nhead) {
    if (*a.nhead <= 0)
      throw std::invalid_argument("[run-layer] --nhead must be >= 1, got " + std::to_string(*a.nhead));
    c.nhead = *a.nhead;
  } else {
    const auto it = weights.metadata.find("nhead");
    if (it == weights.metadata.end())
      throw std::invalid_argument("[run-layer] the number of heads is unknown: pass --nhead (or export with "
                                  "scripts/export_torch.py, which records it as metadata)");
    c.nhead = parse_count(it->second, "metadata 'nhead' of " + a.weights);
  }
  c.activation = nn::activation_from_string(
      a.activation.empty() ? meta(weights, "activation", "relu") : a.activation, "run-layer");
  c.norm_first = a.norm_first ? *a.norm_first : parse_bool(meta(weights, "norm_first", "false"), "norm_first");
  c.layer_norm_eps = a.eps ? *a.eps : parse_eps(meta(weights, "layer_norm_eps", "1e-5"), a.weights);
  // PyTorch's layers default to batch_first=False: (T, B, E). The exporter records the layout; without it the
  // input is taken as batch-first, as the help says.
  const bool batch_first =
      a.batch_first ? *a.batch_first : parse_bool(meta(weights, "batch_first", "true"), "batch_first");
  // (T, B, E) <-> (B, T, E); key-padding masks are (B, T) in both layouts.
  auto to_bt = [&](const Tensor& t) { return batch_first || t.dim() != 3 ? t : t.transpose(0, 1).contiguous(); };
  c.bias = weights.tensors.count("linear1.bias") > 0;
  c.dropout = 0.0f;

  Rng rng(0);  // every parameter is overwritten by the weights file
  Tensor y;
  if (!decoder) {
    nn::TransformerEncoderLayer m(c, rng);
    m.load_state_dict(weights.tensors);
    m.eval();
    m.set_precision(precision);
    const Tensor& src = require(in.file, "src", a.input);
    const bool unbatched = src.dim() == 2;
    const nn::AttentionMasks sm = masks_from(in, "src_mask", "src_key_padding_mask", a.causal, unbatched);
    y = m.forward(unbatched ? src.unsqueeze(0) : to_bt(src), sm);
    y = unbatched ? y.squeeze(0) : to_bt(y);
  } else {
    nn::TransformerDecoderLayer m(c, rng);
    m.load_state_dict(weights.tensors);
    m.eval();
    m.set_precision(precision);
    const Tensor& tgt = require(in.file, "tgt", a.input);
    const Tensor& memory = require(in.file, "memory", a.input);
    const bool unbatched = tgt.dim() == 2;
    const nn::AttentionMasks tm = masks_from(in, "tgt_mask", "tgt_key_padding_mask", a.causal, unbatched);
    const nn::AttentionMasks mm = masks_from(in, "memory_mask", "memory_key_padding_mask", false, unbatched);
    y = m.forward(unbatched ? tgt.unsqueeze(0) : to_bt(tgt), unbatched ? memory.unsqueeze(0) : to_bt(memory), tm, mm);
    y = unbatched ? y.squeeze(0) : to_bt(y);
  }
  save_safetensors(a.output, {{"output", y}}, {{"layer", layer}});
  return 0;
}

}  // namespace

void add_run_layer(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "run-layer",
      "Run a PyTorch TransformerEncoderLayer / DecoderLayer saved as safetensors (eval mode).\n"
      "Input tensors: encoder 'src' (B, T, E), or (T, B, E) when the layer has batch_first=False [+ 'src_mask', 'src_key_padding_mask']; decoder 'tgt', 'memory'\n"
      "[+ 'tgt_mask', 'memory_mask', 'tgt_key_padding_mask', 'memory_key_padding_mask']. BOOL masks: true = not\n"
      "allowed / padding (PyTorch's convention); float masks are added. Output: tensor 'output'.");
  auto a = std::make_shared<RunLayerArgs>();
  cmd->add_option("--weights", a->weights, "state_dict as safetensors (scripts/export_torch.py)")->required();
  cmd->add_option("--input", a->input, "input tensors as safetensors")->required();
  cmd->add_option("--output", a->output, "where to write the 'output' tensor")->required();
  cmd->add_option("--layer", a->layer, "encoder | decoder (default: the weights' metadata, else encoder)");
  cmd->add_option("--nhead", a->nhead, "number of heads (default: the weights' metadata)");
  cmd->add_option("--activation", a->activation, "relu | gelu | gelu_tanh (default: metadata, else relu)");
  cmd->add_option("--norm-first", a->norm_first, "true for pre-LN (default: metadata, else false)");
  cmd->add_option("--batch-first", a->batch_first,
                  "true: inputs are (B, T, E); false: (T, B, E) as PyTorch's default (default: metadata, else true)");
  cmd->add_option("--layer-norm-eps", a->eps, "LayerNorm epsilon (default: metadata, else 1e-5)");
  cmd->add_flag("--causal", a->causal, "apply a top-left causal mask to (decoder: self-)attention");
  add_precision_option(cmd, a->precision);
  cmd->callback([a]() { run_layer(*a); });
}

}  // namespace qkv::cli
