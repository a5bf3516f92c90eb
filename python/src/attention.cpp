// Bindings of qkv's own attention API: qkv.attention(query, key, value, *, mask, mask_kind, causal, scale, ...).
#include <pybind11/stl.h>

#include <optional>

#include "bindings.h"
#include "qkv/ops/attention.h"

namespace qkv::python {

namespace {

MaskKind parse_mask_kind(const std::string& s, bool has_mask) {
  if (!has_mask) return MaskKind::kNone;
  if (s == "keep") return MaskKind::kKeep;
  if (s == "block") return MaskKind::kBlock;
  if (s == "additive") return MaskKind::kAdditive;
  throw std::invalid_argument("attention: mask_kind must be 'keep', 'block' or 'additive', got '" + s + "'");
}

Causal parse_causal(const py::object& c) {
  if (c.is_none()) return Causal::kNone;
  const std::string s = py::str(c);
  if (s == "top_left") return Causal::kTopLeft;
  if (s == "bottom_right") return Causal::kBottomRight;
  throw std::invalid_argument("attention: causal must be None, 'top_left' or 'bottom_right', got '" + s + "'");
}

}  // namespace

void bind_attention(py::module_& m) {
  m.def(
      "attention",
      [](py::object q, py::object k, py::object v, py::object mask, const std::string& mask_kind,
         py::object causal, std::optional<float> scale, bool return_weights, bool return_lse) -> py::object {
        AttentionOptions o;
        o.mask = to_tensor_or_none(mask, "attention", "mask");
        o.mask_kind = parse_mask_kind(mask_kind, o.mask.defined());
        o.causal = parse_causal(causal);
        o.scale = scale;
        o.return_weights = return_weights;
        o.return_lse = return_lse;
        const Tensor tq = to_tensor(q, "attention", "query");
        const Tensor tk = to_tensor(k, "attention", "key");
        const Tensor tv = to_tensor(v, "attention", "value");
        AttentionResult r;
        {
          py::gil_scoped_release nogil;
          r = qkv::attention(tq, tk, tv, o);
        }
        if (!return_weights && !return_lse) return to_numpy(r.out);
        py::list out;
        out.append(to_numpy(r.out));
        if (return_weights) out.append(to_numpy(r.weights));
        if (return_lse) out.append(to_numpy(r.lse));
        return py::tuple(out);
      },
      py::arg("query"), py::arg("key"), py::arg("value"), py::kw_only(), py::arg("mask") = py::none(),
      py::arg("mask_kind") = "keep", py::arg("causal") = py::none(), py::arg("scale") = py::none(),
      py::arg("return_weights") = false, py::arg("return_lse") = false,
      R"doc(Scaled dot-product attention: softmax(query·keyᵀ·scale + mask)·value.

query (..., Tq, Dk), key (..., Tk, Dk), value (..., Tk, Dv) -> out (..., Tq, Dv).
mask broadcasts to (..., Tq, Tk); mask_kind 'keep' (True takes part), 'block' (True is blocked)
or 'additive' (added to the scores). causal: None, 'top_left' or 'bottom_right'.
Returns out, or a tuple (out[, weights (..., Tq, Tk)][, lse (..., Tq)]).)doc");
}

}  // namespace qkv::python
