// qkv_probes: gradient probes of the C++ training stack for the PyTorch parity tests (test_train_parity.py,
// test_precision_train.py) — a module's output and parameter/input gradients for given weights, inputs and
// upstream gradients; cross-entropy; optimizer steps. A test-only module: built beside the package in an in-tree
// build (python/CMakeLists.txt), never installed.
#include <pybind11/stl.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "bindings.h"
#include "qkv/core/error.h"
#include "qkv/nn/multihead_attention.h"
#include "qkv/nn/rnn.h"
#include "qkv/nn/transformer.h"
#include "qkv/ops/functional.h"
#include "qkv/train/loss.h"
#include "qkv/train/optim.h"

namespace qkv::python {
namespace {

constexpr const char* kFn = "autograd.module_grads";

template <class T>
T get(const py::dict& d, const char* key, T fallback) {
  return d.contains(key) ? d[key].cast<T>() : fallback;
}

Tensor input(const py::dict& inputs, const char* key, bool required = true) {
  if (!inputs.contains(key)) {
    if (required) throw py::value_error(std::string("[") + kFn + "] inputs lack '" + key + "'");
    return Tensor();
  }
  return to_tensor(inputs[key], kFn, key).clone();  // own the data: the GIL is released below
}

MaskArg mask(const py::dict& options, const char* key) {
  return options.contains(key) ? to_mask(options[key], kFn, key, MaskKind::kBlock) : MaskArg{};
}

nn::TransformerLayerConfig layer_config(const py::dict& c) {
  nn::TransformerLayerConfig l;
  l.d_model = get<int64_t>(c, "d_model", 8);
  l.nhead = get<int64_t>(c, "nhead", 2);
  l.dim_feedforward = get<int64_t>(c, "dim_feedforward", 16);
  l.dropout = 0.0f;
  l.activation = nn::activation_from_string(get<std::string>(c, "activation", "relu"), kFn);
  l.layer_norm_eps = static_cast<float>(get<double>(c, "layer_norm_eps", 1e-5));
  l.norm_first = get<bool>(c, "norm_first", false);
  l.bias = get<bool>(c, "bias", true);
  return l;
}

nn::AttentionMasks masks_of(const py::dict& o, const char* mask_key, const char* kpm_key, const char* causal_key) {
  nn::AttentionMasks m;
  const MaskArg am = mask(o, mask_key), pm = mask(o, kpm_key);
  m.mask = am.t;
  if (am.t.defined()) m.mask_kind = am.kind;
  m.key_padding_mask = pm.t;
  if (pm.t.defined()) m.key_padding_mask_kind = pm.kind;
  m.is_causal = get<bool>(o, causal_key, false);
  return m;
}

// What one probe returns: named outputs, parameter gradients (PyTorch names) and input gradients.
struct Probe {
  std::map<std::string, Tensor> outputs, param_grads, input_grads;
};

// Builds the module, loads the weights, runs its forward on a training Context with leaves for the inputs, backward with the given
// upstream gradients (one per named output), and collects everything.
Probe run_probe(const std::string& kind, const py::dict& config, const nn::StateDict& weights, const py::dict& inputs,
                const py::dict& grad_outputs, const py::dict& options) {
  Rng rng(0);
  std::unique_ptr<nn::Module> module;
  std::map<std::string, Tensor> in;
  std::vector<std::string> input_names;
  auto take = [&](const char* key, bool required = true) {
    Tensor t = input(inputs, key, required);
    if (t.defined()) {
      in[key] = t;
      input_names.push_back(key);
    }
  };
  std::map<std::string, Tensor> upstream;
  for (auto item : grad_outputs) {
    const std::string k = item.first.cast<std::string>();
    upstream[k] = to_tensor(item.second, kFn, k.c_str()).clone();
  }
  nn::MhaForwardOptions mha_opts;
  nn::AttentionMasks m1, m2, m3;
  bool self_attention = false;
  if (kind == "mha") {
    module = std::make_unique<nn::MultiheadAttention>(get<int64_t>(config, "embed_dim", 8),
                                                      get<int64_t>(config, "num_heads", 2), rng, 0.0f,
                                                      get<bool>(config, "bias", true), get<int64_t>(config, "kdim", 0),
                                                      get<int64_t>(config, "vdim", 0));
    take("query");
    self_attention = !inputs.contains("key");
    if (!self_attention) {
      take("key");
      take("value");
    }
    const MaskArg kpm = mask(options, "key_padding_mask"), am = mask(options, "attn_mask");
    mha_opts.key_padding_mask = kpm.t;
    if (kpm.t.defined()) mha_opts.key_padding_mask_kind = kpm.kind;
    mha_opts.attn_mask = am.t;
    if (am.t.defined()) mha_opts.attn_mask_kind = am.kind;
    mha_opts.is_causal = get<bool>(options, "is_causal", false);
  } else if (kind == "encoder_layer") {
    module = std::make_unique<nn::TransformerEncoderLayer>(layer_config(config), rng);
    take("src");
    m1 = masks_of(options, "src_mask", "src_key_padding_mask", "is_causal");
  } else if (kind == "decoder_layer") {
    module = std::make_unique<nn::TransformerDecoderLayer>(layer_config(config), rng);
    take("tgt");
    take("memory");
    m1 = masks_of(options, "tgt_mask", "tgt_key_padding_mask", "tgt_is_causal");
    m2 = masks_of(options, "memory_mask", "memory_key_padding_mask", "memory_is_causal");
  } else if (kind == "transformer") {
    nn::TransformerConfig tc;
    tc.layer = layer_config(config);
    tc.num_encoder_layers = get<int64_t>(config, "num_encoder_layers", 1);
    tc.num_decoder_layers = get<int64_t>(config, "num_decoder_layers", 1);
    module = std::make_unique<nn::Transformer>(tc, rng);
    take("src");
    take("tgt");
    m1 = masks_of(options, "src_mask", "src_key_padding_mask", "src_is_causal");
    m2 = masks_of(options, "tgt_mask", "tgt_key_padding_mask", "tgt_is_causal");
    m3 = masks_of(options, "memory_mask", "memory_key_padding_mask", "memory_is_causal");
  } else if (kind == "gru" || kind == "lstm") {
    nn::RnnOptions ro;
    ro.num_layers = get<int64_t>(config, "num_layers", 1);
    ro.bias = get<bool>(config, "bias", true);
    ro.batch_first = true;
    const int64_t is = get<int64_t>(config, "input_size", 4), hs = get<int64_t>(config, "hidden_size", 4);
    if (kind == "gru") module = std::make_unique<nn::GRU>(is, hs, rng, ro);
    else module = std::make_unique<nn::LSTM>(is, hs, rng, ro);
    take("input");
    take("h0", false);
    if (kind == "lstm") take("c0", false);
  } else {
    throw py::value_error(std::string("[") + kFn + "] unknown module kind '" + kind +
                          "': choose mha, encoder_layer, decoder_layer, transformer, gru or lstm");
  }
  const std::vector<int64_t> lengths =
      options.contains("lengths") ? options["lengths"].cast<std::vector<int64_t>>() : std::vector<int64_t>{};

  const Precision precision =
      options.contains("precision") ? parse_precision(options["precision"].cast<std::string>()) : Precision::kFloat32;
  Probe p;
  py::gil_scoped_release nogil;
  module->load_state_dict(weights, true);
  // A module already at fp32 is left as it is: the tape forward below reads its live weights either way.
  if (precision != Precision::kFloat32 || module->precision() != precision) module->set_precision(precision);
  module->eval();
  ad::ParameterSet params(*module);
  params.zero_grad();
  ad::Tape tape;
  nn::Context g(tape, params);
  std::map<std::string, ad::Var> leaves;
  for (const std::string& n : input_names) leaves[n] = tape.leaf(in[n]);
  auto leaf = [&](const char* n) { return leaves.count(n) ? leaves[n] : ad::Var(); };
  std::map<std::string, ad::Var> outs;
  if (kind == "mha") {
    auto& m = static_cast<nn::MultiheadAttention&>(*module);
    const ad::Var q = leaf("query");
    outs["output"] = self_attention ? m.forward(g, q, q, q, mha_opts).out
                                    : m.forward(g, q, leaf("key"), leaf("value"), mha_opts).out;
  } else if (kind == "encoder_layer") {
    outs["output"] = static_cast<nn::TransformerEncoderLayer&>(*module).forward(g, leaf("src"), m1);
  } else if (kind == "decoder_layer") {
    outs["output"] =
        static_cast<nn::TransformerDecoderLayer&>(*module).forward(g, leaf("tgt"), leaf("memory"), m1, m2);
  } else if (kind == "transformer") {
    outs["output"] = static_cast<nn::Transformer&>(*module).forward(g, leaf("src"), leaf("tgt"), m1, m2, m3);
  } else {
    const nn::RnnVars r =
        static_cast<nn::RnnBase&>(*module).forward_any(g, leaf("input"), leaf("h0"), leaf("c0"), lengths);
    outs["output"] = r.output;
    outs["h_n"] = r.h_n;
    if (r.c_n.defined()) outs["c_n"] = r.c_n;
  }
  // One backward over the sum of <output, upstream> for every output that has an upstream gradient.
  std::vector<ad::Var> terms;
  for (auto& [name, v] : outs) {
    p.outputs[name] = v.value.contiguous();
    auto it = upstream.find(name);
    if (it == upstream.end()) continue;
    QKV_CHECK_ARG(it->second.shape() == v.shape(), "[", kFn, "] grad_outputs['", name, "'] ", str(it->second.shape()),
                  " must match the output ", str(v.shape()));
    terms.push_back(ad::sum(ad::mul(v, ad::Var(it->second))));
  }
  QKV_CHECK_ARG(!terms.empty(), "[", kFn, "] grad_outputs names none of the outputs");
  ad::Var total = terms[0];
  for (size_t i = 1; i < terms.size(); ++i) total = ad::add(total, terms[i]);
  tape.backward(total);
  for (size_t i = 0; i < params.size(); ++i)
    p.param_grads[params[i].name] = params[i].has_grad ? params[i].grad.clone() : Tensor::zeros(params[i].grad.shape());
  for (auto& [name, v] : leaves) {
    const Tensor gr = v.grad();
    p.input_grads[name] = gr.defined() ? gr.contiguous() : Tensor::zeros(v.shape());
  }
  return p;
}

py::dict to_dict(const std::map<std::string, Tensor>& m) {
  py::dict d;
  for (const auto& [k, v] : m) d[py::str(k)] = to_numpy(v);
  return d;
}

std::unique_ptr<train::Optimizer> make_optimizer(const std::string& kind, ad::ParameterSet& ps,
                                                 const py::dict& o) {
  if (kind == "sgd") {
    train::SgdOptions s;
    s.lr = get<double>(o, "lr", 1e-2);
    s.momentum = get<double>(o, "momentum", 0.0);
    s.dampening = get<double>(o, "dampening", 0.0);
    s.weight_decay = get<double>(o, "weight_decay", 0.0);
    s.nesterov = get<bool>(o, "nesterov", false);
    return std::make_unique<train::SGD>(ps, s);
  }
  if (kind == "adam" || kind == "adamw") {
    train::AdamOptions a;
    a.lr = get<double>(o, "lr", 1e-3);
    a.beta1 = get<double>(o, "beta1", 0.9);
    a.beta2 = get<double>(o, "beta2", 0.999);
    a.eps = get<double>(o, "eps", 1e-8);
    a.weight_decay = get<double>(o, "weight_decay", kind == "adamw" ? 1e-2 : 0.0);
    return std::make_unique<train::Adam>(ps, a, kind == "adamw");
  }
  throw py::value_error("[autograd.optimizer_steps] unknown optimizer '" + kind + "': choose sgd, adam or adamw");
}

}  // namespace

void bind_probes(py::module_& ag) {
  ag.def(
      "module_grads",
      [](const std::string& kind, const py::dict& config, const py::object& state_dict, const py::dict& inputs,
         const py::dict& grad_outputs, const py::dict& options) {
        const nn::StateDict weights = to_state_dict(state_dict, kFn);
        Probe p;
        try {
          p = run_probe(kind, config, weights, inputs, grad_outputs, options);
        } catch (const std::invalid_argument& e) {
          throw py::value_error(e.what());
        }
        return py::make_tuple(to_dict(p.outputs), to_dict(p.param_grads), to_dict(p.input_grads));
      },
      py::arg("kind"), py::arg("config"), py::arg("state_dict"), py::arg("inputs"), py::arg("grad_outputs"),
      py::arg("options") = py::dict(),
      "Builds module `kind` (mha | encoder_layer | decoder_layer | transformer | gru | lstm; batch-first, eval mode)\n"
      "from `config` (PyTorch's constructor arguments), loads `state_dict` (PyTorch names), runs the tape forward on\n"
      "`inputs` ({'query', 'key', 'value'} | {'src'} | {'tgt', 'memory'} | {'src', 'tgt'} | {'input', 'h0', 'c0'};\n"
      "MHA without 'key' is self-attention through the packed projection) with `options` (masks with PyTorch's\n"
      "names and conventions, is_causal flags, RNN 'lengths', 'precision' fp32 | bf16), and backpropagates sum(<output, grad>) for every\n"
      "entry of `grad_outputs` ('output', 'h_n', 'c_n'). Returns (outputs, parameter_grads, input_grads) as dicts\n"
      "of float32 arrays.");
  ag.def(
      "cross_entropy",
      [](const py::object& logits, const std::vector<int64_t>& targets, int64_t ignore_index, double label_smoothing,
         const std::string& reduction) {
        const Tensor x = to_tensor(logits, "autograd.cross_entropy", "logits").clone();
        train::CrossEntropyOptions o;
        o.ignore_index = ignore_index;
        o.label_smoothing = static_cast<float>(label_smoothing);
        if (reduction == "mean") o.reduction = train::Reduction::kMean;
        else if (reduction == "sum") o.reduction = train::Reduction::kSum;
        else throw py::value_error("[autograd.cross_entropy] reduction must be 'mean' or 'sum'");
        Tensor loss, grad;
        try {
          py::gil_scoped_release nogil;
          ad::Tape tape;
          const ad::Var v = tape.leaf(x);
          const ad::Var l = train::cross_entropy(v, targets, o);
          tape.backward(l);
          loss = l.value;
          grad = v.grad();
        } catch (const std::invalid_argument& e) {
          throw py::value_error(e.what());
        }
        return py::make_tuple(loss.item(), to_numpy(grad));
      },
      py::arg("logits"), py::arg("targets"), py::arg("ignore_index") = -100, py::arg("label_smoothing") = 0.0,
      py::arg("reduction") = "mean",
      "logits (N, V) or (..., V), targets: N class ids -> (loss, dlogits), as F.cross_entropy.");
  ag.def(
      "optimizer_steps",
      [](const std::string& kind, const py::dict& options, const py::object& params, const py::list& grads) {
        nn::StateDict values = to_state_dict(params, "autograd.optimizer_steps");
        for (auto& [k, v] : values) v = v.clone();
        std::vector<nn::StateDict> steps;
        for (auto g : grads) steps.push_back(to_state_dict(g, "autograd.optimizer_steps"));
        py::list out;
        ad::ParameterSet ps;
        for (auto& [k, v] : values) ps.add(k, &v);
        std::unique_ptr<train::Optimizer> opt = make_optimizer(kind, ps, options);
        for (const nn::StateDict& g : steps) {
          ps.zero_grad();
          for (const auto& [k, v] : g) {
            ad::Parameter* p = ps.find(k);
            if (!p || v.shape() != p->value->shape())
              throw py::value_error("[autograd.optimizer_steps] gradient '" + k + "' names no parameter of that shape");
            p->grad.copy_from(v);
            p->has_grad = true;
          }
          opt->step();
          std::map<std::string, Tensor> now;
          for (auto& [k, v] : values) now[k] = v;
          out.append(to_dict(now));
        }
        return out;
      },
      py::arg("kind"), py::arg("options"), py::arg("params"), py::arg("grads"),
      "Runs one optimizer step (sgd | adam | adamw, torch.optim's option names; betas as beta1/beta2) per entry of\n"
      "`grads` ([{name: grad}]; a missing name has no gradient that step) from `params` ({name: array}); returns\n"
      "the parameters after each step.");
}

}  // namespace qkv::python

PYBIND11_MODULE(qkv_probes, m) {
  m.doc() = "Gradient probes of qkv's C++ training stack, for the PyTorch parity tests (not installed)";
  qkv::python::register_errors(m);
  qkv::python::bind_probes(m);
}
