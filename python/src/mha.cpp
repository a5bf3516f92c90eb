// qkv.MultiheadAttention: torch.nn.MultiheadAttention (batch-first) over NumPy arrays, with PyTorch's parameter
// names and mask conventions (bool attn_mask / key_padding_mask: True = not allowed / ignored; float: added).
#include <pybind11/stl.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <utility>

#include "bindings.h"
#include "module_binding.h"
#include "qkv/nn/multihead_attention.h"

namespace qkv::python {

namespace {

constexpr const char* kName = "MultiheadAttention";
using PyMha = Bound<nn::MultiheadAttention>;

int64_t optional_int(const py::object& obj, int64_t fallback, const char* fn, const char* arg) {
  if (obj.is_none()) return fallback;
  if (!py::isinstance<py::int_>(obj) || py::isinstance<py::bool_>(obj)) {
    throw py::type_error(std::string(fn) + ": " + arg + " must be an int or None");
  }
  int overflow = 0;
  const long long n = PyLong_AsLongLongAndOverflow(obj.ptr(), &overflow);
  if (overflow != 0) throw py::value_error(std::string("[") + fn + "] " + arg + " is too large");
  return static_cast<int64_t>(n);
}

std::unique_ptr<PyMha> make_mha(int64_t embed_dim, int64_t num_heads, double dropout, bool bias, bool add_bias_kv,
                                bool add_zero_attn, const py::object& kdim_obj, const py::object& vdim_obj,
                                bool batch_first, const py::object& seed, const py::object& num_kv_heads_obj) {
  if (add_bias_kv || add_zero_attn) {
    throw py::value_error("[MultiheadAttention] add_bias_kv and add_zero_attn are not supported");
  }
  const int64_t kdim = optional_int(kdim_obj, embed_dim, kName, "kdim");
  const int64_t vdim = optional_int(vdim_obj, embed_dim, kName, "vdim");
  std::optional<int64_t> num_kv_heads;  // None: num_heads (the module checks the value and names it)
  if (!num_kv_heads_obj.is_none()) num_kv_heads = optional_int(num_kv_heads_obj, num_heads, kName, "num_kv_heads");
  check_sizes(kName, {{"embed_dim", embed_dim}, {"num_heads", num_heads}, {"kdim", kdim}, {"vdim", vdim}});
  check_sizes(kName, {{"3 * embed_dim", 3 * embed_dim}, {"max(embed_dim, kdim, vdim)", std::max({embed_dim, kdim, vdim})}});
  Rng rng(module_seed(seed));
  auto w = std::make_unique<PyMha>();
  w->batch_first = batch_first;
  w->m = std::make_unique<nn::MultiheadAttention>(embed_dim, num_heads, rng, static_cast<float>(dropout), bias,
                                                   kdim, vdim, num_kv_heads);
  return w;
}

py::tuple mha_call(PyMha& self, const py::object& query, const py::object& key, const py::object& value,
                   const py::object& key_padding_mask, bool need_weights, const py::object& attn_mask,
                   bool average_attn_weights, bool is_causal, std::pair<int64_t, int64_t> window_size,
                   double softcap) {
  // The same array passed twice becomes the same Tensor, so the module takes its fused-projection paths.
  const bool bf = self.batch_first;
  const Tensor q = to_batch_first(to_tensor(query, kName, "query"), bf);
  const Tensor k = key.is(query) ? q : to_batch_first(to_tensor(key, kName, "key"), bf);
  const Tensor v = value.is(key) ? k : value.is(query) ? q : to_batch_first(to_tensor(value, kName, "value"), bf);
  nn::MhaForwardOptions o;
  const MaskArg kpm = to_mask(key_padding_mask, kName, "key_padding_mask", MaskKind::kBlock);
  const MaskArg am = to_mask(attn_mask, kName, "attn_mask", MaskKind::kBlock);
  o.key_padding_mask = kpm.t;
  o.key_padding_mask_kind = kpm.kind == MaskKind::kNone ? MaskKind::kBlock : kpm.kind;
  o.attn_mask = am.t;
  o.attn_mask_kind = am.kind == MaskKind::kNone ? MaskKind::kBlock : am.kind;
  o.is_causal = is_causal;
  o.need_weights = need_weights;
  o.average_attn_weights = average_attn_weights;
  o.batch_first = bf;  // messages show the caller's (T, B, E)
  AttentionOptions variants;
  set_variants(variants, window_size, softcap, kName);
  o.window_left = variants.window_left;
  o.window_right = variants.window_right;
  o.softcap = variants.softcap;
  nn::MhaResult r = locked_nogil(self.mu, [&] { return self.m->forward(q, k, v, o); });
  return py::make_tuple(to_numpy(from_batch_first(r.out.value, bf)),
                        r.weights.defined() ? py::object(to_numpy(r.weights)) : py::none());
}

}  // namespace

void bind_mha(py::module_& m) {
  py::class_<PyMha> cls(m, kName, R"doc(torch.nn.MultiheadAttention over arrays (NumPy, torch tensors, ...).

Parameters (PyTorch's names and packing): in_proj_weight (3E, E) when kdim == vdim == E, else q_proj_weight (E, E),
k_proj_weight (E, kdim), v_proj_weight (E, vdim); in_proj_bias (3E); out_proj.weight (E, E); out_proj.bias (E).
bias=False drops the biases. Initialised as PyTorch (xavier-uniform, zero biases) from `seed`, or from the
generator qkv.manual_seed reseeds. Supported: dropout (training mode only), bias, kdim, vdim, batch_first (default
False as in PyTorch: inputs (T, B, E); True: (B, T, E)). Not supported (ValueError): add_bias_kv, add_zero_attn.
Beyond PyTorch (keyword-only): num_kv_heads (default num_heads), grouped-query attention: keys and values get
num_kv_heads heads of head_dim D (Ekv = num_kv_heads * D features) and query head h reads kv head
h // (num_heads // num_kv_heads), as scaled_dot_product_attention(enable_gqa=True). The parameters shrink to
in_proj_weight (E + 2*Ekv, E) (rows q, k, v, as a fused qkv layer stores them), k_proj_weight (Ekv, kdim),
v_proj_weight (Ekv, vdim), in_proj_bias (E + 2*Ekv); masks and the weights stay per query head. num_kv_heads must
be >= 1 and divide num_heads (ValueError).)doc");
  cls.def(py::init(&make_mha), py::arg("embed_dim"), py::arg("num_heads"), py::arg("dropout") = 0.0,
          py::arg("bias") = true, py::arg("add_bias_kv") = false, py::arg("add_zero_attn") = false,
          py::arg("kdim") = py::none(), py::arg("vdim") = py::none(), py::arg("batch_first") = false, py::kw_only(),
          py::arg("seed") = py::none(), py::arg("num_kv_heads") = py::none());
  cls.def("__call__", &mha_call, py::arg("query"), py::arg("key"), py::arg("value"),
          py::arg("key_padding_mask") = py::none(), py::arg("need_weights") = true, py::arg("attn_mask") = py::none(),
          py::arg("average_attn_weights") = true, py::arg("is_causal") = false, py::kw_only(),
          py::arg("window_size") = std::pair<int64_t, int64_t>{-1, -1}, py::arg("softcap") = 0.0,
          R"doc(Attention of query over key/value -> (out, weights or None).

query (Tq, B, E), key (Tk, B, kdim), value (Tk, B, vdim) -> out (Tq, B, E); with batch_first=True (B, Tq, E),
(B, Tk, kdim), (B, Tk, vdim) -> (B, Tq, E). Unbatched (T, dim) inputs work too.
key_padding_mask (B, Tk): bool True = that key is padding and ignored; float = added.
attn_mask (Tq, Tk) or (B*H, Tq, Tk) (row b*H + h): bool True = the pair is NOT allowed; float = added.
need_weights: also return the attention weights, (B, Tq, Tk) averaged over heads when average_attn_weights,
else (B, H, Tq, Tk). is_causal applies a top-left causal mask (query i sees keys j <= i), combined with attn_mask;
PyTorch requires attn_mask with it and treats it as a hint that attn_mask is causal, so the results agree then.
A query row whose every key is masked gives 0 (out = out_proj.bias there) and weights 0, where PyTorch gives NaN.
Beyond PyTorch (keyword-only, as qkv.scaled_dot_product_attention takes them): window_size=(left, right), -1 =
unbounded, FlashAttention's sliding window aligned bottom-right: query i sees key j iff
i + Tk - Tq - left <= j <= i + Tk - Tq + right (a model's sliding_window W is (W - 1, 0)); softcap c > 0: scores
become c·tanh(scores / c) before the masks and the softmax (Gemma 2). Both combine with the masks and is_causal,
and the weights show them. A side below -1 or a softcap not finite and >= 0 raises ValueError.)doc");
  cls.attr("forward") = cls.attr("__call__");
  def_module_methods(cls, kName);
  cls.def_property_readonly("embed_dim", [](PyMha& s) { return s.m->embed_dim(); });
  cls.def_property_readonly("num_heads", [](PyMha& s) { return s.m->num_heads(); });
  cls.def_property_readonly("num_kv_heads", [](PyMha& s) { return s.m->num_kv_heads(); });
  cls.def_property_readonly("head_dim", [](PyMha& s) { return s.m->head_dim(); });
  cls.def_property_readonly("kdim", [](PyMha& s) { return s.m->kdim(); });
  cls.def_property_readonly("vdim", [](PyMha& s) { return s.m->vdim(); });
  cls.def_property_readonly("dropout", [](PyMha& s) { return s.m->dropout(); });
  cls.def("__repr__", [](PyMha& s) {
    return "MultiheadAttention(embed_dim=" + std::to_string(s.m->embed_dim()) +
           ", num_heads=" + std::to_string(s.m->num_heads()) +
           (s.m->num_kv_heads() != s.m->num_heads() ? ", num_kv_heads=" + std::to_string(s.m->num_kv_heads()) : "") +
           ", kdim=" + std::to_string(s.m->kdim()) +
           ", vdim=" + std::to_string(s.m->vdim()) + ", batch_first=" + (s.batch_first ? "True" : "False") + ")";
  });
}

}  // namespace qkv::python
