// Entry point of the _qkv extension: each area registers its bindings from its own file.
#include <omp.h>
#include <pybind11/pybind11.h>

#include "bindings.h"
#include "qkv/kernels/attention_flash.h"
#include "qkv/kernels/cpu.h"
#include "qkv/kernels/lowp.h"
#include "qkv/kernels/sgemm.h"

namespace py = pybind11;

namespace qkv::python {
void bind_varlen(py::module_& m);  // flash_attn_varlen_func[_backward], flash_attn_with_kvcache (python/src/varlen.cpp)
void bind_gguf(py::module_& m);  // gguf_read, gguf_dequantize (python/src/gguf.cpp)
void bind_chat_template(py::module_& m);  // ChatTemplate, find_chat_template (python/src/chat_template.cpp)
void bind_tokenizer(py::module_& m);  // Tokenizer.from_pretrained, DecodeStream (python/src/tokenizer.cpp)
void bind_viz(py::module_& m);  // _viz_page_data: the viewer's page data, for qkv.viz (python/src/viz.cpp)
}  // namespace qkv::python

PYBIND11_MODULE(_qkv, m) {
  m.doc() = "qkv: attention from Seq2Seq to self-attention (C++ core)";
  m.attr("__version__") = "0.1.0";
  qkv::python::register_errors(m);
  m.def(
      "set_num_threads",
      [](const py::object& n) {
        if (!py::isinstance<py::int_>(n) || py::isinstance<py::bool_>(n)) {
          throw py::type_error("set_num_threads: n must be an int, got " +
                               std::string(py::str(py::type::of(n).attr("__name__"))));
        }
        const long long v = n.cast<long long>();
        if (v < 1 || v > 4096) {
          throw py::value_error("[set_num_threads] n must be in [1, 4096], got " + std::to_string(v));
        }
        omp_set_num_threads(static_cast<int>(v));
      },
      py::arg("n"),
      "Threads of qkv's parallel kernels for calls from this thread (like torch.set_num_threads); the default "
      "is OMP_NUM_THREADS or the number of cores.");
  m.def(
      "get_num_threads", [] { return omp_get_max_threads(); },
      "Threads qkv's kernels use for calls from this thread (like torch.get_num_threads).");
  m.def(
      "cpu_info",
      [] {
        py::dict d;
        d["isa"] = qkv::kernels::isa_name(qkv::kernels::active_isa());
        d["attention"] = qkv::kernels::flash_isa_name();
        d["sgemm"] = qkv::kernels::sgemm_backend();
        d["bf16"] = qkv::kernels::lowp_paths().bf16;
        d["int8"] = qkv::kernels::lowp_paths().int8;
        return d;
      },
      "The kernel paths this CPU runs (under the QKV_ISA cap): {'isa', 'attention', 'sgemm', 'bf16', 'int8'}, "
      "each a line as `qkv info` prints it; 'bf16' says why it converts when the CPU has no AVX512-BF16/AMX.");
  qkv::python::bind_attention(m);
  qkv::python::bind_sdpa(m);
  qkv::python::bind_varlen(m);
  qkv::python::bind_mha(m);
  qkv::python::bind_transformer(m);
  qkv::python::bind_rnn(m);
  qkv::python::bind_positional(m);
  qkv::python::bind_bert(m);
  qkv::python::bind_llama(m);
  qkv::python::bind_train(m);
  qkv::python::bind_safetensors(m);
  qkv::python::bind_gguf(m);
  qkv::python::bind_metrics(m);
  qkv::python::bind_chat_template(m);
  qkv::python::bind_tokenizer(m);
  qkv::python::bind_viz(m);
}
