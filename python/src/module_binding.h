// The methods every bound qkv::nn module shares with torch.nn.Module: load_state_dict / state_dict with PyTorch's
// names, train() / eval() / training. A Bound<M> owns the module (it never moves) and a lock for its parameters.
#pragma once

#include <algorithm>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "bindings.h"
#include "qkv/nn/module.h"

namespace qkv::python {

template <class M>
struct Bound {
  std::unique_ptr<M> m;
  std::mutex mu;  // taken only through locked_nogil: forward, load_state_dict, state_dict
  bool batch_first = false;  // inputs (B, T, E) when true, (T, B, E) when false (PyTorch's default)
};

// "[load_state_dict] missing: x" -> "[MultiheadAttention.load_state_dict] missing: x".
inline std::string rename_op(const std::string& msg, const std::string& op) {
  if (!msg.empty() && msg[0] == '[') {
    const size_t close = msg.find(']');
    if (close != std::string::npos) return "[" + op + "]" + msg.substr(close + 1);
  }
  return "[" + op + "] " + msg;
}

// torch's load_state_dict result: a named tuple (missing_keys, unexpected_keys) of lists of names.
inline py::object incompatible_keys(const py::list& missing, const py::list& unexpected) {
  // Leaked on purpose: no decref after finalisation.
  static auto* cls = new py::object(py::module_::import("collections").attr("namedtuple")(
      "IncompatibleKeys", py::make_tuple("missing_keys", "unexpected_keys")));
  return (*cls)(missing, unexpected);
}

template <class W>
void def_module_methods(py::class_<W>& cls, const std::string& name) {
  cls.def(
      "load_state_dict",
      [name](W& self, const py::object& state_dict, bool strict) {
        const std::string fn = name + ".load_state_dict";
        const nn::StateDict d = to_state_dict(state_dict, fn.c_str());
        py::list missing, unexpected;
        try {
          const auto names = locked_nogil(self.mu, [&] {
            self.m->load_state_dict(d, strict);
            std::vector<std::string> out;
            for (auto& [n, p] : self.m->named_parameters()) out.push_back(n);
            return out;
          });
          for (const auto& n : names) {
            if (!d.count(n)) missing.append(n);
          }
          for (const auto& [n, t] : d) {
            if (std::find(names.begin(), names.end(), n) == names.end()) unexpected.append(n);
          }
        } catch (const std::invalid_argument& e) {
          throw py::value_error(rename_op(e.what(), fn));
        }
        return incompatible_keys(missing, unexpected);
      },
      py::arg("state_dict"), py::arg("strict") = true,
      ("Copies parameters in from {name: array} with PyTorch's names and shapes (NumPy arrays or torch tensors, "
       "e.g. a torch module's state_dict(); any real dtype, converted to float32). Returns (missing_keys, "
       "unexpected_keys) as torch does. Raises ValueError naming every missing and unexpected key (unless "
       "strict=False) and any misshapen entry; on error nothing is changed."));
  cls.def(
      "state_dict",
      [](W& self) {
        std::vector<std::pair<std::string, Tensor>> params = locked_nogil(self.mu, [&] {
          std::vector<std::pair<std::string, Tensor>> out;
          for (auto& [n, p] : self.m->named_parameters()) out.emplace_back(n, p->clone());
          return out;
        });
        py::dict d;
        for (const auto& [n, t] : params) d[py::str(n)] = to_numpy(t);
        return d;
      },
      "A copy of the parameters as {name: float32 ndarray}, PyTorch's names, in PyTorch's order.");
  cls.def(
      "train",
      [](py::object self, bool mode) {
        W& w = self.cast<W&>();
        locked_nogil(w.mu, [&] {
          w.m->train(mode);
          return 0;
        });
        return self;
      },
      py::arg("mode") = true, "Training mode (dropout on). Returns self.");
  cls.def(
      "eval",
      [](py::object self) {
        W& w = self.cast<W&>();
        locked_nogil(w.mu, [&] {
          w.m->eval();
          return 0;
        });
        return self;
      },
      "Evaluation mode (dropout off), as torch's module.eval(). Returns self.");
  cls.def_property_readonly("training", [](W& self) { return self.m->training(); });
  cls.def(
      "set_precision",
      [](py::object self, const std::string& precision) {
        const Precision p = parse_precision(precision);
        W& w = self.cast<W&>();
        locked_nogil(w.mu, [&] {
          w.m->set_precision(p);
          return 0;
        });
        return self;
      },
      py::arg("precision"),
      "Compute precision of the linear layers and attention, recursively: 'fp32' (default), 'bf16' or 'int8' "
      "(linear layers; attention stays fp32). Weights are converted once, here. Inference only. Returns self.");
  cls.def_property_readonly("precision", [](W& self) { return std::string(precision_name(self.m->precision())); });
  cls.def_property_readonly("batch_first", [](W& self) { return self.batch_first; });
}

// A (T, B, E) input of a batch_first=False module as the (B, T, E) the C++ modules take (a copy, as the modules
// read contiguous rows), and back. Other ranks pass through to the module's own checks.
inline Tensor to_batch_first(const Tensor& x, bool batch_first) {
  return (batch_first || x.dim() != 3) ? x : x.transpose(0, 1).contiguous();
}
inline Tensor from_batch_first(const Tensor& y, bool batch_first) {
  return (batch_first || y.dim() != 3) ? y : y.transpose(0, 1);
}

}  // namespace qkv::python
