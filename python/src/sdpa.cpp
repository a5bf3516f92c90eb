// torch.nn.functional.scaled_dot_product_attention over NumPy arrays, and its backward (the fused kernel's).
// PyTorch's conventions: a bool attn_mask's True takes part, a float mask is added, is_causal is top-left.
#include <pybind11/stl.h>

#include <cmath>
#include <optional>

#include "bindings.h"
#include "qkv/ops/attention.h"
#include "qkv/ops/lowp.h"
#include "qkv/ops/dropout.h"
#include "qkv/ops/matmul.h"

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

Shape out_shape(const Shape& batch, const Tensor& q, const Tensor& v) {
  Shape s = batch;
  s.push_back(q.size(-2));
  s.push_back(v.size(-1));
  return s;
}

Shape leading(const Tensor& t) { return Shape(t.shape().begin(), t.shape().end() - 2); }

// window_size (left, right) and softcap into the options (checked by attention_check, which names `fn`).
void set_variants(AttentionOptions& o, std::pair<int64_t, int64_t> window_size, double softcap, const char* fn) {
  o.window_left = window_size.first;
  o.window_right = window_size.second;
  if (!(std::isfinite(softcap) && softcap >= 0.0 && softcap <= 3.0e38)) {
    throw py::value_error(std::string("[") + fn + "] softcap must be a finite float >= 0 (0 = off), got " +
                          std::to_string(softcap));
  }
  o.softcap = static_cast<float>(softcap);
}

// enable_gqa, checked with torch's words. native (the fused and reference kernels): sets o.enable_gqa, K and V
// are read per group in place; returns false. Otherwise (empty sequences) views: q (..., Hk*G, Tq, D) ->
// (..., Hk, G, Tq, D); k, v (..., Hk, Tk, D) -> (..., Hk, 1, Tk, D); a mask with a head axis of Hq likewise, and
// returns true. False when the heads are equal.
bool gqa_views(Tensor& q, Tensor& k, Tensor& v, AttentionOptions& o, const char* fn, bool native = false) {
  if (q.dim() < 3 || k.dim() < 3 || v.dim() < 3) {
    throw py::value_error(std::string("[") + fn + "] enable_gqa needs a head axis (dim -3) in query " +
                          str(q.shape()) + ", key " + str(k.shape()) + " and value " + str(v.shape()));
  }
  const int64_t hq = q.size(-3), hk = k.size(-3);
  if (hq == hk && v.size(-3) == hk) return false;
  if (hk == 0 || v.size(-3) != hk || hq % hk != 0) {
    throw py::value_error(std::string("[") + fn + "] enable_gqa: query heads (dim -3 of " + str(q.shape()) +
                          ") must be a multiple of key heads (" + str(k.shape()) + "), and value " +
                          str(v.shape()) + " must have the key's heads");
  }
  if (o.mask.defined() && o.mask.dim() >= 3 && o.mask.size(-3) != hq && o.mask.size(-3) != 1) {
    throw py::value_error(std::string("[") + fn + "] enable_gqa: attn_mask " + str(o.mask.shape()) +
                          " must have 1 or " + std::to_string(hq) + " heads (dim -3), as query " + str(q.shape()));
  }
  if (native) {
    o.enable_gqa = true;
    return false;
  }
  const int64_t g = hq / hk;
  auto split = [&](const Tensor& t) {
    Shape s(t.shape().begin(), t.shape().end() - 3);
    s.push_back(hk);
    s.push_back(g);
    s.push_back(t.size(-2));
    s.push_back(t.size(-1));
    return t.view(s);
  };
  q = split(q);
  k = k.unsqueeze(-3);
  v = v.unsqueeze(-3);
  if (o.mask.defined() && o.mask.dim() >= 3) {
    if (o.mask.size(-3) == hq && hq != 1) {
      o.mask = split(o.mask.contiguous());
    } else if (o.mask.size(-3) == 1) {
      o.mask = o.mask.unsqueeze(-3);
    } else {
      throw py::value_error(std::string("[") + fn + "] enable_gqa: attn_mask " + str(o.mask.shape()) +
                            " must have 1 or " + std::to_string(hq) + " heads (dim -3), as query " + str(q.shape()));
    }
  }
  return true;
}

// Merges the group axis back: (..., Hk, G, T, D) -> (..., Hk*G, T, D). Rank >= 4 (gqa_views made it so).
Shape merged_heads_shape(const Shape& s) {
  const size_t n = s.size();
  if (n < 4) return s;
  Shape out;
  for (size_t i = 0; i + 4 < n; ++i) out.push_back(s[i]);
  out.push_back(s[n - 4] * s[n - 3]);
  out.push_back(s[n - 2]);
  out.push_back(s[n - 1]);
  return out;
}
Tensor merge_heads(const Tensor& t) { return t.reshape(merged_heads_shape(t.shape())); }

// torch's rules for empty sequences: Tq == 0, a zero batch or Dv == 0 give an empty output; Tk == 0 gives zeros
// (no key to attend to). The other shape rules still apply.
bool is_empty_case(const Tensor& q, const Tensor& k, const Tensor& v) {
  if (q.dim() < 2 || k.dim() < 2 || v.dim() < 2) return false;
  return q.numel() == 0 || k.numel() == 0 || v.numel() == 0;
}

