// torch.nn.functional.scaled_dot_product_attention over NumPy arrays, and its backward (the fused kernel's).
// PyTorch's conventions: a bool attn_mask's True takes part, a float mask is added, is_causal is top-left.
#include <pybind11/stl.h>

#include <cmath>
#include <optional>
#include <stdexcept>
#include <string>

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
  o.mask = m.t;  // with is_causal too: a pair must be allowed by both, as torch 2.13 combines them
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

// Runs f (a call of the op), its errors in this function's words: "[op] ..." becomes "[fn] ...", and the op's
// d_out is this function's grad_out.
template <class F>
auto in_our_words(const char* fn, const char* op, F&& f) {
  try {
    return f();
  } catch (const std::invalid_argument& e) {
    std::string m = e.what();
    const std::string prefix = std::string("[") + op + "] ";
    if (m.rfind(prefix, 0) == 0) {
      m = std::string("[") + fn + "] " + m.substr(prefix.size());
      const std::string d_out = std::string("[") + fn + "] d_out ";
      if (m.rfind(d_out, 0) == 0) m = std::string("[") + fn + "] grad_out " + m.substr(d_out.size());
    }
    throw py::value_error(m);
  }
}

}  // namespace

void set_variants(AttentionOptions& o, std::pair<int64_t, int64_t> window_size, double softcap, const char* fn) {
  if (window_size.first < -1 || window_size.second < -1) {
    throw py::value_error(std::string("[") + fn + "] window_size (" + std::to_string(window_size.first) + ", " +
                          std::to_string(window_size.second) + ") must be >= -1 on each side (-1 = unbounded)");
  }
  o.window_left = window_size.first;
  o.window_right = window_size.second;
  if (!(std::isfinite(softcap) && softcap >= 0.0 && softcap <= 3.0e38)) {
    throw py::value_error(std::string("[") + fn + "] softcap must be a finite float >= 0 (0 = off), got " +
                          std::to_string(softcap));
  }
  o.softcap = static_cast<float>(softcap);
}

namespace {

// The private kernels behind qkv.torch: strided float32 inputs read in place (numpy views of torch tensors), results
// handed back without a copy. A bool mask keeps (SDPA), a floating one is added; is_causal is top-left and combines
// with the mask (both must allow a pair), as torch 2.13 does.
AttentionOptions strided_options(const py::object& attn_mask, bool is_causal, std::optional<double> scale,
                                 bool enable_gqa, std::pair<int64_t, int64_t> window_size, double softcap,
                                 const char* fn) {
  AttentionOptions o = sdpa_options(py::none(), is_causal, scale, fn);
  o.enable_gqa = enable_gqa;
  set_variants(o, window_size, softcap, fn);
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
         bool is_causal, std::optional<double> scale, bool enable_gqa, std::pair<int64_t, int64_t> window_size,
         double softcap) {
        AttentionOptions o = strided_options(attn_mask, is_causal, scale, enable_gqa, window_size, softcap, kFwd);
        o.return_lse = true;
        const Tensor q = to_tensor_strided(query, kFwd, "query");
        const Tensor k = to_tensor_strided(key, kFwd, "key");
        const Tensor v = to_tensor_strided(value, kFwd, "value");
        const AttentionResult r = in_our_words(kFwd, "attention", [&] {
          py::gil_scoped_release nogil;
          return qkv::attention_fused(q, k, v, o);
        });
        return py::make_tuple(to_numpy_shared(r.out), to_numpy_shared(r.lse));
      },
      py::arg("query"), py::arg("key"), py::arg("value"), py::arg("attn_mask"), py::arg("is_causal"),
      py::arg("scale"), py::arg("enable_gqa") = false, py::arg("window_size") = std::pair<int64_t, int64_t>{-1, -1},
      py::arg("softcap") = 0.0,
      "qkv.torch's forward: (out (..., Tq, Dv), lse (..., Tq)) of the fused kernel; strided float32 inputs are read "
      "in place and the results are not copied.");
  m.def(
      kBwd,
      [](const py::object& grad_out, const py::object& query, const py::object& key, const py::object& value,
         const py::object& out, const py::object& lse, const py::object& attn_mask, bool is_causal,
         std::optional<double> scale, bool enable_gqa, std::pair<int64_t, int64_t> window_size, double softcap) {
        const AttentionOptions o =
            strided_options(attn_mask, is_causal, scale, enable_gqa, window_size, softcap, kBwd);
        const Tensor g = to_tensor_strided(grad_out, kBwd, "grad_out");
        const Tensor q = to_tensor_strided(query, kBwd, "query");
        const Tensor k = to_tensor_strided(key, kBwd, "key");
        const Tensor v = to_tensor_strided(value, kBwd, "value");
        const Tensor o_ = to_tensor_strided(out, kBwd, "out");
        const Tensor l = to_tensor_strided(lse, kBwd, "lse");
        const AttentionGrads grads = in_our_words(kBwd, "attention_backward", [&] {
          py::gil_scoped_release nogil;
          return qkv::attention_backward(q, k, v, o_, l, g, o);
        });
        return py::make_tuple(to_numpy_shared(grads.dq), to_numpy_shared(grads.dk), to_numpy_shared(grads.dv));
      },
      py::arg("grad_out"), py::arg("query"), py::arg("key"), py::arg("value"), py::arg("out"), py::arg("lse"),
      py::arg("attn_mask"), py::arg("is_causal"), py::arg("scale"), py::arg("enable_gqa") = false,
      py::arg("window_size") = std::pair<int64_t, int64_t>{-1, -1}, py::arg("softcap") = 0.0,
      "qkv.torch's backward: (grad_query, grad_key, grad_value) from the forward's out and lse through the fused "
      "kernel, summed over broadcast axes; strided inputs are read in place.");
}

}  // namespace

