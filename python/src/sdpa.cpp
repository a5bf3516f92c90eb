// torch.nn.functional.scaled_dot_product_attention over NumPy arrays, and its backward (the fused kernel's).
// PyTorch's conventions: a bool attn_mask's True takes part, a float mask is added, is_causal is top-left.
#include <pybind11/stl.h>

#include <cmath>
#include <optional>

#include "bindings.h"
#include "qkv/ops/attention.h"

namespace qkv::python {

namespace {

constexpr const char* kSdpa = "scaled_dot_product_attention";
constexpr const char* kSdpaBackward = "scaled_dot_product_attention_backward";

AttentionOptions sdpa_options(const py::object& attn_mask, bool is_causal, std::optional<double> scale,
                              const char* fn) {
  AttentionOptions o;
  const MaskArg m = to_mask(attn_mask, fn, "attn_mask", MaskKind::kKeep);
  if (m.t.defined() && is_causal) {
    throw py::value_error(std::string("[") + fn +
                          "] attn_mask and is_causal=True cannot both be set (as PyTorch documents); fold the "
                          "causal mask into attn_mask, or use qkv.attention(mask=..., causal='top_left')");
  }
  o.mask = m.t;
  o.mask_kind = m.kind;
  o.causal = is_causal ? Causal::kTopLeft : Causal::kNone;
  if (scale) {
    if (!std::isfinite(*scale) || std::fabs(*scale) > 3.0e38) {
      throw py::value_error(std::string("[") + fn + "] scale must be a finite float32, got " +
                            std::to_string(*scale));
    }
    o.scale = static_cast<float>(*scale);
  }
  return o;
}

Shape out_shape(const Shape& batch, const Tensor& q, const Tensor& v) {
  Shape s = batch;
  s.push_back(q.size(-2));
  s.push_back(v.size(-1));
  return s;
}

// The private kernels behind qkv.torch: strided float32 inputs read in place (numpy views of torch tensors), results
// handed back without a copy. A bool mask keeps (SDPA), a floating one is added; is_causal is top-left and combines
// with the mask (both must allow a pair), as torch 2.13 does.
AttentionOptions strided_options(const py::object& attn_mask, bool is_causal, std::optional<double> scale,
                                 const char* fn) {
  AttentionOptions o = sdpa_options(py::none(), is_causal, scale, fn);
  if (py::isinstance<py::array_t<float>>(attn_mask)) {
    o.mask = to_tensor_strided(attn_mask, fn, "attn_mask");
    o.mask_kind = MaskKind::kAdditive;
  } else if (!attn_mask.is_none()) {
    const MaskArg m = to_mask(attn_mask, fn, "attn_mask", MaskKind::kKeep);
    o.mask = m.t;
    o.mask_kind = m.kind;
  }
  return o;
}

void bind_strided(py::module_& m) {
  constexpr const char* kFwd = "_sdpa_forward";
  constexpr const char* kBwd = "_sdpa_backward";
  m.def(
      kFwd,
      [](const py::object& query, const py::object& key, const py::object& value, const py::object& attn_mask,
         bool is_causal, std::optional<double> scale) {
        AttentionOptions o = strided_options(attn_mask, is_causal, scale, kFwd);
        o.return_lse = true;
        const Tensor q = to_tensor_strided(query, kFwd, "query");
        const Tensor k = to_tensor_strided(key, kFwd, "key");
        const Tensor v = to_tensor_strided(value, kFwd, "value");
        attention_check(q, k, v, o, kFwd);
        AttentionResult r;
        {
          py::gil_scoped_release nogil;
          r = qkv::attention_fused(q, k, v, o);
        }
        return py::make_tuple(to_numpy_shared(r.out), to_numpy_shared(r.lse));
      },
      py::arg("query"), py::arg("key"), py::arg("value"), py::arg("attn_mask"), py::arg("is_causal"),
      py::arg("scale"),
      "qkv.torch's forward: (out (..., Tq, Dv), lse (..., Tq)) of the fused kernel; strided float32 inputs are read "
      "in place and the results are not copied.");
  m.def(
      kBwd,
      [](const py::object& grad_out, const py::object& query, const py::object& key, const py::object& value,
         const py::object& out, const py::object& lse, const py::object& attn_mask, bool is_causal,
         std::optional<double> scale) {
        const AttentionOptions o = strided_options(attn_mask, is_causal, scale, kBwd);
        const Tensor g = to_tensor_strided(grad_out, kBwd, "grad_out");
        const Tensor q = to_tensor_strided(query, kBwd, "query");
        const Tensor k = to_tensor_strided(key, kBwd, "key");
        const Tensor v = to_tensor_strided(value, kBwd, "value");
        const Tensor o_ = to_tensor_strided(out, kBwd, "out");
        const Tensor l = to_tensor_strided(lse, kBwd, "lse");
        AttentionGrads grads;
        {
          py::gil_scoped_release nogil;
          grads = qkv::attention_backward(q, k, v, o_, l, g, o);
        }
        return py::make_tuple(to_numpy_shared(grads.dq), to_numpy_shared(grads.dk), to_numpy_shared(grads.dv));
      },
      py::arg("grad_out"), py::arg("query"), py::arg("key"), py::arg("value"), py::arg("out"), py::arg("lse"),
      py::arg("attn_mask"), py::arg("is_causal"), py::arg("scale"),
      "qkv.torch's backward: (grad_query, grad_key, grad_value) from the forward's out and lse through the fused "
      "kernel, summed over broadcast axes; strided inputs are read in place.");
}

}  // namespace

void bind_sdpa(py::module_& m) {
  bind_strided(m);
  m.def(
      kSdpa,
      [](const py::object& query, const py::object& key, const py::object& value, const py::object& attn_mask,
         double dropout_p, bool is_causal, std::optional<double> scale) {
        if (dropout_p != 0.0) {
          throw py::value_error(std::string("[") + kSdpa + "] dropout_p must be 0.0 (qkv has no attention dropout "
                                "here), got " + std::to_string(dropout_p));
        }
        const AttentionOptions o = sdpa_options(attn_mask, is_causal, scale, kSdpa);
        const Tensor q = to_tensor(query, kSdpa, "query");
        const Tensor k = key.is(query) ? q : to_tensor(key, kSdpa, "key");
        const Tensor v = value.is(key) ? k : to_tensor(value, kSdpa, "value");
        attention_check(q, k, v, o, kSdpa);
        Tensor out;
        {
          py::gil_scoped_release nogil;
          out = qkv::attention(q, k, v, o).out;
        }
        return to_numpy(out);
      },
      py::arg("query"), py::arg("key"), py::arg("value"), py::arg("attn_mask") = py::none(),
      py::arg("dropout_p") = 0.0, py::arg("is_causal") = false, py::arg("scale") = py::none(),
      R"doc(torch.nn.functional.scaled_dot_product_attention on NumPy arrays (float32 compute).

query (..., Tq, D), key (..., Tk, D), value (..., Tk, Dv) -> out (..., Tq, Dv); typically (B, H, T, D).
Leading dims broadcast together. attn_mask broadcasts to (..., Tq, Tk): a bool mask's True means the pair takes
part, a float mask is added to the scaled scores (-inf blocks). is_causal applies PyTorch's top-left causal mask
(query i sees keys j <= i) and, as PyTorch documents, cannot be combined with attn_mask. scale defaults to
1/sqrt(D). dropout_p must be 0.0. A query row with every key masked gives 0 (as PyTorch 2.5+'s math backend;
never NaN). Runs the fused FlashAttention-style kernel with the GIL released.)doc");

  m.def(
      kSdpaBackward,
      [](const py::object& query, const py::object& key, const py::object& value, const py::object& grad_out,
         const py::object& attn_mask, bool is_causal, std::optional<double> scale) {
        const AttentionOptions o = sdpa_options(attn_mask, is_causal, scale, kSdpaBackward);
        const Tensor q = to_tensor(query, kSdpaBackward, "query");
        const Tensor k = to_tensor(key, kSdpaBackward, "key");
        const Tensor v = to_tensor(value, kSdpaBackward, "value");
        const Tensor g = to_tensor(grad_out, kSdpaBackward, "grad_out");
        const Shape batch = attention_check(q, k, v, o, kSdpaBackward);
        const Shape want = out_shape(batch, q, v);
        if (g.shape() != want) {
          throw py::value_error(std::string("[") + kSdpaBackward + "] grad_out " + str(g.shape()) +
                                " must have the shape of the output " + str(want) + " (query " + str(q.shape()) +
                                ", key " + str(k.shape()) + ", value " + str(v.shape()) + ")");
        }
        AttentionGrads grads;
        {
          py::gil_scoped_release nogil;
          grads = qkv::attention_backward(q, k, v, Tensor(), Tensor(), g, o);
        }
        return py::make_tuple(to_numpy(grads.dq), to_numpy(grads.dk), to_numpy(grads.dv));
      },
      py::arg("query"), py::arg("key"), py::arg("value"), py::arg("grad_out"), py::arg("attn_mask") = py::none(),
      py::arg("is_causal") = false, py::arg("scale") = py::none(),
      R"doc(Gradients of scaled_dot_product_attention: (grad_query, grad_key, grad_value).

query (..., Tq, D), key (..., Tk, D), value (..., Tk, Dv), grad_out (..., Tq, Dv) = dL/d(out) with the broadcast
leading dims -> grad_query, grad_key, grad_value with the shapes of query, key and value (summed over the axes each
was broadcast along, as autograd does). Masks, is_causal and scale as in scaled_dot_product_attention; no gradient
flows to the mask, and a fully masked row contributes 0. The fused kernel recomputes the forward block by block.)doc");
}

}  // namespace qkv::python
