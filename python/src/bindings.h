// Shared helpers of the Python bindings: NumPy <-> Tensor conversion and error translation.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <string>

#include "qkv/core/tensor.h"

namespace qkv::python {

namespace py = pybind11;

// Borrows a float32 C-contiguous array without copying (the Tensor keeps the array alive).
// Other real dtypes and layouts are converted to a float32 C-contiguous copy; anything else raises TypeError.
Tensor to_tensor(const py::handle& obj, const char* fn, const char* arg);
// Same, but None gives an undefined Tensor.
Tensor to_tensor_or_none(const py::handle& obj, const char* fn, const char* arg);
// Copies a Tensor into a new float32 ndarray.
py::array_t<float> to_numpy(const Tensor& t);

void register_errors(py::module_& m);  // std::invalid_argument -> ValueError
void bind_attention(py::module_& m);

}  // namespace qkv::python
