// FlashAttention-2's packed variable-length API over NumPy arrays (flash_attn_varlen_func and its backward) and
// flash_attn_with_kvcache (a paged or contiguous KV cache updated in place).
#include <pybind11/stl.h>

#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "bindings.h"
#include "qkv/ops/attention_varlen.h"

namespace qkv::python {
namespace {

constexpr const char* kVarlen = "flash_attn_varlen_func";
constexpr const char* kVarlenBackward = "flash_attn_varlen_backward";
constexpr const char* kKvcache = "flash_attn_with_kvcache";

// A 1-D or 2-D int32 array (FlashAttention's dtype; any other dtype is refused rather than cast), flattened.
std::vector<int32_t> to_int32(const py::object& obj, const char* fn, const char* arg, int ndim) {
  const py::array a = to_array(obj, fn, arg);
  if (!a.dtype().is(py::dtype::of<int32_t>())) {
    throw py::type_error(std::string("[") + fn + "] " + arg + " must be int32, got " +
                         std::string(py::str(a.dtype())));
  }
  if (a.ndim() != ndim) {
    throw py::value_error(std::string("[") + fn + "] " + arg + " must have " + std::to_string(ndim) +
                          " dims, got " + std::to_string(a.ndim()));
  }
  const py::array_t<int32_t, py::array::c_style | py::array::forcecast> c(a);
  return std::vector<int32_t>(c.data(), c.data() + c.size());
}

// A cache updated in place: the caller's own float32 memory, C-contiguous and writable (never a silent copy).
Tensor cache_tensor(const py::object& obj, const char* fn, const char* arg) {
  const py::array a = to_array(obj, fn, arg);
  if (!a.dtype().is(py::dtype::of<float>()) || !(a.flags() & py::array::c_style) || !a.writeable()) {
    throw py::type_error(std::string("[") + fn + "] " + arg +
                         " must be a writable C-contiguous float32 array (it is updated in place), got dtype " +
                         std::string(py::str(a.dtype())));
  }
  return to_tensor_strided(a, fn, arg);
}

std::vector<int32_t> to_offsets(const py::object& obj, const char* fn, const char* arg) {
  return to_int32(obj, fn, arg, 1);
}

// The options shared by the three calls; their values are checked by the ops (ValueError naming the op).
AttentionOptions varlen_options(std::optional<double> softmax_scale, bool causal,
                                std::pair<int64_t, int64_t> window_size, double softcap) {
  AttentionOptions o;
  o.causal = causal ? Causal::kBottomRight : Causal::kNone;  // FlashAttention >= 2.1 aligns causal bottom-right
  o.window_left = window_size.first;
  o.window_right = window_size.second;
  o.softcap = static_cast<float>(softcap);  // NaN and out-of-range values stay non-finite: refused by the op
  if (softmax_scale) o.scale = static_cast<float>(*softmax_scale);
  return o;
}

}  // namespace

void bind_varlen(py::module_& m) {
  m.def(
      kVarlen,
      [](const py::object& q, const py::object& k, const py::object& v, const py::object& cu_seqlens_q,
         const py::object& cu_seqlens_k, int64_t max_seqlen_q, int64_t max_seqlen_k,
         std::optional<double> softmax_scale, bool causal, std::pair<int64_t, int64_t> window_size, double softcap,
         bool return_lse) -> py::object {
        AttentionOptions o = varlen_options(softmax_scale, causal, window_size, softcap);
        o.return_lse = return_lse;
        const Tensor tq = to_tensor(q, kVarlen, "q"), tk = to_tensor(k, kVarlen, "k"), tv = to_tensor(v, kVarlen, "v");
        const std::vector<int32_t> cq = to_offsets(cu_seqlens_q, kVarlen, "cu_seqlens_q");
        const std::vector<int32_t> ck = to_offsets(cu_seqlens_k, kVarlen, "cu_seqlens_k");
        AttentionResult r;
        {
          py::gil_scoped_release nogil;
          r = qkv::attention_varlen(tq, tk, tv, cq, ck, max_seqlen_q, max_seqlen_k, o);
        }
        if (!return_lse) return to_numpy_shared(r.out);
        return py::make_tuple(to_numpy_shared(r.out), to_numpy_shared(r.lse));
      },
      py::arg("q"), py::arg("k"), py::arg("v"), py::arg("cu_seqlens_q"), py::arg("cu_seqlens_k"),
      py::arg("max_seqlen_q"), py::arg("max_seqlen_k"), py::arg("softmax_scale") = py::none(),
      py::arg("causal") = false, py::arg("window_size") = std::pair<int64_t, int64_t>{-1, -1},
      py::arg("softcap") = 0.0, py::arg("return_lse") = false,
      R"doc(FlashAttention-2's flash_attn_varlen_func on NumPy arrays (float32 compute).

q (total_q, Hq, D), k (total_k, Hk, D), v (total_k, Hk, Dv): B sequences packed along dim 0; cu_seqlens_q and
cu_seqlens_k are int32 (B + 1) offsets from 0 to total, each length at most max_seqlen_*. Hq a multiple of Hk (GQA).
causal is bottom-right aligned per sequence (FlashAttention >= 2.1); window_size=(left, right), -1 = unbounded;
softcap c > 0 caps the scores to c·tanh(s / c). No padded position is computed. Returns out (total_q, Hq, Dv), and
with return_lse (out, lse (Hq, total_q)).)doc");

  m.def(
      kVarlenBackward,
      [](const py::object& q, const py::object& k, const py::object& v, const py::object& out,
         const py::object& lse, const py::object& grad_out, const py::object& cu_seqlens_q,
         const py::object& cu_seqlens_k, int64_t max_seqlen_q, int64_t max_seqlen_k,
         std::optional<double> softmax_scale, bool causal, std::pair<int64_t, int64_t> window_size,
         double softcap) {
        const AttentionOptions o = varlen_options(softmax_scale, causal, window_size, softcap);
        const Tensor tq = to_tensor(q, kVarlenBackward, "q"), tk = to_tensor(k, kVarlenBackward, "k");
        const Tensor tv = to_tensor(v, kVarlenBackward, "v"), to = to_tensor(out, kVarlenBackward, "out");
        const Tensor tl = to_tensor(lse, kVarlenBackward, "lse");
        const Tensor tg = to_tensor(grad_out, kVarlenBackward, "grad_out");
        const std::vector<int32_t> cq = to_offsets(cu_seqlens_q, kVarlenBackward, "cu_seqlens_q");
        const std::vector<int32_t> ck = to_offsets(cu_seqlens_k, kVarlenBackward, "cu_seqlens_k");
        AttentionGrads g;
        {
          py::gil_scoped_release nogil;
          g = qkv::attention_varlen_backward(tq, tk, tv, to, tl, tg, cq, ck, max_seqlen_q, max_seqlen_k, o);
        }
        return py::make_tuple(to_numpy_shared(g.dq), to_numpy_shared(g.dk), to_numpy_shared(g.dv));
      },
      py::arg("q"), py::arg("k"), py::arg("v"), py::arg("out"), py::arg("lse"), py::arg("grad_out"),
      py::arg("cu_seqlens_q"), py::arg("cu_seqlens_k"), py::arg("max_seqlen_q"), py::arg("max_seqlen_k"),
      py::arg("softmax_scale") = py::none(), py::arg("causal") = false,
      py::arg("window_size") = std::pair<int64_t, int64_t>{-1, -1}, py::arg("softcap") = 0.0,
      R"doc(Gradients of flash_attn_varlen_func: (dq, dk, dv) with the shapes of q, k, v, from its out and lse
(return_lse=True) and grad_out (total_q, Hq, Dv); dk and dv are summed over each GQA group.)doc");

  m.def(
      kKvcache,
      [](const py::object& q, const py::object& k_cache, const py::object& v_cache, const py::object& k,
         const py::object& v, const py::object& cache_seqlens, const py::object& block_table,
         std::optional<double> softmax_scale, bool causal, std::pair<int64_t, int64_t> window_size,
         double softcap) {
        const AttentionOptions o = varlen_options(softmax_scale, causal, window_size, softcap);
        const Tensor tq = to_tensor(q, kKvcache, "q");
        Tensor kc = cache_tensor(k_cache, kKvcache, "k_cache"), vc = cache_tensor(v_cache, kKvcache, "v_cache");
        const Tensor tk = to_tensor_or_none(k, kKvcache, "k"), tv = to_tensor_or_none(v, kKvcache, "v");
        std::vector<int32_t> lens;
        if (py::isinstance<py::int_>(cache_seqlens)) {
          lens.assign(static_cast<size_t>(tq.dim() > 0 ? tq.size(0) : 0), cache_seqlens.cast<int32_t>());
        } else if (!cache_seqlens.is_none()) {
          lens = to_int32(cache_seqlens, kKvcache, "cache_seqlens", 1);
        }
        std::vector<int32_t> table;
        int64_t max_blocks = 0;
        if (!block_table.is_none()) {
          table = to_int32(block_table, kKvcache, "block_table", 2);
          max_blocks = to_array(block_table, kKvcache, "block_table").shape(1);
        }
        AttentionResult r;
        {
          py::gil_scoped_release nogil;
          r = qkv::attention_with_kvcache(tq, kc, vc, tk, tv, lens, table, max_blocks, o);
        }
        return to_numpy_shared(r.out);
      },
      py::arg("q"), py::arg("k_cache"), py::arg("v_cache"), py::arg("k") = py::none(), py::arg("v") = py::none(),
      py::arg("cache_seqlens") = py::none(), py::arg("block_table") = py::none(),
      py::arg("softmax_scale") = py::none(), py::arg("causal") = true,
      py::arg("window_size") = std::pair<int64_t, int64_t>{-1, -1}, py::arg("softcap") = 0.0,
      R"doc(FlashAttention's flash_attn_with_kvcache on NumPy arrays (float32; decoding).

q (B, Tq, Hq, D). k_cache, v_cache: writable C-contiguous float32, (num_blocks, block_size, Hk, D) with
block_table (B, max_blocks) int32 (a paged cache), or (B, max_len, Hk, D) with block_table None (contiguous).
cache_seqlens (B) int32 or an int: keys already cached (None: the whole cache). k, v (B, Tnew, Hk, D): appended to
the caches in place at cache_seqlens (cache_seqlens itself is not advanced). causal is bottom-right (the last query
sees every key); window_size and softcap as in flash_attn_varlen_func. Returns out (B, Tq, Hq, Dv).)doc");
}

}  // namespace qkv::python
