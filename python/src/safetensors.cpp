// Python bindings of the safetensors reader and writer: load_safetensors / save_safetensors over numpy arrays that
// keep the file's dtypes; loading copies unless mmap=True.
// Malformed files raise ValueError (via register_errors), I/O failures OSError subclasses, bad arguments TypeError.
#include <pybind11/stl.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>
#include <system_error>
#include <vector>

#include "bindings.h"
#include "qkv/core/safetensors.h"

namespace qkv::python {

namespace {

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

// The numpy dtype that holds a safetensors dtype exactly, or None (F8_*, F4, F6_*; BF16 without ml_dtypes).
py::object numpy_dtype(SafeTensorsDtype d) {
  const char* name = nullptr;
  switch (d) {
    case SafeTensorsDtype::BOOL: name = "bool"; break;
    case SafeTensorsDtype::U8: name = "uint8"; break;
    case SafeTensorsDtype::I8: name = "int8"; break;
    case SafeTensorsDtype::I16: name = "<i2"; break;
    case SafeTensorsDtype::U16: name = "<u2"; break;
    case SafeTensorsDtype::F16: name = "<f2"; break;
    case SafeTensorsDtype::I32: name = "<i4"; break;
    case SafeTensorsDtype::U32: name = "<u4"; break;
    case SafeTensorsDtype::F32: name = "<f4"; break;
    case SafeTensorsDtype::F64: name = "<f8"; break;
    case SafeTensorsDtype::I64: name = "<i8"; break;
    case SafeTensorsDtype::U64: name = "<u8"; break;
    case SafeTensorsDtype::C64: name = "<c8"; break;
    case SafeTensorsDtype::BF16: {
      try {
        return py::module_::import("ml_dtypes").attr("bfloat16");
      } catch (const py::error_already_set&) {
        return py::none();  // no numpy bfloat16 without ml_dtypes: widened to float32 (exact)
      }
    }
    default: return py::none();
  }
  return py::dtype(name);
}

// The safetensors dtype an array is written as; nullopt for dtypes that are converted to float32 first.
std::optional<SafeTensorsDtype> file_dtype(const py::dtype& dt) {
  if (std::string(py::str(dt.attr("name"))) == "bfloat16" && dt.itemsize() == 2) return SafeTensorsDtype::BF16;
  switch (dt.kind()) {
    case 'b': return SafeTensorsDtype::BOOL;
    case 'i':
      switch (dt.itemsize()) {
        case 1: return SafeTensorsDtype::I8;
        case 2: return SafeTensorsDtype::I16;
        case 4: return SafeTensorsDtype::I32;
        case 8: return SafeTensorsDtype::I64;
      }
      break;
    case 'u':
      switch (dt.itemsize()) {
        case 1: return SafeTensorsDtype::U8;
        case 2: return SafeTensorsDtype::U16;
        case 4: return SafeTensorsDtype::U32;
        case 8: return SafeTensorsDtype::U64;
      }
      break;
    case 'f':
      switch (dt.itemsize()) {
        case 2: return SafeTensorsDtype::F16;
        case 4: return SafeTensorsDtype::F32;
        case 8: return SafeTensorsDtype::F64;
      }
      break;
    case 'c':
      if (dt.itemsize() == 8) return SafeTensorsDtype::C64;
      break;
  }
  return std::nullopt;  // long double, complex128, ...: as float32 (to_tensor's conversion and its TypeErrors)
}

py::object make_array(const SafeTensorsBytes& file, const SafeTensorsEntry& e, bool map) {
  std::vector<py::ssize_t> shape(e.shape.begin(), e.shape.end());
  const uint8_t* src = file.data() + e.begin;
  py::object dt = numpy_dtype(e.dtype);
  const py::module_ np = py::module_::import("numpy");
  if (dt.is_none()) {  // F8_* (and BF16 without ml_dtypes): converted to float32; F4/F6 raise RuntimeError
    py::array_t<float> out(shape);
    safetensors_to_float32(e, src, out.mutable_data());
    return std::move(out);
  }
  const py::dtype dtype = py::reinterpret_borrow<py::dtype>(dt);
  if (map) {
    // A view of the private mapping; the capsule keeps the mapping alive.
    auto* keep = new std::shared_ptr<const uint8_t>(file.file);
    py::capsule owner(keep, [](void* p) { delete static_cast<std::shared_ptr<const uint8_t>*>(p); });
    std::vector<py::ssize_t> strides(shape.size());
    py::ssize_t step = dtype.itemsize();
    for (size_t i = shape.size(); i-- > 0;) {
      strides[i] = step;
      step *= std::max<py::ssize_t>(shape[i], 1);
    }
    return py::array(dtype, shape, strides, const_cast<uint8_t*>(src), owner);
  }
  // A copy of its own (aligned, independent of the file and of the other arrays).
  py::array out = np.attr("empty")(py::tuple(py::cast(shape)), dtype);
  if (e.end > e.begin) std::memcpy(out.mutable_data(), src, e.end - e.begin);
  return std::move(out);
}

py::object load(const py::object& path_obj, bool with_metadata, bool map) {
  const std::string path = fs_path(path_obj);
  SafeTensorsBytes file;
  try {
    py::gil_scoped_release nogil;
    file = read_safetensors_bytes(path, map);
  } catch (const std::system_error& e) {
    raise_os_error(e, path);
  }
  for (const SafeTensorsEntry& e : file.header.entries)  // before building any array: all or nothing
    if (e.dtype == SafeTensorsDtype::F4 || e.dtype == SafeTensorsDtype::F6_E2M3 || e.dtype == SafeTensorsDtype::F6_E3M2)
      throw std::runtime_error("[safetensors] tensor \"" + e.name + "\" has dtype " + dtype_name(e.dtype) +
                               ", which is valid but has no float32 conversion in qkv");
  py::dict tensors;
  for (const SafeTensorsEntry& e : file.header.entries) tensors[py::str(e.name)] = make_array(file, e, map);
  // Name order, as the writer sorts them (entries are in file order).
  py::dict sorted;
  py::list keys = py::list(tensors.attr("keys")());
  keys.attr("sort")();
  for (const py::handle k : keys) sorted[k] = tensors[k];
  if (!with_metadata) return std::move(sorted);
  py::dict metadata;
  for (const auto& [k, v] : file.header.metadata) metadata[py::str(k)] = py::str(v);
  return py::make_tuple(sorted, metadata);
}

void save(const py::object& path_obj, const py::object& tensors_obj, const py::object& metadata_obj) {
  const std::string path = fs_path(path_obj);
  if (!py::hasattr(tensors_obj, "items"))
    throw py::type_error("save_safetensors: tensors must be a dict of str -> numpy.ndarray, got " +
                         std::string(py::str(py::type::of(tensors_obj).attr("__name__"))));
  const py::module_ np = py::module_::import("numpy");
  std::vector<py::array> keep_arrays;
  std::vector<Tensor> keep_tensors;
  std::map<std::string, SafeTensorsRaw> tensors;
  for (const py::handle item : tensors_obj.attr("items")()) {
    const py::tuple kv = py::reinterpret_borrow<py::tuple>(item);
    if (!py::isinstance<py::str>(kv[0]))
      throw py::type_error("save_safetensors: tensor names must be str, got " +
                           std::string(py::str(py::type::of(kv[0]).attr("__name__"))));
    const std::string name = utf8(kv[0], "tensor name");
    const std::string what = "tensors[" + name + "]";
    SafeTensorsRaw raw;
    std::optional<SafeTensorsDtype> fd;
    if (py::isinstance<py::array>(kv[1])) fd = file_dtype(py::reinterpret_borrow<py::array>(kv[1]).dtype());
    if (fd) {
      // As it is: C order, little-endian (a big-endian array is byte-swapped, its values kept).
      const py::array a = py::reinterpret_borrow<py::array>(kv[1]);
      py::object dt = a.dtype();
      if (*fd != SafeTensorsDtype::BF16) dt = dt.attr("newbyteorder")("<");
      keep_arrays.push_back(np.attr("asarray")(a, dt, "C"));  // (ascontiguousarray would make a 0-d array 1-d)
      const py::array& c = keep_arrays.back();
      raw.dtype = *fd;
      raw.shape.assign(c.shape(), c.shape() + c.ndim());
      raw.data = c.data();
    } else {
      keep_tensors.push_back(to_tensor(kv[1], "save_safetensors", what.c_str()).contiguous());
      const Tensor& t = keep_tensors.back();
      raw.dtype = SafeTensorsDtype::F32;
      raw.shape = t.shape();
      raw.data = t.numel() > 0 ? t.data() : nullptr;
    }
    tensors.emplace(name, raw);
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
    save_safetensors_raw(path, tensors, metadata);
  } catch (const std::system_error& e) {
    raise_os_error(e, path);
  }
}

}  // namespace

void bind_safetensors(py::module_& m) {
  m.def("load_safetensors", &load, py::arg("path"), py::arg("with_metadata") = false, py::arg("mmap") = false,
        R"doc(Loads a safetensors file as a dict of numpy arrays in the file's dtypes (any shape, scalars and empty
included): BOOL -> bool, I8..I64/U8..U64 -> the same integers, F16 -> float16, F32 -> float32, F64 -> float64,
C64 -> complex64, BF16 -> ml_dtypes.bfloat16 when ml_dtypes is installed (else float32, exactly); F8_* become
float32. with_metadata=True returns (tensors, metadata).

mmap=False (the default) reads the file into memory: the arrays are copies of their own, and truncating,
rewriting or deleting the file afterwards changes nothing. mmap=True maps the file instead (private copy-on-write:
writing into an array never changes the file) and saves the copy, but the arrays then depend on the file: truncating
it while they live kills the process with SIGBUS, and rewriting it in place may show through. Use it only for
files that nothing modifies.

Raises ValueError naming the broken rule for a malformed file (qkv is stricter than the reference package:
duplicate names or keys, leading whitespace, non-space padding, unknown fields, null __metadata__, BOOL bytes other
than 0/1 are rejected), OSError (FileNotFoundError, ...) when the file cannot be read, RuntimeError for valid F4/F6
tensors.)doc");
  m.def("save_safetensors", &save, py::arg("path"), py::arg("tensors"), py::arg("metadata") = py::none(),
        R"doc(Saves a dict of str -> numpy array (any shape) as safetensors, with optional str -> str metadata.

Each array is written in its own dtype, bytes unchanged: bool -> BOOL, int8..int64/uint8..uint64 -> I8..U64,
float16 -> F16, float32 -> F32, float64 -> F64, complex64 -> C64, ml_dtypes.bfloat16 -> BF16 (any layout; big-endian
arrays are byte-swapped). Other real dtypes (long double) are converted to F32. The output is byte-identical to the
reference package (tensors sorted by name, header padded with spaces to 8 bytes) and is written atomically: a
temporary file beside `path` is fsynced and renamed over it. Raises TypeError for non-str names or metadata or
non-array values, ValueError for the reserved name "__metadata__" or invalid UTF-8, OSError when the file cannot be
written.)doc");
}

}  // namespace qkv::python
