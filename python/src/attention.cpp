// Bindings of qkv's own attention API: qkv.attention(query, key, value, *, mask, mask_kind, causal, scale, ...).
#include <pybind11/stl.h>

#include <optional>

#include "bindings.h"
#include "qkv/ops/attention.h"

namespace qkv::python {

namespace {

// mask_kind None: a floating mask is additive; any other dtype (bool, ints) needs an explicit kind, since a bool
// means "keep" in SDPA and "block" in nn.MultiheadAttention.
MaskKind parse_mask_kind(const py::object& kind, const py::object& mask, bool has_mask) {
  if (!has_mask) return MaskKind::kNone;
  if (kind.is_none()) {
    const py::array a = py::reinterpret_borrow<py::array>(mask);  // to_array's result
    if (a.dtype().kind() == 'f') return MaskKind::kAdditive;
    const std::string dtype = py::str(a.dtype());
    throw std::invalid_argument("[attention] mask of dtype " + dtype +
                                " needs mask_kind='keep' (True takes part) or 'block' (True is blocked); only a "
                                "floating mask defaults to 'additive'");
  }
  if (!py::isinstance<py::str>(kind)) {
    throw py::type_error("attention: mask_kind must be None or a str, got " +
                         std::string(py::str(py::type::of(kind).attr("__name__"))));
  }
  const std::string s = py::str(kind);
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
      [](py::object q, py::object k, py::object v, py::object mask, const py::object& mask_kind,
         py::object causal, std::optional<float> scale, bool return_weights, bool return_lse) -> py::object {
        AttentionOptions o;
        if (!mask.is_none()) mask = to_array(mask, "attention", "mask");
        o.mask = to_tensor_or_none(mask, "attention", "mask");
        o.mask_kind = parse_mask_kind(mask_kind, mask, o.mask.defined());
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
      py::arg("mask_kind") = py::none(), py::arg("causal") = py::none(), py::arg("scale") = py::none(),
      py::arg("return_weights") = false, py::arg("return_lse") = false,
      R"doc(Scaled dot-product attention: softmax(query·keyᵀ·scale + mask)·value.

query (..., Tq, Dk), key (..., Tk, Dk), value (..., Tk, Dv) -> out (..., Tq, Dv).
mask broadcasts to (..., Tq, Tk); mask_kind 'keep' (True takes part), 'block' (True is blocked)
or 'additive' (added to the scores). mask_kind None reads a floating mask as additive; a bool or integer mask needs
an explicit kind. causal: None, 'top_left' or 'bottom_right'.
Returns out, or a tuple (out[, weights (..., Tq, Tk)][, lse (..., Tq)]).)doc");
}

}  // namespace qkv::python
