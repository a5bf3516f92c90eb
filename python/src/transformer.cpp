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
                                       bool batch_first, bool norm_first, bool bias) {
  require_batch_first(batch_first, fn);
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
  const Tensor x = to_tensor(src, kEnc, "src");
  const bool unbatched = x.dim() == 2;
  const nn::AttentionMasks masks =
      make_masks(kEnc, src_mask, "src_mask", src_key_padding_mask, "src_key_padding_mask", is_causal, unbatched);
  Tensor y = locked_nogil(self.mu, [&] { return self.m->forward(lift(x, unbatched), masks); });
  return to_numpy(unbatched ? y.squeeze(0) : y);
}

py::array_t<float> dec_call(PyDec& self, const py::object& tgt, const py::object& memory, const py::object& tgt_mask,
                            const py::object& memory_mask, const py::object& tgt_key_padding_mask,
                            const py::object& memory_key_padding_mask, bool tgt_is_causal, bool memory_is_causal) {
  const Tensor t = to_tensor(tgt, kDec, "tgt");
  const Tensor mem = memory.is(tgt) ? t : to_tensor(memory, kDec, "memory");
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
  return to_numpy(unbatched ? y.squeeze(0) : y);
}

const char* kConfigDoc =
    "d_model E, nhead H (divides E), dim_feedforward F, dropout (training mode only), activation \"relu\" | "
    "\"gelu\" (exact erf) | \"gelu_tanh\", layer_norm_eps, norm_first (pre-LN), bias; batch_first must be True. "
    "Initialised from `seed` or the generator qkv.manual_seed reseeds; modules start in training mode, as in "
    "PyTorch: call eval() for deterministic inference.";

template <class W>
void def_layer_properties(py::class_<W>& cls) {
  cls.def_property_readonly("d_model", [](W& s) { return s.m->config().d_model; });
  cls.def_property_readonly("nhead", [](W& s) { return s.m->config().nhead; });
  cls.def_property_readonly("dim_feedforward", [](W& s) { return s.m->config().dim_feedforward; });
  cls.def_property_readonly("norm_first", [](W& s) { return s.m->config().norm_first; });
}

}  // namespace

void bind_transformer(py::module_& m) {
  py::class_<PyEnc> enc(m, kEnc, (std::string("torch.nn.TransformerEncoderLayer, batch-first, over NumPy arrays.\n\n"
                                               "Parameters: self_attn.*, linear1.*, linear2.*, norm1.*, norm2.*. ") +
                                   kConfigDoc)
                                      .c_str());
  enc.def(py::init([](int64_t d_model, int64_t nhead, int64_t dim_feedforward, double dropout,
                      const py::object& activation, double layer_norm_eps, bool batch_first, bool norm_first,
                      bool bias, const py::object& seed) {
            const nn::TransformerLayerConfig c = make_config(kEnc, d_model, nhead, dim_feedforward, dropout,
                                                             activation, layer_norm_eps, batch_first, norm_first, bias);
            Rng rng(module_seed(seed));
            auto w = std::make_unique<PyEnc>();
            w->m = std::make_unique<nn::TransformerEncoderLayer>(c, rng);
            return w;
          }),
          py::arg("d_model"), py::arg("nhead"), py::arg("dim_feedforward") = 2048, py::arg("dropout") = 0.1,
          py::arg("activation") = "relu", py::arg("layer_norm_eps") = 1e-5, py::arg("batch_first") = true,
          py::arg("norm_first") = false, py::arg("bias") = true, py::kw_only(), py::arg("seed") = py::none());
  enc.def("__call__", &enc_call, py::arg("src"), py::arg("src_mask") = py::none(),
          py::arg("src_key_padding_mask") = py::none(), py::arg("is_causal") = false,
          R"doc(src (B, T, E) -> (B, T, E); unbatched (T, E) works too.

post-LN (norm_first=False): x = norm1(x + sa(x)); x = norm2(x + ff(x)). pre-LN: x = x + sa(norm1(x)); x = x + ff(norm2(x)).
src_mask (T, T) or (B*H, T, T): bool True = not allowed, float = added. src_key_padding_mask (B, T): bool True =
padding (ignored as a key), float = added. is_causal applies a top-left causal mask (combined with src_mask).
A query row with every key masked gets a zero attention output (PyTorch: NaN).)doc");
  enc.attr("forward") = enc.attr("__call__");
  def_module_methods(enc, kEnc);
  def_layer_properties(enc);

  py::class_<PyDec> dec(m, kDec, (std::string("torch.nn.TransformerDecoderLayer, batch-first, over NumPy arrays.\n\n"
                                              "Parameters: self_attn.*, multihead_attn.*, linear1.*, linear2.*, "
                                              "norm1.*, norm2.*, norm3.*. ") +
                                  kConfigDoc)
                                     .c_str());
  dec.def(py::init([](int64_t d_model, int64_t nhead, int64_t dim_feedforward, double dropout,
                      const py::object& activation, double layer_norm_eps, bool batch_first, bool norm_first,
                      bool bias, const py::object& seed) {
            const nn::TransformerLayerConfig c = make_config(kDec, d_model, nhead, dim_feedforward, dropout,
                                                             activation, layer_norm_eps, batch_first, norm_first, bias);
            Rng rng(module_seed(seed));
            auto w = std::make_unique<PyDec>();
            w->m = std::make_unique<nn::TransformerDecoderLayer>(c, rng);
            return w;
          }),
          py::arg("d_model"), py::arg("nhead"), py::arg("dim_feedforward") = 2048, py::arg("dropout") = 0.1,
          py::arg("activation") = "relu", py::arg("layer_norm_eps") = 1e-5, py::arg("batch_first") = true,
          py::arg("norm_first") = false, py::arg("bias") = true, py::kw_only(), py::arg("seed") = py::none());
  dec.def("__call__", &dec_call, py::arg("tgt"), py::arg("memory"), py::arg("tgt_mask") = py::none(),
          py::arg("memory_mask") = py::none(), py::arg("tgt_key_padding_mask") = py::none(),
          py::arg("memory_key_padding_mask") = py::none(), py::arg("tgt_is_causal") = false,
          py::arg("memory_is_causal") = false,
          R"doc(tgt (B, Tt, E), memory (B, Ts, E) -> (B, Tt, E); unbatched (T, E) inputs work too.

post-LN: x = norm1(x + sa(x)); x = norm2(x + mha(x, memory)); x = norm3(x + ff(x)); pre-LN puts each norm inside.
tgt_mask (Tt, Tt) / memory_mask (Tt, Ts), or (B*H, ...): bool True = not allowed, float = added.
tgt_key_padding_mask (B, Tt) / memory_key_padding_mask (B, Ts): bool True = padding, float = added.
tgt_is_causal / memory_is_causal apply a top-left causal mask to that attention block (combined with its mask).)doc");
  dec.attr("forward") = dec.attr("__call__");
  def_module_methods(dec, kDec);
  def_layer_properties(dec);
}

}  // namespace qkv::python
