// qkv.train / qkv.train.Run: the library's training run (train::TextRun) with the options of `qkv train` as
// keyword arguments (config.json's names: model="transformer", task="copy", steps=200, ...), in this process alone.
#include <pybind11/functional.h>
#include <pybind11/stl.h>

#include <atomic>
#include <exception>
#include <map>
#include <memory>
#include <string>

#include "bindings.h"
#include "qkv/train/text_run.h"

namespace qkv::python {
namespace {

// A keyword argument as config.json's text of its value.
std::string setting_text(const std::string& key, const py::handle& v) {
  if (py::isinstance<py::bool_>(v)) return v.cast<bool>() ? "true" : "false";
  if (py::isinstance<py::int_>(v)) return py::str(v).cast<std::string>();
  if (py::isinstance<py::float_>(v)) return py::repr(v).cast<std::string>();
  if (py::isinstance<py::str>(v)) return v.cast<std::string>();
  if (py::hasattr(v, "__fspath__")) return fs_path(v);
  throw py::type_error("[train] " + key + " must be a str, int, float or bool, got " +
                       py::str(py::type::of(v).attr("__name__")).cast<std::string>());
}

std::map<std::string, std::string> settings_of(const py::dict& options) {
  std::map<std::string, std::string> s;
  for (auto item : options) {
    const std::string key = py::str(item.first).cast<std::string>();
    s[key] = setting_text(key, item.second);
  }
  return s;
}

py::dict config_dict(const train::RunConfig& c) {
  py::dict d;
  for (const auto& [k, v] : train::parse_flat_json(c.to_json(), "config.json")) d[py::str(k)] = v;
  return d;
}

py::dict eval_dict(const train::EvalResult& e) {
  py::dict d;
  d["exact_match"] = e.exact_match;
  d["token_accuracy"] = e.token_accuracy;
  d["examples"] = e.examples;
  d["tokens"] = e.tokens;
  return d;
}

// A run, and what its Python callbacks raised (re-raised once the run has stopped with its checkpoint).
struct PyRun {
  std::unique_ptr<train::TextRun> run;
  std::atomic<bool> stop{false};
};

std::unique_ptr<PyRun> open_run(const py::object& out, const py::object& resume, const py::dict& options) {
  QKV_CHECK_ARG(!out.is_none() || !resume.is_none(),
                "[train] out= (a new run directory) or resume= (a run to continue) is required");
  QKV_CHECK_ARG(out.is_none() || resume.is_none() || fs_path(out) == fs_path(resume),
                "[train] out='", fs_path(out.is_none() ? resume : out), "' and resume='",
                fs_path(resume.is_none() ? out : resume), "' name different directories");
  auto r = std::make_unique<PyRun>();
  const std::map<std::string, std::string> settings = settings_of(options);
  if (!resume.is_none()) {
    const std::string dir = fs_path(resume);
    py::gil_scoped_release nogil;
    const train::RunConfig saved = train::load_run_config(dir, "train");
    r->run = train::TextRun::resume(saved.resumed_with(settings, dir), dir);
  } else {
    const std::string dir = fs_path(out);
    py::gil_scoped_release nogil;
    r->run = train::TextRun::start(train::RunConfig().with(settings, "qkv.train"), dir);
  }
  return r;
}

py::dict train_run(PyRun& self, const py::object& on_step, const py::object& on_eval) {
  std::exception_ptr raised;  // the first error of a callback (KeyboardInterrupt included)
  // With the GIL held: a Python callback, and Ctrl-C. A callback that returns True or raises, or a pending signal,
  // stops the run after the current step's checkpoint; what was raised is raised again then.
  auto call = [&](const py::object& fn, const py::dict& arg) {
    if (raised) return;
    try {
      if (PyErr_CheckSignals() != 0) throw py::error_already_set();
      if (!fn.is_none() && fn(arg).equal(py::bool_(true))) self.stop.store(true);
    } catch (...) {
      raised = std::current_exception();
      self.stop.store(true);
    }
  };
  train::TextRunHooks hooks;
  hooks.on_step = [&](const train::RunStep& s) {
    py::gil_scoped_acquire gil;
    py::dict d;
    d["step"] = s.step;
    d["loss"] = s.loss;
    d["lr"] = s.lr;
    d["tokens"] = s.tokens;
    call(on_step, d);
  };
  hooks.on_eval = [&](int64_t step, const train::EvalResult& e) {
    py::gil_scoped_acquire gil;
    py::dict d = eval_dict(e);
    d["step"] = step;
    call(on_eval, d);
  };
  self.stop.store(false);
  train::RunResult r;
  {
    py::gil_scoped_release nogil;
    r = self.run->train(hooks, &self.stop);
  }
  if (raised) std::rethrow_exception(raised);
  py::dict d;
  d["first_step"] = r.first_step;
  d["step"] = r.step;
  d["loss"] = r.last_loss;
  d["early_stopped"] = r.early_stopped;
  d["stopped"] = r.stopped;
  d["checkpoint"] = r.checkpoint.empty() ? py::object(py::none()) : py::object(py::str(r.checkpoint));
  d["tokens"] = r.tokens;
  return d;
}

}  // namespace

void bind_train(py::module_& m) {
  py::class_<PyRun>(m, "TrainRun",
                    "A training run of `qkv train` in a run directory (config.json, vocab.txt, checkpoints/).")
      .def(py::init([](const py::object& out, const py::object& resume, const py::dict& options) {
             return open_run(out, resume, options);
           }),
           py::arg("out"), py::arg("resume"), py::arg("options"))
      .def("train", &train_run, py::arg("on_step") = py::none(), py::arg("on_eval") = py::none())
      .def(
          "evaluate",
          [](PyRun& self, int64_t limit) {
            train::TextRun& r = *self.run;
            const train::DecodeSettings dec{r.config().max_decode_len, 1, 0.6, 64};
            train::EvalResult e;
            {
              py::gil_scoped_release nogil;
              e = train::evaluate(r.model(), r.data().test, limit, dec);
            }
            return eval_dict(e);
          },
          py::arg("limit") = 0)
      .def("stop", [](PyRun& self) { self.stop.store(true); })
      .def_property_readonly("step", [](const PyRun& self) { return self.run->run().state().step; })
      .def_property_readonly("config", [](const PyRun& self) { return config_dict(self.run->config()); })
      .def_property_readonly("dir", [](const PyRun& self) { return self.run->dir(); })
      .def_property_readonly("num_parameters", [](const PyRun& self) { return self.run->num_parameters(); })
      .def_property_readonly("resumed_from", [](const PyRun& self) {
        return self.run->resumed_from().empty() ? py::object(py::none()) : py::object(py::str(self.run->resumed_from()));
      })
      .def_property_readonly("num_train", [](const PyRun& self) { return self.run->data().train.size(); })
      .def_property_readonly("num_test", [](const PyRun& self) { return self.run->data().test.size(); })
      .def_property_readonly("vocab_size", [](const PyRun& self) { return self.run->data().vocab.size(); });
}

}  // namespace qkv::python