Shape empty_batch(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& o, const char* fn) {
  const std::string shapes = "query " + str(q.shape()) + ", key " + str(k.shape()) + ", value " + str(v.shape());
  if (q.size(-1) != k.size(-1)) {
    throw py::value_error(std::string("[") + fn + "] " + shapes + ": query and key must have the same last dim");
  }
  if (k.size(-2) != v.size(-2)) {
    throw py::value_error(std::string("[") + fn + "] " + shapes + ": key and value must have the same Tk");
  }
  Shape batch;
  try {
    batch = broadcast_shapes(broadcast_shapes(leading(q), leading(k), fn), leading(v), fn);
  } catch (const std::invalid_argument&) {
    throw py::value_error(std::string("[") + fn + "] the leading (batch) dims of " + shapes + " do not broadcast");
  }
  if (o.mask.defined()) {
    Shape full = batch;
    full.push_back(q.size(-2));
    full.push_back(k.size(-2));
    if (!broadcastable_to(o.mask.shape(), full)) {
      throw py::value_error(std::string("[") + fn + "] attn_mask " + str(o.mask.shape()) +
                            " does not broadcast to (batch..., Tq, Tk) = " + str(full) + " of " + shapes);
    }
  }
  return batch;
}

// Reference-path SDPA with torch's dropout semantics: softmax weights, inverted dropout on them, then weights·v.
// The draws come from the generator qkv.manual_seed reseeds, taken with the GIL held; the math runs without it.
// A fully masked row stays 0.
Tensor sdpa_dropout(const Tensor& q, const Tensor& k, const Tensor& v, AttentionOptions o, float p) {
  o.return_weights = true;
  Tensor w;
  {
    py::gil_scoped_release nogil;
    w = qkv::attention_reference(q, k, v, o).weights;
  }
  w = qkv::dropout(w, p, true, process_rng()).y;
  py::gil_scoped_release nogil;
  return qkv::matmul(w, v);
}

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
        attention_check(q, k, v, o, kFwd);
        AttentionResult r;
        {
          py::gil_scoped_release nogil;
          r = qkv::attention_fused(q, k, v, o);
        }
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
        AttentionGrads grads;
        {
          py::gil_scoped_release nogil;
          grads = qkv::attention_backward(q, k, v, o_, l, g, o);
        }
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
        if (!(dropout_p >= 0.0 && dropout_p < 1.0)) {
          throw py::value_error(std::string("[") + kSdpa + "] dropout_p must be in [0, 1), got " +
                                std::to_string(dropout_p));
        }
        AttentionOptions o = sdpa_options(attn_mask, is_causal, scale, kSdpa);
        set_variants(o, window_size, softcap, kSdpa);
        o.precision = parse_precision(precision);
        Tensor q = to_tensor(query, kSdpa, "query");
        Tensor k = key.is(query) ? q : to_tensor(key, kSdpa, "key");
        Tensor v = value.is(key) ? k : to_tensor(value, kSdpa, "value");
        if (is_empty_case(q, k, v)) {
          const bool grouped = enable_gqa && gqa_views(q, k, v, o, kSdpa);
          const Tensor out = Tensor::zeros(out_shape(empty_batch(q, k, v, o, kSdpa), q, v));
          return to_numpy_shared(grouped ? merge_heads(out) : out);
        }
        if (enable_gqa) gqa_views(q, k, v, o, kSdpa, true);  // native: K and V read per group, never copied
        attention_check(q, k, v, o, kSdpa);
        Tensor out;
        if (dropout_p > 0.0) {
          if (o.precision == Precision::kBFloat16) {  // the composed path: round once, then float32
            q = round_to_bf16(q);
            k = round_to_bf16(k);
            v = round_to_bf16(v);
            o.precision = Precision::kFloat32;
          }
          out = sdpa_dropout(q, k, v, o, static_cast<float>(dropout_p));
        } else {
          py::gil_scoped_release nogil;
          out = qkv::attention(q, k, v, o).out;
        }
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
        Tensor q = to_tensor(query, kSdpaBackward, "query");
        Tensor k = to_tensor(key, kSdpaBackward, "key");
        Tensor v = to_tensor(value, kSdpaBackward, "value");
        const Tensor g = to_tensor(grad_out, kSdpaBackward, "grad_out");
        const Shape q_shape = q.shape(), k_shape = k.shape(), v_shape = v.shape();
        const bool empty = is_empty_case(q, k, v);
        const bool grouped = enable_gqa && gqa_views(q, k, v, o, kSdpaBackward, !empty);
        const Shape batch =
            empty ? empty_batch(q, k, v, o, kSdpaBackward) : attention_check(q, k, v, o, kSdpaBackward);
        const Shape inner = out_shape(batch, q, v);  // with the group axis when grouped
        const Shape want = grouped ? merged_heads_shape(inner) : inner;
        if (g.shape() != want) {
          throw py::value_error(std::string("[") + kSdpaBackward + "] grad_out " + str(g.shape()) +
                                " must have the shape of the output " + str(want) + " (query " + str(q_shape) +
                                ", key " + str(k_shape) + ", value " + str(v_shape) + ")");
        }
        if (empty) {
          return py::make_tuple(to_numpy(Tensor::zeros(q_shape)), to_numpy(Tensor::zeros(k_shape)),
                                to_numpy(Tensor::zeros(v_shape)));
        }
        const Tensor gg = grouped ? g.view(inner) : g;
        AttentionGrads grads;
        {
          py::gil_scoped_release nogil;
          grads = qkv::attention_backward(q, k, v, Tensor(), Tensor(), gg, o);
        }
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