void bind_sdpa(py::module_& m) {
  bind_strided(m);
  m.def(
      kSdpa,
      [](const py::object& query, const py::object& key, const py::object& value, const py::object& attn_mask,
         double dropout_p, bool is_causal, std::optional<double> scale, bool enable_gqa,
         std::pair<int64_t, int64_t> window_size, double softcap, const std::string& precision) {
        AttentionOptions o = sdpa_options(attn_mask, is_causal, scale, kSdpa);
        set_variants(o, window_size, softcap, kSdpa);
        o.precision = parse_precision(precision);
        o.enable_gqa = enable_gqa;  // K and V read per group in place, never copied
        o.allow_empty = true;       // torch's rule: Tq == 0 gives an empty output, Tk == 0 zeros
        o.dropout_p = static_cast<float>(dropout_p);
        o.dropout_rng = &process_rng();
        const Tensor q = to_tensor(query, kSdpa, "query");
        const Tensor k = key.is(query) ? q : to_tensor(key, kSdpa, "key");
        const Tensor v = value.is(key) ? k : to_tensor(value, kSdpa, "value");
        const Tensor out = in_our_words(kSdpa, "attention", [&] {
          if (o.dropout_p > 0.0f) return qkv::attention(q, k, v, o).out;  // draws from qkv.manual_seed's generator:
          py::gil_scoped_release nogil;                                    // the GIL stays held
          return qkv::attention(q, k, v, o).out;
        });
        return to_numpy_shared(out);
      },
      py::arg("query"), py::arg("key"), py::arg("value"), py::arg("attn_mask") = py::none(),
      py::arg("dropout_p") = 0.0, py::arg("is_causal") = false, py::arg("scale") = py::none(),
      py::arg("enable_gqa") = false, py::arg("window_size") = std::pair<int64_t, int64_t>{-1, -1},
      py::arg("softcap") = 0.0, py::arg("precision") = "fp32",
      R"doc(torch.nn.functional.scaled_dot_product_attention on NumPy arrays (float32 compute).

query (..., Hq, Tq, D), key (..., Hk, Tk, D), value (..., Hk, Tk, Dv) -> out (..., Hq, Tq, Dv); typically
(B, H, T, D). Leading dims broadcast together. attn_mask broadcasts to (..., Tq, Tk): a bool mask's True means the
pair takes part, a float mask is added to the scaled scores (-inf blocks). is_causal applies PyTorch's top-left
causal mask (query i sees keys j <= i); with attn_mask too, a pair must be allowed by both, as torch 2.13 does.
scale defaults to 1/sqrt(D). enable_gqa: Hq a multiple of Hk, query head h reads key head h // (Hq/Hk) (K/V are
read once per group in place, never copied). window_size=(left, right), -1 = unbounded, as FlashAttention-2: query
i sees key j iff i + Tk - Tq - left <= j <= i + Tk - Tq + right (a model config's sliding_window = W is
(W - 1, 0)); it combines with is_causal and attn_mask. softcap c > 0: scores become c·tanh(scores / c) before the
mask. dropout_p > 0 drops attention weights as torch does (inverted scaling), on
the reference path, with draws from the generator qkv.manual_seed reseeds. Empty sequences as torch: Tq == 0 gives
an empty output, Tk == 0 gives zeros. A query row with every key masked gives 0 (as PyTorch 2.5+'s math backend;
never NaN). Runs the fused FlashAttention-style kernel with the GIL released. precision="bf16" rounds query, key
and value to bfloat16 (round to nearest even) and keeps scores, softmax and accumulation in float32 (see
docs/PRECISION.md); "fp32" (the default) is the float32 path; "int8" raises ValueError (linear layers only).)doc");

  m.def(
      kSdpaBackward,
      [](const py::object& query, const py::object& key, const py::object& value, const py::object& grad_out,
         const py::object& attn_mask, bool is_causal, std::optional<double> scale, bool enable_gqa,
         std::pair<int64_t, int64_t> window_size, double softcap, const std::string& precision) {
        AttentionOptions o = sdpa_options(attn_mask, is_causal, scale, kSdpaBackward);
        set_variants(o, window_size, softcap, kSdpaBackward);
        o.precision = parse_precision(precision);
        o.enable_gqa = enable_gqa;
        o.allow_empty = true;
        const Tensor q = to_tensor(query, kSdpaBackward, "query");
        const Tensor k = to_tensor(key, kSdpaBackward, "key");
        const Tensor v = to_tensor(value, kSdpaBackward, "value");
        const Tensor g = to_tensor(grad_out, kSdpaBackward, "grad_out");
        const Shape q_shape = q.shape(), k_shape = k.shape(), v_shape = v.shape();
        const AttentionGrads grads = in_our_words(kSdpaBackward, "attention_backward", [&] {
          py::gil_scoped_release nogil;
          return qkv::attention_backward(q, k, v, Tensor(), Tensor(), g, o);
        });
        return py::make_tuple(to_numpy_shared(grads.dq.reshape(q_shape)),
                              to_numpy_shared(grads.dk.reshape(k_shape)),
                              to_numpy_shared(grads.dv.reshape(v_shape)));
      },
      py::arg("query"), py::arg("key"), py::arg("value"), py::arg("grad_out"), py::arg("attn_mask") = py::none(),
      py::arg("is_causal") = false, py::arg("scale") = py::none(), py::arg("enable_gqa") = false,
      py::arg("window_size") = std::pair<int64_t, int64_t>{-1, -1}, py::arg("softcap") = 0.0,
      py::arg("precision") = "fp32",
      R"doc(Gradients of scaled_dot_product_attention: (grad_query, grad_key, grad_value).

query (..., Tq, D), key (..., Tk, D), value (..., Tk, Dv), grad_out (..., Tq, Dv) = dL/d(out) with the broadcast
leading dims -> grad_query, grad_key, grad_value with the shapes of query, key and value (summed over the axes each
was broadcast along, as autograd does). Masks, is_causal, scale, window_size and softcap as in scaled_dot_product_attention; no gradient
flows to the mask, and a fully masked row contributes 0. enable_gqa as in the forward: grad_key and grad_value are
summed over each group of query heads. Empty sequences give zero gradients. The fused kernel recomputes the forward
block by block. precision="bf16" is the backward of the bf16 forward: query, key, value and grad_out rounded to
bfloat16, and the probabilities P and dS rounded to bfloat16 before the products that form the gradients (scores,
softmax, LSE and every accumulation in float32), as a bf16 FlashAttention backward; "int8" raises ValueError.)doc");
}

}  // namespace qkv::python
