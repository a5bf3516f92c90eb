// Bindings of the chat templates: qkv.ChatTemplate(source).render(messages, add_generation_prompt, **kwargs) and
// qkv.find_chat_template(folder). Thin: Python values become JSON values; rendering runs with the GIL released.
#include <pybind11/stl.h>

#include <cmath>
#include <string>

#include "bindings.h"
#include "qkv/core/json.h"
#include "qkv/text/chat_template.h"

namespace qkv::python {

namespace {

// None, bool, int, float, str, list/tuple and dict (str keys) -> json::Value; anything else is a TypeError naming
// where it sits ("messages[0]['content']").
json::Value to_json_at(const py::handle& obj, const std::string& fn, const std::string& where, int depth) {
  if (depth > 64) throw py::value_error("[" + fn + "] " + where + " is nested deeper than 64 levels");
  if (obj.is_none()) return json::Value();
  if (py::isinstance<py::bool_>(obj)) return json::Value(obj.cast<bool>());
  if (py::isinstance<py::int_>(obj)) {
    int overflow = 0;
    const long long v = PyLong_AsLongLongAndOverflow(obj.ptr(), &overflow);
    if (overflow != 0) throw py::value_error("[" + fn + "] " + where + " is an int outside int64");
    return json::Value(static_cast<int64_t>(v));
  }
  if (py::isinstance<py::float_>(obj)) return json::Value(obj.cast<double>());
  if (py::isinstance<py::str>(obj)) {
    Py_ssize_t n = 0;
    const char* p = PyUnicode_AsUTF8AndSize(obj.ptr(), &n);
    if (!p) {
      PyErr_Clear();
      throw py::value_error("[" + fn + "] " + where + " is a str that is not valid UTF-8 (a lone surrogate)");
    }
    return json::Value(std::string(p, static_cast<size_t>(n)));
  }
  if (py::isinstance<py::list>(obj) || py::isinstance<py::tuple>(obj)) {
    json::Value arr = json::Value::array();
    size_t k = 0;
    for (const auto& item : obj) arr.push(to_json_at(item, fn, where + "[" + std::to_string(k++) + "]", depth + 1));
    return arr;
  }
  if (py::isinstance<py::dict>(obj)) {
    json::Value o = json::Value::object();
    for (const auto& kv : obj.cast<py::dict>()) {
      if (!py::isinstance<py::str>(kv.first))
        throw py::type_error("[" + fn + "] " + where + " has a key of type " +
                             std::string(py::str(py::type::of(kv.first).attr("__name__"))) + "; keys must be str");
      const std::string key = kv.first.cast<std::string>();
      o.set(key, to_json_at(kv.second, fn, where + "['" + key + "']", depth + 1));
    }
    return o;
  }
  throw py::type_error("[" + fn + "] " + where + " is a " +
                       std::string(py::str(py::type::of(obj).attr("__name__"))) +
                       "; chat template values must be None, bool, int, float, str, list, tuple or dict");
}

}  // namespace

json::Value to_json(const py::handle& obj, const char* fn, const std::string& where) {
  return to_json_at(obj, fn, where, 0);
}

void bind_chat_template(py::module_& m) {
  using text::ChatTemplate;
  py::class_<ChatTemplate>(m, "ChatTemplate",
                           "A Jinja2 chat template rendered as transformers' apply_chat_template renders it.")
      .def(py::init([](const std::string& source, const std::string& name) { return ChatTemplate::parse(source, name); }),
           py::arg("source"), py::arg("name") = "chat_template",
           "Parses the template text; a syntax error raises ValueError naming `name` and line:column.")
      .def(
          "render",
          [](const ChatTemplate& t, const py::object& messages, bool add_generation_prompt, const py::kwargs& kwargs) {
            json::Value ctx = json::Value::object();
            ctx.set("messages", to_json(messages, "ChatTemplate.render", "messages"));
            ctx.set("tools", json::Value());
            ctx.set("documents", json::Value());
            ctx.set("add_generation_prompt", add_generation_prompt);
            for (const auto& kv : kwargs) {
              const std::string key = kv.first.cast<std::string>();
              ctx.set(key, to_json(kv.second, "ChatTemplate.render", key));
            }
            py::gil_scoped_release nogil;
            return t.render(ctx);
          },
          py::arg("messages"), py::arg("add_generation_prompt") = false,
          "The rendered text. The template sees messages, tools=None, documents=None, add_generation_prompt and the "
          "keyword arguments (bos_token, eos_token, tools, date_string, ...), as in transformers' "
          "apply_chat_template(tokenize=False). raise_exception() in the template and errors raise ValueError; "
          "exceeding the step or size limits raises RuntimeError.")
      .def_property_readonly("name", &ChatTemplate::name)
      .def_property_readonly("source", &ChatTemplate::source,
                             "The template text as parsed (newlines normalized, one trailing newline dropped).");
  m.def(
      "find_chat_template",
      [](const py::object& folder) {
        const std::string path = py::str(py::module_::import("os").attr("fsdecode")(folder));
        py::gil_scoped_release nogil;
        return text::find_chat_template(path);
      },
      py::arg("folder"),
      "The chat template of a Hugging Face model folder: chat_template.jinja, else tokenizer_config.json's "
      "\"chat_template\" (the \"default\" entry of a list). RuntimeError when the folder has neither.");
}

}  // namespace qkv::python
