// Bindings of the Llama-style decoders: qkv.CausalLM.from_pretrained(dir) with .logits(ids) and .generate(...).
// Thin: argument conversion only; the work happens in qkv::models / qkv::decode with the GIL released.
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "bindings.h"
#include "qkv/decode/sampling.h"
#include "qkv/models/llama.h"

namespace qkv::python {

namespace {

using models::LlamaForCausalLM;

// ids: a 1-D (T) or 2-D (B, T) array of integers -> Ids (B, T), and whether it was 1-D. Unsigned ids past int64
// are refused by their value (never wrapped to a negative id).
Ids to_ids(const py::handle& obj, const char* fn, bool& one_d) {
  const py::array a = to_array(obj, fn, "ids");
  if (a.dtype().kind() != 'i' && a.dtype().kind() != 'u')
    throw py::type_error(std::string(fn) + ": ids must hold integers, got dtype " +
                         std::string(py::str(a.dtype())));
  if (a.ndim() != 1 && a.ndim() != 2)
    throw py::value_error(std::string("[") + fn + "] ids must be (T) or (B, T), got " + std::to_string(a.ndim()) +
                          " dimensions");
  if (a.dtype().kind() == 'u') {
    const py::array_t<uint64_t, py::array::c_style | py::array::forcecast> u(a);
    for (py::ssize_t i = 0; i < u.size(); ++i)
      if (u.data()[i] > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        throw py::value_error(std::string("[") + fn + "] id " + std::to_string(u.data()[i]) + " at " +
                              std::to_string(i) + " is outside [0, vocab_size): past int64 even");
  }
  const py::array_t<int64_t, py::array::c_style | py::array::forcecast> c(a);
  one_d = a.ndim() == 1;
  Ids ids;
  ids.shape = one_d ? Shape{1, static_cast<int64_t>(c.shape(0))}
                    : Shape{static_cast<int64_t>(c.shape(0)), static_cast<int64_t>(c.shape(1))};
  ids.data.assign(c.data(), c.data() + c.size());
  return ids;
}

}  // namespace

void bind_llama(py::module_& m) {
  py::class_<LlamaForCausalLM>(m, "CausalLM",
                               "A Llama / Mistral / Gemma 2 causal language model folder (transformers' "
                               "save_pretrained: config.json + model.safetensors) run by qkv.")
      .def_static(
          "from_pretrained",
          [](const py::object& path_obj, const std::string& precision) {
            const std::string path = fs_path(path_obj);
            const Precision p = parse_precision(precision);
            try {
              py::gil_scoped_release nogil;
              return LlamaForCausalLM::from_pretrained(path, p);
            } catch (const std::runtime_error& e) {
              throw py::value_error(e.what());
            }
          },
          py::arg("path"), py::arg("precision") = "fp32",
          "Loads config.json and model.safetensors (or the shards of model.safetensors.index.json) from the folder "
          "`path` (str or os.PathLike); a missing or broken folder raises ValueError. precision: 'fp32' (default), 'bf16' or "
          "'int8' for the linear layers (bf16 also for attention); the weights are converted once, here "
          "(docs/PRECISION.md).")
      .def(
          "logits",
          [](const LlamaForCausalLM& model, const py::object& ids_obj) {
            bool one_d = false;
            const Ids ids = to_ids(ids_obj, "CausalLM.logits", one_d);
            Tensor out;
            {
              py::gil_scoped_release nogil;
              out = model.logits(ids);
            }
            return to_numpy(one_d ? out.select(0, 0) : out);
          },
          py::arg("ids"), "ids: int (T) or (B, T) -> float32 logits (T, V) or (B, T, V).")
      .def(
          "generate",
          [](const LlamaForCausalLM& model, const py::object& ids_obj, int64_t max_new_tokens, float temperature,
             int64_t top_k, float top_p, uint64_t seed, std::optional<int64_t> eos_token_id, int64_t page_size) {
            bool one_d = false;
            const Ids ids = to_ids(ids_obj, "CausalLM.generate", one_d);
            if (!one_d && ids.shape[0] != 1)
              throw py::value_error("[CausalLM.generate] ids must be one prompt (T) or (1, T)");
            decode::SamplingOptions o;
            o.temperature = temperature;
            o.top_k = top_k;
            o.top_p = top_p;
            o.seed = seed;
            std::vector<int64_t> out;
            {
              py::gil_scoped_release nogil;
              out = decode::generate(model, ids.data, max_new_tokens, o, eos_token_id.value_or(-1), page_size);
            }
            py::array_t<int64_t> r(static_cast<py::ssize_t>(out.size()));
            std::copy(out.begin(), out.end(), r.mutable_data());
            return r;
          },
          py::arg("ids"), py::arg("max_new_tokens"), py::arg("temperature") = 0.0f, py::arg("top_k") = 0,
          py::arg("top_p") = 1.0f, py::arg("seed") = 0, py::arg("eos_token_id") = py::none(),
          py::arg("page_size") = 0,
          "ids: one prompt, int (T) -> int64 (N) new tokens, N <= max_new_tokens, through the KV cache. Greedy "
          "when temperature is 0, else sampled (top_k, top_p, seeded: the same seed gives the same tokens). Stops "
          "after eos_token_id when given. page_size > 0: a paged KV cache of that many positions a page, read in "
          "place by the attention.")
      .def_property_readonly("vocab_size", [](const LlamaForCausalLM& m) { return m.config().vocab_size; })
      .def_property_readonly("num_layers", [](const LlamaForCausalLM& m) { return m.config().num_hidden_layers; })
      .def_property_readonly("model_type", [](const LlamaForCausalLM& m) { return m.config().model_type; });
}

}  // namespace qkv::python
