// Python bindings of the GGUF reader: gguf_read (metadata as Python values, tensor infos) and gguf_dequantize (one
// tensor as a float32 ndarray through the reference dequantizers). Malformed files raise RuntimeError (one line).
#include <pybind11/stl.h>

#include <cstring>
#include <stdexcept>
#include <string>

#include "bindings.h"
#include "qkv/core/gguf.h"
#include "qkv/kernels/quant.h"

namespace qkv::python {

namespace {

using gguf::ValueType;

// A GGUF string as str, or as bytes when it is not valid UTF-8 (GGUF does not promise it).
py::object text(const std::string& s) {
  PyObject* u = PyUnicode_DecodeUTF8(s.data(), static_cast<Py_ssize_t>(s.size()), "strict");
  if (u != nullptr) return py::reinterpret_steal<py::object>(u);
  PyErr_Clear();
  return py::bytes(s);
}

// One element of a fixed-size type at p as a Python int, float or bool.
py::object element(ValueType t, const uint8_t* p) {
  auto load = [p](auto v) {
    std::memcpy(&v, p, sizeof(v));
    return v;
  };
  switch (t) {
    case ValueType::UINT8: return py::int_(load(uint8_t{}));
    case ValueType::INT8: return py::int_(load(int8_t{}));
    case ValueType::UINT16: return py::int_(load(uint16_t{}));
    case ValueType::INT16: return py::int_(load(int16_t{}));
    case ValueType::UINT32: return py::int_(load(uint32_t{}));
    case ValueType::INT32: return py::int_(load(int32_t{}));
    case ValueType::UINT64: return py::int_(load(uint64_t{}));
    case ValueType::INT64: return py::int_(load(int64_t{}));
    case ValueType::FLOAT32: return py::float_(load(float{}));
    case ValueType::FLOAT64: return py::float_(load(double{}));
    case ValueType::BOOL: return py::bool_(p[0] != 0);
    default: break;
  }
  throw std::logic_error("[gguf] internal: element() of a variable-size type");
}

py::object to_python(const gguf::Value& v) {
  if (v.type() == ValueType::STRING) return text(v.as_string());
  if (!v.is_array()) return element(v.type(), v.raw().data());
  py::list out;
  if (v.array_type() == ValueType::STRING) {
    for (const std::string& s : v.as_strings()) out.append(text(s));
    return out;
  }
  const size_t width = gguf::value_type_size(v.array_type());
  for (size_t i = 0; i < v.size(); ++i) out.append(element(v.array_type(), v.raw().data() + i * width));
  return out;
}

}  // namespace

void bind_gguf(py::module_& m) {
  m.def(
      "gguf_read",
      [](const py::handle& path) {
        const gguf::File f = gguf::File::open(fs_path(path));
        py::dict metadata;
        for (const gguf::Value& v : f.values()) metadata[text(v.key())] = to_python(v);
        py::list tensors;
        for (const gguf::TensorInfo& t : f.tensors()) {
          py::dict d;
          d["name"] = text(t.name);
          d["type"] = static_cast<uint32_t>(t.type);
          d["type_name"] = gguf::type_name(t.type);
          d["shape"] = py::tuple(py::cast(t.shape()));
          d["offset"] = t.offset;
          tensors.append(d);
        }
        return py::make_tuple(metadata, tensors);
      },
      py::arg("path"),
      "Reads a GGUF file's header (every rule of ggml's reader checked): (metadata, tensors). metadata maps each key "
      "to an int, float, bool, str (bytes if not UTF-8) or list of them, in file order; tensors lists {'name', "
      "'type' (ggml's number), 'type_name', 'shape' (row-major: ggml's ne reversed), 'offset' (from the data "
      "section)} in file order. A malformed file raises RuntimeError naming the key or tensor and the byte.");
  m.def(
      "gguf_dequantize",
      [](const py::handle& path, const std::string& name) {
        const std::string p = fs_path(path);
        const gguf::File f = gguf::File::open(p);
        const gguf::TensorInfo* t = f.tensor(name);
        if (t == nullptr) throw py::value_error("[gguf] " + p + ": no tensor '" + name + "'");
        return to_numpy_shared(kernels::dequantize(*t));
      },
      py::arg("path"), py::arg("name"),
      "One tensor of a GGUF file as a float32 ndarray of its row-major shape, dequantized as ggml does (F32, F16, "
      "BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K). Other types raise "
      "RuntimeError; an unknown name ValueError.");
}

}  // namespace qkv::python
