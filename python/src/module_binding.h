// The methods every bound qkv::nn module shares with torch.nn.Module: load_state_dict / state_dict with PyTorch's
// names, train() / eval() / training. A Bound<M> owns the module (it never moves) and a lock for its parameters.
#pragma once

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
};

// "[load_state_dict] missing: x" -> "[MultiheadAttention.load_state_dict] missing: x".
inline std::string rename_op(const std::string& msg, const std::string& op) {
  if (!msg.empty() && msg[0] == '[') {
    const size_t close = msg.find(']');
    if (close != std::string::npos) return "[" + op + "]" + msg.substr(close + 1);
  }
  return "[" + op + "] " + msg;
}

template <class W>
void def_module_methods(py::class_<W>& cls, const std::string& name) {
  cls.def(
      "load_state_dict",
      [name](W& self, const py::object& state_dict, bool strict) {
        const std::string fn = name + ".load_state_dict";
        const nn::StateDict d = to_state_dict(state_dict, fn.c_str());
        try {
          locked_nogil(self.mu, [&] {
            self.m->load_state_dict(d, strict);
            return 0;
          });
        } catch (const std::invalid_argument& e) {
          throw py::value_error(rename_op(e.what(), fn));
        }
      },
      py::arg("state_dict"), py::arg("strict") = true,
      ("Copies parameters in from {name: ndarray} with PyTorch's names and shapes (any real dtype; converted to "
       "float32). Raises ValueError naming every missing and unexpected key (unless strict=False) and any "
       "misshapen entry; on error nothing is changed."));
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
  cls.def_property_readonly("batch_first", [](W&) { return true; });
}

// Modules are batch-first only.
inline void require_batch_first(bool batch_first, const char* fn) {
  if (!batch_first) {
    throw py::value_error(std::string("[") + fn + "] only batch_first=True is supported: inputs are (B, T, E)");
  }
}

}  // namespace qkv::python
