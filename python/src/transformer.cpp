// qkv.TransformerEncoderLayer / qkv.TransformerDecoderLayer: torch.nn's layers (batch-first, post-LN or pre-LN) over
// NumPy arrays, with PyTorch's parameter names and masks (bool True = not allowed / padding; float = added).
#include <pybind11/stl.h>

#include "bindings.h"
#include "module_binding.h"
#include "qkv/nn/feed_forward.h"
#include "qkv/nn/transformer.h"

namespace qkv::python {

namespace {

constexpr const char* kEnc = "TransformerEncoderLayer";
constexpr const char* kDec = "TransformerDecoderLayer";
using PyEnc = Bound<nn::TransformerEncoderLayer>;
using PyDec = Bound<nn::TransformerDecoderLayer>;

nn::TransformerLayerConfig make_config(const char* fn, int64_t d_model, int64_t nhead, int64_t dim_feedforward,
                                       double dropout, const py::object& activation, double layer_norm_eps,
                                       bool norm_first, bool bias) {
  if (!py::isinstance<py::str>(activation)) {
    throw py::type_error(std::string(fn) + ": activation must be \"relu\" or \"gelu\" (a str), got " +
                         std::string(py::str(py::type::of(activation).attr("__name__"))));
  }
  check_sizes(fn, {{"d_model", d_model}, {"nhead", nhead}, {"dim_feedforward", dim_feedforward}});
  check_sizes(fn, {{"d_model", d_model}, {"4 * d_model + 2 * dim_feedforward", 4 * d_model + 2 * dim_feedforward}});
  nn::TransformerLayerConfig c;
  c.d_model = d_model;
  c.nhead = nhead;
  c.dim_feedforward = dim_feedforward;
  c.dropout = static_cast<float>(dropout);
  c.activation = nn::activation_from_string(activation.cast<std::string>(), fn);
  c.layer_norm_eps = static_cast<float>(layer_norm_eps);
  c.norm_first = norm_first;
  c.bias = bias;
  return c;
}

// One attention block's masks; unbatched inputs get their key_padding_mask (T) lifted to (1, T).
nn::AttentionMasks make_masks(const char* fn, const py::object& mask, const char* mask_name, const py::object& kpm,
                              const char* kpm_name, bool is_causal, bool unbatched) {
  nn::AttentionMasks out;
  const MaskArg am = to_mask(mask, fn, mask_name, MaskKind::kBlock);
  const MaskArg pm = to_mask(kpm, fn, kpm_name, MaskKind::kBlock);
  out.mask = am.t;
  out.mask_kind = am.t.defined() ? am.kind : MaskKind::kBlock;
  out.key_padding_mask = pm.t;
  out.key_padding_mask_kind = pm.t.defined() ? pm.kind : MaskKind::kBlock;
  if (unbatched && pm.t.defined()) {
    if (pm.t.dim() != 1) {
      throw py::value_error(std::string("[") + fn + "] " + kpm_name + " " + str(pm.t.shape()) +
                            " must be (T) for an unbatched (T, E) input");
    }
    out.key_padding_mask = pm.t.unsqueeze(0);
  }
  out.is_causal = is_causal;
  return out;
}

// (T, E) -> (1, T, E); other ranks pass through to the module's own checks.
Tensor lift(const Tensor& x, bool unbatched) { return unbatched ? x.unsqueeze(0) : x; }

py::array_t<float> enc_call(PyEnc& self, const py::object& src, const py::object& src_mask,
                            const py::object& src_key_padding_mask, bool is_causal) {
  const Tensor x = to_batch_first(to_tensor(src, kEnc, "src"), self.batch_first);
  const bool unbatched = x.dim() == 2;
  const nn::AttentionMasks masks =
      make_masks(kEnc, src_mask, "src_mask", src_key_padding_mask, "src_key_padding_mask", is_causal, unbatched);
  Tensor y = locked_nogil(self.mu, [&] { return self.m->forward(lift(x, unbatched), masks); });
  return to_numpy(unbatched ? y.squeeze(0) : from_batch_first(y, self.batch_first));
}

py::array_t<float> dec_call(PyDec& self, const py::object& tgt, const py::object& memory, const py::object& tgt_mask,
                            const py::object& memory_mask, const py::object& tgt_key_padding_mask,
                            const py::object& memory_key_padding_mask, bool tgt_is_causal, bool memory_is_causal) {
  const Tensor t = to_batch_first(to_tensor(tgt, kDec, "tgt"), self.batch_first);
  const Tensor mem = memory.is(tgt) ? t : to_batch_first(to_tensor(memory, kDec, "memory"), self.batch_first);
  const bool unbatched = t.dim() == 2;
  if (unbatched != (mem.dim() == 2)) {
    throw py::value_error(std::string("[") + kDec + "] tgt " + str(t.shape()) + " and memory " + str(mem.shape()) +
                          " must both be batched (B, T, E) or both unbatched (T, E)");
  }
  const nn::AttentionMasks tm = make_masks(kDec, tgt_mask, "tgt_mask", tgt_key_padding_mask, "tgt_key_padding_mask",
                                           tgt_is_causal, unbatched);
  const nn::AttentionMasks mm = make_masks(kDec, memory_mask, "memory_mask", memory_key_padding_mask,
                                           "memory_key_padding_mask", memory_is_causal, unbatched);
  Tensor y = locked_nogil(self.mu, [&] { return self.m->forward(lift(t, unbatched), lift(mem, unbatched), tm, mm); });
  return to_numpy(unbatched ? y.squeeze(0) : from_batch_first(y, self.batch_first));
}

const char* kConfigDoc =
    "d_model E, nhead H (divides E), dim_feedforward F, dropout (training mode only), activation \"relu\" | "
    "\"gelu\" (exact erf) | \"gelu_tanh\", layer_norm_eps, norm_first (pre-LN), bias; batch_first (default False "
    "as in PyTorch: (T, B, E); True: (B, T, E)). "
    "Initialised from `seed` or the generator qkv.manual_seed reseeds; modules start in training mode, as in "
    "PyTorch: call eval() for deterministic inference.";

// Stacks: TransformerEncoder / TransformerDecoder (copies of one layer, as torch's deep copies) and Transformer.
constexpr const char* kEncStack = "TransformerEncoder";
constexpr const char* kDecStack = "TransformerDecoder";
constexpr const char* kTransformer = "Transformer";
using PyEncStack = Bound<nn::TransformerEncoder>;
using PyDecStack = Bound<nn::TransformerDecoder>;
using PyTransformer = Bound<nn::Transformer>;

// The final norm argument: None, or a LayerNorm's parameters as {weight, bias} (a dict, or anything with
// state_dict(), such as torch.nn.LayerNorm). Returns an empty dict for None.
nn::StateDict norm_state(const py::object& norm, const char* fn) {
  if (norm.is_none()) return {};
  const py::object sd = py::hasattr(norm, "state_dict") ? norm.attr("state_dict")() : norm;
  return to_state_dict(sd, (std::string(fn) + ".norm").c_str());
}

template <class Stack, class LayerW>
void copy_layers(Stack& stack, LayerW& layer, const nn::StateDict& norm, const char* fn) {
  const nn::StateDict sd = locked_nogil(layer.mu, [&] { return layer.m->state_dict(); });
  try {
    for (auto& l : stack.layers) l->load_state_dict(sd, true);
    if (stack.norm) stack.norm->load_state_dict(norm, true);
  } catch (const std::invalid_argument& e) {
    throw py::value_error(rename_op(e.what(), fn));
  }
}

bool causal_flag(const py::object& flag, const char* fn, const char* arg) {
  if (flag.is_none()) return false;  // torch's None: no causal hint
  if (!py::isinstance<py::bool_>(flag)) {
    throw py::type_error(std::string(fn) + ": " + arg + " must be a bool or None");
  }
  return flag.cast<bool>();
}

template <class W>
void def_layer_properties(py::class_<W>& cls) {
  cls.def_property_readonly("d_model", [](W& s) { return s.m->config().d_model; });
  cls.def_property_readonly("nhead", [](W& s) { return s.m->config().nhead; });
  cls.def_property_readonly("dim_feedforward", [](W& s) { return s.m->config().dim_feedforward; });
  cls.def_property_readonly("norm_first", [](W& s) { return s.m->config().norm_first; });
}

}  // namespace

void bind_transformer(py::module_& m) {
  py::class_<PyEnc> enc(m, kEnc, (std::string("torch.nn.TransformerEncoderLayer over arrays (NumPy, torch, ...).\n\n"
                                               "Parameters: self_attn.*, linear1.*, linear2.*, norm1.*, norm2.*. ") +
                                   kConfigDoc)
                                      .c_str());
  enc.def(py::init([](int64_t d_model, int64_t nhead, int64_t dim_feedforward, double dropout,
                      const py::object& activation, double layer_norm_eps, bool batch_first, bool norm_first,
                      bool bias, const py::object& seed) {
            const nn::TransformerLayerConfig c = make_config(kEnc, d_model, nhead, dim_feedforward, dropout,
                                                             activation, layer_norm_eps, norm_first, bias);
            Rng rng(module_seed(seed));
            auto w = std::make_unique<PyEnc>();
            w->batch_first = batch_first;
            w->m = std::make_unique<nn::TransformerEncoderLayer>(c, rng);
            return w;
          }),
          py::arg("d_model"), py::arg("nhead"), py::arg("dim_feedforward") = 2048, py::arg("dropout") = 0.1,
          py::arg("activation") = "relu", py::arg("layer_norm_eps") = 1e-5, py::arg("batch_first") = false,
          py::arg("norm_first") = false, py::arg("bias") = true, py::kw_only(), py::arg("seed") = py::none());
  enc.def("__call__", &enc_call, py::arg("src"), py::arg("src_mask") = py::none(),
          py::arg("src_key_padding_mask") = py::none(), py::arg("is_causal") = false,
          R"doc(src (T, B, E) -> (T, B, E), or (B, T, E) with batch_first=True; unbatched (T, E) works too.

post-LN (norm_first=False): x = norm1(x + sa(x)); x = norm2(x + ff(x)). pre-LN: x = x + sa(norm1(x)); x = x + ff(norm2(x)).
src_mask (T, T) or (B*H, T, T): bool True = not allowed, float = added. src_key_padding_mask (B, T): bool True =
padding (ignored as a key), float = added. is_causal applies a top-left causal mask (combined with src_mask).
A query row with every key masked gets a zero attention output (PyTorch: NaN).)doc");
  enc.attr("forward") = enc.attr("__call__");
  def_module_methods(enc, kEnc);
  def_layer_properties(enc);

  py::class_<PyDec> dec(m, kDec, (std::string("torch.nn.TransformerDecoderLayer over arrays (NumPy, torch, ...).\n\n"
                                              "Parameters: self_attn.*, multihead_attn.*, linear1.*, linear2.*, "
                                              "norm1.*, norm2.*, norm3.*. ") +
                                  kConfigDoc)
                                     .c_str());
  dec.def(py::init([](int64_t d_model, int64_t nhead, int64_t dim_feedforward, double dropout,
                      const py::object& activation, double layer_norm_eps, bool batch_first, bool norm_first,
                      bool bias, const py::object& seed) {
            const nn::TransformerLayerConfig c = make_config(kDec, d_model, nhead, dim_feedforward, dropout,
                                                             activation, layer_norm_eps, norm_first, bias);
            Rng rng(module_seed(seed));
            auto w = std::make_unique<PyDec>();
            w->batch_first = batch_first;
            w->m = std::make_unique<nn::TransformerDecoderLayer>(c, rng);
            return w;
          }),
          py::arg("d_model"), py::arg("nhead"), py::arg("dim_feedforward") = 2048, py::arg("dropout") = 0.1,
          py::arg("activation") = "relu", py::arg("layer_norm_eps") = 1e-5, py::arg("batch_first") = false,
          py::arg("norm_first") = false, py::arg("bias") = true, py::kw_only(), py::arg("seed") = py::none());
  dec.def("__call__", &dec_call, py::arg("tgt"), py::arg("memory"), py::arg("tgt_mask") = py::none(),
          py::arg("memory_mask") = py::none(), py::arg("tgt_key_padding_mask") = py::none(),
          py::arg("memory_key_padding_mask") = py::none(), py::arg("tgt_is_causal") = false,
          py::arg("memory_is_causal") = false,
          R"doc(tgt (Tt, B, E), memory (Ts, B, E) -> (Tt, B, E), or (B, T, E) layouts with batch_first=True; unbatched
(T, E) inputs work too.

post-LN: x = norm1(x + sa(x)); x = norm2(x + mha(x, memory)); x = norm3(x + ff(x)); pre-LN puts each norm inside.
tgt_mask (Tt, Tt) / memory_mask (Tt, Ts), or (B*H, ...): bool True = not allowed, float = added.
tgt_key_padding_mask (B, Tt) / memory_key_padding_mask (B, Ts): bool True = padding, float = added.
tgt_is_causal / memory_is_causal apply a top-left causal mask to that attention block (combined with its mask).)doc");
  dec.attr("forward") = dec.attr("__call__");
  def_module_methods(dec, kDec);
  def_layer_properties(dec);

  py::class_<PyEncStack> enc_stack(m, kEncStack, R"doc(torch.nn.TransformerEncoder: num_layers copies of encoder_layer.

TransformerEncoder(encoder_layer, num_layers, norm=None, enable_nested_tensor=True, mask_check=True): each layer
starts as a copy of encoder_layer's parameters (torch deep-copies it); norm: None, or a final LayerNorm given by its
parameters ({weight, bias}, or a torch.nn.LayerNorm). Parameters: layers.N.*, norm.*. Layout (batch_first) and
hyper-parameters are the layer's.)doc");
  enc_stack.def(py::init([](PyEnc& layer, int64_t num_layers, const py::object& norm, bool, bool) {
                  check_sizes(kEncStack, {{"num_layers", num_layers}}, 0);
                  const nn::StateDict ns = norm_state(norm, kEncStack);
                  Rng rng(0);  // every parameter is overwritten by the copies below
                  auto w = std::make_unique<PyEncStack>();
                  w->batch_first = layer.batch_first;
                  w->m = std::make_unique<nn::TransformerEncoder>(layer.m->config(), num_layers, !norm.is_none(), rng);
                  copy_layers(*w->m, layer, ns, kEncStack);
                  return w;
                }),
                py::arg("encoder_layer"), py::arg("num_layers"), py::arg("norm") = py::none(),
                py::arg("enable_nested_tensor") = true, py::arg("mask_check") = true);
  enc_stack.def(
      "__call__",
      [](PyEncStack& self, const py::object& src, const py::object& mask, const py::object& src_key_padding_mask,
         const py::object& is_causal) {
        const Tensor x = to_batch_first(to_tensor(src, kEncStack, "src"), self.batch_first);
        const bool unbatched = x.dim() == 2;
        const nn::AttentionMasks masks = make_masks(kEncStack, mask, "mask", src_key_padding_mask,
                                                    "src_key_padding_mask",
                                                    causal_flag(is_causal, kEncStack, "is_causal"), unbatched);
        Tensor y = locked_nogil(self.mu, [&] { return self.m->forward(lift(x, unbatched), masks); });
        return to_numpy(unbatched ? y.squeeze(0) : from_batch_first(y, self.batch_first));
      },
      py::arg("src"), py::arg("mask") = py::none(), py::arg("src_key_padding_mask") = py::none(),
      py::arg("is_causal") = py::none(),
      "src (T, B, E) ((B, T, E) when batch_first) -> same shape; masks as TransformerEncoderLayer's (mask = "
      "src_mask); is_causal None or False: no causal mask.");
  enc_stack.attr("forward") = enc_stack.attr("__call__");
  def_module_methods(enc_stack, kEncStack);
  enc_stack.def_property_readonly("num_layers", [](PyEncStack& s) { return s.m->num_layers(); });

  py::class_<PyDecStack> dec_stack(m, kDecStack, R"doc(torch.nn.TransformerDecoder: num_layers copies of decoder_layer.

TransformerDecoder(decoder_layer, num_layers, norm=None): as TransformerEncoder. Parameters: layers.N.*, norm.*.)doc");
  dec_stack.def(py::init([](PyDec& layer, int64_t num_layers, const py::object& norm) {
                  check_sizes(kDecStack, {{"num_layers", num_layers}}, 0);
                  const nn::StateDict ns = norm_state(norm, kDecStack);
                  Rng rng(0);
                  auto w = std::make_unique<PyDecStack>();
                  w->batch_first = layer.batch_first;
                  w->m = std::make_unique<nn::TransformerDecoder>(layer.m->config(), num_layers, !norm.is_none(), rng);
                  copy_layers(*w->m, layer, ns, kDecStack);
                  return w;
                }),
                py::arg("decoder_layer"), py::arg("num_layers"), py::arg("norm") = py::none());
  dec_stack.def(
      "__call__",
      [](PyDecStack& self, const py::object& tgt, const py::object& memory, const py::object& tgt_mask,
         const py::object& memory_mask, const py::object& tgt_key_padding_mask,
         const py::object& memory_key_padding_mask, const py::object& tgt_is_causal, bool memory_is_causal) {
        const Tensor t = to_batch_first(to_tensor(tgt, kDecStack, "tgt"), self.batch_first);
        const Tensor mem = to_batch_first(to_tensor(memory, kDecStack, "memory"), self.batch_first);
        const bool unbatched = t.dim() == 2;
        if (unbatched != (mem.dim() == 2)) {
          throw py::value_error(std::string("[") + kDecStack + "] tgt " + str(t.shape()) + " and memory " +
                                str(mem.shape()) + " must both be batched or both unbatched (T, E)");
        }
        const nn::AttentionMasks tm =
            make_masks(kDecStack, tgt_mask, "tgt_mask", tgt_key_padding_mask, "tgt_key_padding_mask",
                       causal_flag(tgt_is_causal, kDecStack, "tgt_is_causal"), unbatched);
        const nn::AttentionMasks mm = make_masks(kDecStack, memory_mask, "memory_mask", memory_key_padding_mask,
                                                 "memory_key_padding_mask", memory_is_causal, unbatched);
        Tensor y = locked_nogil(
            self.mu, [&] { return self.m->forward(lift(t, unbatched), lift(mem, unbatched), tm, mm); });
        return to_numpy(unbatched ? y.squeeze(0) : from_batch_first(y, self.batch_first));
      },
      py::arg("tgt"), py::arg("memory"), py::arg("tgt_mask") = py::none(), py::arg("memory_mask") = py::none(),
      py::arg("tgt_key_padding_mask") = py::none(), py::arg("memory_key_padding_mask") = py::none(),
      py::arg("tgt_is_causal") = py::none(), py::arg("memory_is_causal") = false,
      "tgt (Tt, B, E), memory (Ts, B, E) ((B, T, E) when batch_first) -> (Tt, B, E); masks as "
      "TransformerDecoderLayer's.");
  dec_stack.attr("forward") = dec_stack.attr("__call__");
  def_module_methods(dec_stack, kDecStack);
  dec_stack.def_property_readonly("num_layers", [](PyDecStack& s) { return s.m->num_layers(); });

  py::class_<PyTransformer> tr(m, kTransformer, R"doc(torch.nn.Transformer over arrays (NumPy, torch tensors, ...).

Transformer(d_model=512, nhead=8, num_encoder_layers=6, num_decoder_layers=6, dim_feedforward=2048, dropout=0.1,
activation="relu", custom_encoder=None, custom_decoder=None, layer_norm_eps=1e-5, batch_first=False,
norm_first=False, bias=True, *, seed=None). Parameters: encoder.layers.N.*, encoder.norm.*, decoder.layers.N.*,
decoder.norm.* (PyTorch's names); rank > 1 parameters re-drawn xavier-uniform, as torch. custom_encoder and
custom_decoder must be None.)doc");
  tr.def(py::init([](int64_t d_model, int64_t nhead, int64_t num_encoder_layers, int64_t num_decoder_layers,
                     int64_t dim_feedforward, double dropout, const py::object& activation,
                     const py::object& custom_encoder, const py::object& custom_decoder, double layer_norm_eps,
                     bool batch_first, bool norm_first, bool bias, const py::object& seed) {
           if (!custom_encoder.is_none() || !custom_decoder.is_none()) {
             throw py::value_error("[Transformer] custom_encoder and custom_decoder are not supported (use None)");
           }
           check_sizes(kTransformer, {{"num_encoder_layers", num_encoder_layers},
                                      {"num_decoder_layers", num_decoder_layers}}, 0);
           nn::TransformerConfig c;
           c.layer = make_config(kTransformer, d_model, nhead, dim_feedforward, dropout, activation, layer_norm_eps,
                                 norm_first, bias);
           c.num_encoder_layers = num_encoder_layers;
           c.num_decoder_layers = num_decoder_layers;
           Rng rng(module_seed(seed));
           auto w = std::make_unique<PyTransformer>();
           w->batch_first = batch_first;
           w->m = std::make_unique<nn::Transformer>(c, rng);
           return w;
         }),
         py::arg("d_model") = 512, py::arg("nhead") = 8, py::arg("num_encoder_layers") = 6,
         py::arg("num_decoder_layers") = 6, py::arg("dim_feedforward") = 2048, py::arg("dropout") = 0.1,
         py::arg("activation") = "relu", py::arg("custom_encoder") = py::none(),
         py::arg("custom_decoder") = py::none(), py::arg("layer_norm_eps") = 1e-5, py::arg("batch_first") = false,
         py::arg("norm_first") = false, py::arg("bias") = true, py::kw_only(), py::arg("seed") = py::none());
  tr.def(
      "__call__",
      [](PyTransformer& self, const py::object& src, const py::object& tgt, const py::object& src_mask,
         const py::object& tgt_mask, const py::object& memory_mask, const py::object& src_key_padding_mask,
         const py::object& tgt_key_padding_mask, const py::object& memory_key_padding_mask,
         const py::object& src_is_causal, const py::object& tgt_is_causal, bool memory_is_causal) {
        const Tensor s = to_batch_first(to_tensor(src, kTransformer, "src"), self.batch_first);
        const Tensor t = to_batch_first(to_tensor(tgt, kTransformer, "tgt"), self.batch_first);
        const bool unbatched = s.dim() == 2;
        if (unbatched != (t.dim() == 2)) {
          throw py::value_error(std::string("[") + kTransformer + "] src " + str(s.shape()) + " and tgt " +
                                str(t.shape()) + " must both be batched or both unbatched (T, E)");
        }
        const nn::AttentionMasks sm =
            make_masks(kTransformer, src_mask, "src_mask", src_key_padding_mask, "src_key_padding_mask",
                       causal_flag(src_is_causal, kTransformer, "src_is_causal"), unbatched);
        const nn::AttentionMasks tm =
            make_masks(kTransformer, tgt_mask, "tgt_mask", tgt_key_padding_mask, "tgt_key_padding_mask",
                       causal_flag(tgt_is_causal, kTransformer, "tgt_is_causal"), unbatched);
        const nn::AttentionMasks mm = make_masks(kTransformer, memory_mask, "memory_mask", memory_key_padding_mask,
                                                 "memory_key_padding_mask", memory_is_causal, unbatched);
        Tensor y = locked_nogil(
            self.mu, [&] { return self.m->forward(lift(s, unbatched), lift(t, unbatched), sm, tm, mm); });
        return to_numpy(unbatched ? y.squeeze(0) : from_batch_first(y, self.batch_first));
      },
      py::arg("src"), py::arg("tgt"), py::arg("src_mask") = py::none(), py::arg("tgt_mask") = py::none(),
      py::arg("memory_mask") = py::none(), py::arg("src_key_padding_mask") = py::none(),
      py::arg("tgt_key_padding_mask") = py::none(), py::arg("memory_key_padding_mask") = py::none(),
      py::arg("src_is_causal") = py::none(), py::arg("tgt_is_causal") = py::none(),
      py::arg("memory_is_causal") = false,
      "src (Ts, B, E), tgt (Tt, B, E) ((B, T, E) when batch_first) -> (Tt, B, E); masks as the layers'.");
  tr.attr("forward") = tr.attr("__call__");
  def_module_methods(tr, kTransformer);
  tr.def_static(
      "generate_square_subsequent_mask",
      [](int64_t sz) {
        check_sizes("generate_square_subsequent_mask", {{"sz", sz}}, 0);
        return to_numpy(nn::generate_square_subsequent_mask(sz));
      },
      py::arg("sz"), "(sz, sz) float32: 0 on and below the diagonal, -inf above (torch's).");
}

}  // namespace qkv::python
