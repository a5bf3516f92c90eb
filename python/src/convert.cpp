// NumPy <-> Tensor conversion with zero-copy for float32 C-contiguous input, and C++ -> Python error mapping.
#include <pybind11/stl.h>

#include <cstring>
#include <stdexcept>

#include "bindings.h"

namespace qkv::python {

Tensor to_tensor(const py::handle& obj, const char* fn, const char* arg) {
  if (!py::isinstance<py::array>(obj)) {
    throw py::type_error(std::string(fn) + ": " + arg + " must be a numpy.ndarray, got " +
                         std::string(py::str(py::type::of(obj).attr("__name__"))));
  }
  py::array a = py::reinterpret_borrow<py::array>(obj);
  const char kind = a.dtype().kind();
  if (kind != 'f' && kind != 'i' && kind != 'u' && kind != 'b') {
    throw py::type_error(std::string(fn) + ": " + arg + " has dtype " +
                         std::string(py::str(a.dtype())) + "; expected a real numeric dtype");
  }
  py::array_t<float, py::array::c_style> f;
  if (py::isinstance<py::array_t<float, py::array::c_style>>(a) &&
      (a.flags() & py::array::c_style)) {
    f = py::reinterpret_borrow<py::array_t<float, py::array::c_style>>(a);
  } else {
    f = py::array_t<float, py::array::c_style | py::array::forcecast>::ensure(a);
    if (!f) throw py::type_error(std::string(fn) + ": cannot convert " + arg + " to float32");
  }
  Shape shape(f.shape(), f.shape() + f.ndim());
  auto* keep = new py::object(f);
  std::shared_ptr<void> owner(keep, [](void* p) {
    py::gil_scoped_acquire gil;
    delete static_cast<py::object*>(p);
  });
  static float dummy = 0.0f;
  float* data = f.size() ? const_cast<float*>(f.data()) : &dummy;
  return Tensor::from_blob(data, shape, {}, owner);
}

Tensor to_tensor_or_none(const py::handle& obj, const char* fn, const char* arg) {
  if (obj.is_none()) return Tensor();
  return to_tensor(obj, fn, arg);
}

py::array_t<float> to_numpy(const Tensor& t) {
  std::vector<py::ssize_t> shape(t.shape().begin(), t.shape().end());
  py::array_t<float> out(shape);
  Tensor c = t.contiguous();
  if (t.numel()) std::memcpy(out.mutable_data(), c.data(), sizeof(float) * t.numel());
  return out;
}

void register_errors(py::module_& m) {
  (void)m;
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const std::invalid_argument& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    }
  });
}

}  // namespace qkv::python
