// The model-call conventions every model binding shares: ids arguments ((T) or (B, T) integers) and HF-style
// outputs (a types.SimpleNamespace whose per-layer lists are tuples of float32 arrays, None when not asked).
#include <pybind11/stl.h>

#include <limits>
#include <string>

#include "bindings.h"

namespace qkv::python {

Ids to_ids(const py::handle& obj, const char* fn, bool& one_d, const char* arg) {
  const py::array a = to_array(obj, fn, arg);
  if (a.dtype().kind() != 'i' && a.dtype().kind() != 'u')
    throw py::type_error(std::string(fn) + ": " + arg + " must hold integers, got dtype " +
                         std::string(py::str(a.dtype())));
  if (a.ndim() != 1 && a.ndim() != 2)
    throw py::value_error(std::string("[") + fn + "] " + arg + " must be (T) or (B, T), got " +
                          std::to_string(a.ndim()) + " dimensions");
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

py::object namespace_of(const py::dict& d) { return py::module_::import("types").attr("SimpleNamespace")(**d); }

models::ForwardOptions forward_options(const char* fn, bool output_attentions, bool output_hidden_states,
                                       const py::object& attention_layers) {
  models::ForwardOptions o;
  o.output_attentions = output_attentions;
  o.output_hidden_states = output_hidden_states;
  if (!attention_layers.is_none()) {
    if (!output_attentions)
      throw py::value_error(std::string("[") + fn + "] attention_layers goes with output_attentions=True");
    o.attention_layers = py::cast<std::vector<int64_t>>(attention_layers);
  }
  return o;
}

py::object output_array(const Tensor& t, bool one_d) {
  if (!t.defined()) return py::none();
  return to_numpy(one_d ? t.select(0, 0) : t);
}

py::object output_tuple(const std::vector<Tensor>& v, bool asked, bool one_d) {
  if (!asked) return py::none();
  py::tuple r(v.size());
  for (size_t i = 0; i < v.size(); ++i) r[i] = output_array(v[i], one_d);
  return r;
}

}  // namespace qkv::python
