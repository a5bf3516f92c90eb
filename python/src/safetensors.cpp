// Python bindings of the safetensors reader and writer: load_safetensors / save_safetensors over float32 ndarrays.
// Malformed files raise ValueError (via register_errors), I/O failures OSError subclasses, bad arguments TypeError.
#include <pybind11/stl.h>

#include <string>
#include <system_error>
#include <vector>

#include "bindings.h"
#include "qkv/core/safetensors.h"

namespace qkv::python {

namespace {

std::string fs_path(const py::handle& path) {
  // str, bytes and os.PathLike, decoded the way the os module does.
  return py::str(py::module_::import("os").attr("fsdecode")(path));
}

// The UTF-8 bytes of a str; a lone surrogate (which has none) raises ValueError instead of a cast error.
std::string utf8(const py::handle& s, const std::string& what) {
  Py_ssize_t n = 0;
  const char* p = PyUnicode_AsUTF8AndSize(s.ptr(), &n);
  if (!p) {
    PyErr_Clear();
    throw py::value_error("[safetensors] " + what + " " + std::string(py::repr(s)) + " is not valid UTF-8");
  }
  return std::string(p, static_cast<size_t>(n));
}

// OSError(errno, message, filename): Python turns it into FileNotFoundError, IsADirectoryError, ...
[[noreturn]] void raise_os_error(const std::system_error& e, const std::string& path) {
  py::object exc = py::module_::import("builtins").attr("OSError")(e.code().value(), e.what(), path);
  PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc.ptr())), exc.ptr());
  throw py::error_already_set();
}

// A float32 ndarray over the tensor's memory (no copy); the array owns a Tensor handle that keeps it alive,
// which for zero-copy tensors is the file mapping (private copy-on-write, so writes never reach the file).
py::array as_array(const Tensor& t) {
  auto* keep = new Tensor(t);
  py::capsule owner(keep, [](void* p) { delete static_cast<Tensor*>(p); });
  std::vector<py::ssize_t> shape(t.shape().begin(), t.shape().end());
  std::vector<py::ssize_t> strides;
  for (int64_t s : t.strides()) strides.push_back(static_cast<py::ssize_t>(s * sizeof(float)));
  return py::array(py::dtype::of<float>(), shape, strides, keep->data(), owner);
}

py::object load(const py::object& path_obj, bool with_metadata) {
  const std::string path = fs_path(path_obj);
  SafeTensorsFile file;
  try {
    py::gil_scoped_release nogil;
    file = load_safetensors(path);
  } catch (const std::system_error& e) {
    raise_os_error(e, path);
  }
  py::dict tensors;
  for (const auto& [name, t] : file.tensors) tensors[py::str(name)] = as_array(t);
  if (!with_metadata) return tensors;
  py::dict metadata;
  for (const auto& [k, v] : file.metadata) metadata[py::str(k)] = py::str(v);
  return py::make_tuple(tensors, metadata);
}

void save(const py::object& path_obj, const py::object& tensors_obj, const py::object& metadata_obj) {
  const std::string path = fs_path(path_obj);
  if (!py::hasattr(tensors_obj, "items"))
    throw py::type_error("save_safetensors: tensors must be a dict of str -> numpy.ndarray, got " +
                         std::string(py::str(py::type::of(tensors_obj).attr("__name__"))));
  std::map<std::string, Tensor> tensors;
  for (const py::handle item : tensors_obj.attr("items")()) {
    const py::tuple kv = py::reinterpret_borrow<py::tuple>(item);
    if (!py::isinstance<py::str>(kv[0]))
      throw py::type_error("save_safetensors: tensor names must be str, got " +
                           std::string(py::str(py::type::of(kv[0]).attr("__name__"))));
    const std::string name = utf8(kv[0], "tensor name");
    tensors.emplace(name, to_tensor(kv[1], "save_safetensors", ("tensors[" + name + "]").c_str()));
  }
  std::map<std::string, std::string> metadata;
  if (!metadata_obj.is_none()) {
    if (!py::hasattr(metadata_obj, "items"))
      throw py::type_error("save_safetensors: metadata must be a dict of str -> str or None");
    for (const py::handle item : metadata_obj.attr("items")()) {
      const py::tuple kv = py::reinterpret_borrow<py::tuple>(item);
      if (!py::isinstance<py::str>(kv[0]) || !py::isinstance<py::str>(kv[1]))
        throw py::type_error("save_safetensors: metadata must map str -> str, got " +
                             std::string(py::str(py::type::of(kv[0]).attr("__name__"))) + " -> " +
                             std::string(py::str(py::type::of(kv[1]).attr("__name__"))));
      metadata.emplace(utf8(kv[0], "metadata key"), utf8(kv[1], "metadata value"));
    }
  }
  try {
    py::gil_scoped_release nogil;
    save_safetensors(path, tensors, metadata);
  } catch (const std::system_error& e) {
    raise_os_error(e, path);
  }
}

}  // namespace

void bind_safetensors(py::module_& m) {
  m.def("load_safetensors", &load, py::arg("path"), py::arg("with_metadata") = false,
        R"doc(Loads a safetensors file as a dict of float32 numpy arrays (any shape, scalars and empty included).

F32 data is mapped without copying (copy-on-write: writing into an array never changes the file); F16, BF16,
F64, F8_*, integer and BOOL tensors are converted to float32. with_metadata=True returns (tensors, metadata).

Raises ValueError naming the broken rule for a malformed file (qkv is stricter than the reference package:
duplicate names or keys, leading whitespace, non-space padding, unknown fields, null __metadata__ are rejected),
OSError (FileNotFoundError, ...) when the file cannot be read, RuntimeError for valid C64/F4/F6 tensors.)doc");
  m.def("save_safetensors", &save, py::arg("path"), py::arg("tensors"), py::arg("metadata") = py::none(),
        R"doc(Saves a dict of str -> numpy array (any shape) as F32 safetensors, with optional str -> str metadata.

Arrays of other real dtypes are converted to float32. The output is byte-identical to the reference package for
float32 input (tensors sorted by name, header padded with spaces to 8 bytes) and is written atomically: a
temporary file beside `path` is fsynced and renamed over it. Raises TypeError for non-str names or metadata,
ValueError for the reserved name "__metadata__" or invalid UTF-8, OSError when the file cannot be written.)doc");
}

}  // namespace qkv::python
