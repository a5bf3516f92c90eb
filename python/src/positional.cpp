// qkv.positional: the positional encodings as functions over NumPy arrays: sinusoidal table, RoPE, ALiBi slopes
// and bias, T5 relative buckets and bias. Each result plugs into qkv.attention (as input or additive mask).
#include <pybind11/stl.h>

#include <optional>
#include <string>
#include <vector>

#include "bindings.h"
#include "qkv/nn/positional.h"

namespace qkv::python {

namespace {

RopeVariant parse_variant(const std::string& s) {
  if (s == "half_split") return RopeVariant::kHalfSplit;
  if (s == "interleaved") return RopeVariant::kInterleaved;
  throw py::value_error("[rope_apply] variant must be 'half_split' (GPT-NeoX, HF rotate_half) or 'interleaved' "
                        "(GPT-J, Meta LLaMA), got '" + s + "'");
}

AlibiMode parse_mode(const std::string& s) {
  if (s == "causal") return AlibiMode::kCausal;
  if (s == "symmetric") return AlibiMode::kSymmetric;
  throw py::value_error("[alibi_bias] mode must be 'causal' or 'symmetric', got '" + s + "'");
}

template <class F>
py::array_t<float> nogil_numpy(F&& f) {
  Tensor t;
  {
    py::gil_scoped_release nogil;
    t = f();
  }
  return to_numpy(t);
}

}  // namespace

void bind_positional(py::module_& parent) {
  py::module_ m = parent.def_submodule("positional", "Positional encodings (sinusoidal, RoPE, ALiBi, T5 buckets).");

  m.def(
      "sinusoidal_table",
      [](int64_t T, int64_t E, int64_t offset, float base) {
        check_sizes("sinusoidal_table", {{"T", T}, {"E", E}}, 0);
        return nogil_numpy([&] { return qkv::sinusoidal_table(T, E, offset, base); });
      },
      py::arg("T"), py::arg("E"), py::arg("offset") = 0, py::arg("base") = 10000.0f,
      R"doc(-> (T, E): PE[t, 2i] = sin(p / base^(2i/E)), PE[t, 2i+1] = cos(p / base^(2i/E)), p = offset + t.
An odd E ends on a sine column. Angles in float64, rounded once to float32.)doc");

  m.def(
      "add_sinusoidal",
      [](const py::object& x, int64_t offset, float base) {
        const Tensor t = to_tensor(x, "add_sinusoidal", "x");
        return nogil_numpy([&] { return qkv::add_sinusoidal(t, offset, base); });
      },
      py::arg("x"), py::arg("offset") = 0, py::arg("base") = 10000.0f,
      "x (..., T, E) -> x + sinusoidal_table(T, E, offset, base).");

  m.def(
      "rope_apply",
      [](const py::object& x, int64_t offset, float base, const std::string& variant,
         std::optional<std::vector<int64_t>> positions) {
        const RopeVariant v = parse_variant(variant);
        const Tensor t = to_tensor(x, "rope_apply", "x");
        if (positions) return nogil_numpy([&] { return qkv::rope_apply(t, *positions, base, v); });
        return nogil_numpy([&] { return qkv::rope_apply(t, offset, base, v); });
      },
      py::arg("x"), py::arg("offset") = 0, py::arg("base") = 10000.0f, py::arg("variant") = "half_split",
      py::arg("positions") = py::none(),
      R"doc(Rotary position embedding. x (..., T, D), D even -> rotated copy (..., T, D); apply to q and k (B, H, T, D).

Row t sits at position offset + t, or positions[t] when positions (T ints >= 0) is given. Each pair (a, b) of
frequency θ_i = base^(-2i/D) is rotated by φ = pos·θ_i: a' = a cos φ - b sin φ, b' = a sin φ + b cos φ.
variant 'half_split' pairs (i, i + D/2) (GPT-NeoX, HF rotate_half); 'interleaved' pairs (2i, 2i+1) (GPT-J, LLaMA).)doc");

  m.def(
      "alibi_slopes",
      [](int64_t num_heads) {
        check_sizes("alibi_slopes", {{"num_heads", num_heads}});
        return nogil_numpy([&] { return qkv::alibi_slopes(num_heads); });
      },
      py::arg("num_heads"),
      "-> (H): 2^(-8(h+1)/H) for H a power of two; the ALiBi paper's interleaving recipe otherwise.");

  m.def(
      "alibi_bias",
      [](int64_t num_heads, int64_t Tq, int64_t Tk, const std::string& mode, int64_t query_offset) {
        const AlibiMode md = parse_mode(mode);
        check_sizes("alibi_bias", {{"num_heads", num_heads}, {"Tq", Tq}, {"Tk", Tk}}, 0);
        return nogil_numpy([&] { return qkv::alibi_bias(num_heads, Tq, Tk, md, query_offset); });
      },
      py::arg("num_heads"), py::arg("Tq"), py::arg("Tk"), py::arg("mode") = "causal", py::arg("query_offset") = 0,
      R"doc(-> (1, H, Tq, Tk) additive bias: -slope_h·(p_i - j) for j <= p_i and -inf after ('causal'), or
-slope_h·|p_i - j| ('symmetric'); p_i = i + query_offset (Tk - Tq against a KV cache). Pass it as
qkv.attention(..., mask=bias, mask_kind='additive') or as a float attn_mask.)doc");

  m.def(
      "t5_relative_bucket",
      [](const py::object& relative_position, bool bidirectional, int64_t num_buckets,
         int64_t max_distance) -> py::object {
        auto bucket = [&](int64_t r) {
          return qkv::t5_relative_bucket(r, bidirectional, num_buckets, max_distance);
        };
        if (py::isinstance<py::int_>(relative_position)) {
          int overflow = 0;
          const long long r = PyLong_AsLongLongAndOverflow(relative_position.ptr(), &overflow);
          if (overflow != 0) throw py::value_error("[t5_relative_bucket] relative_position does not fit in int64");
          return py::int_(bucket(static_cast<int64_t>(r)));
        }
        if (!py::isinstance<py::array>(relative_position) ||
            (py::array(py::reinterpret_borrow<py::array>(relative_position)).dtype().kind() != 'i' &&
             py::array(py::reinterpret_borrow<py::array>(relative_position)).dtype().kind() != 'u')) {
          throw py::type_error("t5_relative_bucket: relative_position must be an int or an integer ndarray");
        }
        auto a = py::array_t<int64_t, py::array::c_style | py::array::forcecast>::ensure(relative_position);
        if (!a) throw py::error_already_set();
        py::array_t<int64_t> out(std::vector<py::ssize_t>(a.shape(), a.shape() + a.ndim()));
        const int64_t* src = a.data();
        int64_t* dst = out.mutable_data();
        for (py::ssize_t i = 0; i < a.size(); ++i) dst[i] = bucket(src[i]);
        return out;
      },
      py::arg("relative_position"), py::arg("bidirectional") = true, py::arg("num_buckets") = 32,
      py::arg("max_distance") = 128,
      R"doc(T5's bucket of relative_position = key_pos - query_pos (an int, or an integer array of any shape), bit for
bit as HF transformers' _relative_position_bucket: exact below num_buckets/2 (/4 bidirectional), logarithmic up to
max_distance. bidirectional puts keys after the query in the upper half of the buckets.)doc");

  m.def(
      "t5_relative_bias",
      [](const py::object& table, int64_t Tq, int64_t Tk, bool bidirectional, int64_t max_distance,
         int64_t query_offset) {
        const Tensor t = to_tensor(table, "t5_relative_bias", "table");
        check_sizes("t5_relative_bias", {{"H", t.dim() == 2 ? t.size(1) : 1}, {"Tq", Tq}, {"Tk", Tk}}, 0);
        return nogil_numpy([&] { return qkv::t5_relative_bias(t, Tq, Tk, bidirectional, max_distance, query_offset); });
      },
      py::arg("table"), py::arg("Tq"), py::arg("Tk"), py::arg("bidirectional") = true, py::arg("max_distance") = 128,
      py::arg("query_offset") = 0,
      R"doc(table (num_buckets, H) -> bias (1, H, Tq, Tk), bias[0, h, i, j] = table[bucket(j - (i + query_offset)), h].
Add it to the scores: qkv.attention(..., mask=bias, mask_kind='additive').)doc");
}

}  // namespace qkv::python
