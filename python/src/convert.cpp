// NumPy <-> Tensor conversion (anything NumPy can read, torch tensors through DLPack) with zero-copy for float32
// C-contiguous input, PyTorch-style mask arguments, state
// dicts, module seeds and the C++ -> Python error mapping.
#include <pybind11/stl.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <stdexcept>

#include "bindings.h"

namespace qkv::python {

namespace {

std::string type_name(const py::handle& obj) { return py::str(py::type::of(obj).attr("__name__")); }

// The first line of the pending Python error's message, at most 160 characters: never an array dump.
std::string short_error(py::error_already_set& e) {
  std::string msg = py::str(e.value());
  msg = msg.substr(0, msg.find('\n'));
  if (msg.size() > 160) msg = msg.substr(0, 157) + "...";
  return msg;
}

}  // namespace

std::string fs_path(const py::handle& path) {
  return py::str(py::module_::import("os").attr("fsdecode")(path));
}

// obj as an ndarray: an ndarray itself; an object with __dlpack__ (a CPU torch tensor, ...) through
// numpy.from_dlpack; anything else numpy can read (lists, __array__, the buffer protocol) through numpy.asarray.
// None, str, bytes and dicts are refused. None of these copies when the data is already float32 in memory.
py::array to_array(const py::handle& obj, const char* fn, const char* arg) {
  if (py::isinstance<py::array>(obj)) return py::reinterpret_borrow<py::array>(obj);
  if (obj.is_none() || py::isinstance<py::str>(obj) || py::isinstance<py::bytes>(obj) ||
      py::isinstance<py::dict>(obj)) {
    throw py::type_error(std::string(fn) + ": " + arg + " must be array-like (a numpy.ndarray, a torch tensor, "
                         "nested lists...), got " + type_name(obj));
  }
  // Leaked on purpose: no decref after finalisation.
  static auto* np = new py::object(py::module_::import("numpy"));
  try {
    if (py::hasattr(obj, "__dlpack__")) {
      try {
        return py::reinterpret_borrow<py::array>(np->attr("from_dlpack")(obj));
      } catch (py::error_already_set&) {
        // Not exportable as is (a tensor that requires grad, another device, ...): __array__ may still work.
        if (!py::hasattr(obj, "__array__")) throw;
      }
    }
    return py::reinterpret_borrow<py::array>(np->attr("asarray")(obj));
  } catch (py::error_already_set& e) {
    if (e.matches(PyExc_MemoryError)) throw;
    throw py::type_error(std::string(fn) + ": " + arg + " (" + type_name(obj) +
                         ") could not be read as an array: " + short_error(e));
  }
}

namespace {

py::array as_real_array(const py::handle& obj, const char* fn, const char* arg) {
  py::array a = to_array(obj, fn, arg);
  const char kind = a.dtype().kind();
  if (kind != 'f' && kind != 'i' && kind != 'u' && kind != 'b') {
    throw py::type_error(std::string(fn) + ": " + arg + " has dtype " + std::string(py::str(a.dtype())) +
                         "; expected a real numeric dtype (float32 is used without a copy)");
  }
  return a;
}

// A finite float64 (or wider) value that float32 cannot hold would turn into inf, and attention into NaN: refused.
// Values that were inf or NaN already pass through (a -inf mask is meant).
void check_no_overflow(const py::array& wide, const py::array_t<float, py::array::c_style>& f, const char* fn,
                       const char* arg) {
  const float* p = f.data();
  for (py::ssize_t i = 0; i < f.size(); ++i) {
    if (!std::isinf(p[i])) continue;
    static auto* require = new py::object(py::module_::import("numpy").attr("require"));
    const auto d = py::reinterpret_borrow<py::array_t<double, py::array::c_style>>(
        (*require)(wide, py::dtype::of<double>(), "C"));
    for (py::ssize_t j = i; j < d.size(); ++j)
      if (std::isinf(p[j]) && std::isfinite(d.data()[j])) {
        char value[32];
        std::snprintf(value, sizeof value, "%.6g", d.data()[j]);
        throw py::value_error(std::string("[") + fn + "] " + arg + " holds " + value + " (flat index " +
                              std::to_string(j) + "), past float32's range (3.4e38): qkv computes in float32");
      }
    return;
  }
}

}  // namespace

Rng& process_rng() {
  static Rng rng(0);  // guarded by the GIL (or, while compute runs without it, by the caller holding it first)
  return rng;
}

Tensor to_tensor(const py::handle& obj, const char* fn, const char* arg) {
  py::array a = as_real_array(obj, fn, arg);
  using F32 = py::array_t<float, py::array::c_style>;
  const bool aligned = reinterpret_cast<uintptr_t>(a.data()) % alignof(float) == 0;
  F32 f;
  if (py::isinstance<F32>(a) && (a.flags() & py::array::c_style) && aligned) {
    f = py::reinterpret_borrow<F32>(a);  // zero-copy
  } else {
    // numpy does the conversion, so its errors (MemoryError for a huge broadcast view, ...) reach the caller.
    // np.require(a, float32, "CA"): C-contiguous and aligned. Leaked on purpose: no decref after finalisation.
    static auto* require = new py::object(py::module_::import("numpy").attr("require"));
    if (a.dtype().kind() == 'f' && a.dtype().itemsize() > 4) {
      // float64 -> float32 under errstate(over="ignore"): an overflow is reported by check_no_overflow, as a
      // ValueError, not by numpy's RuntimeWarning.
      py::object quiet = py::module_::import("numpy").attr("errstate")(py::arg("over") = "ignore");
      quiet.attr("__enter__")();
      try {
        f = py::reinterpret_borrow<F32>((*require)(a, py::dtype::of<float>(), "CA"));
      } catch (...) {
        quiet.attr("__exit__")(py::none(), py::none(), py::none());
        throw;
      }
      quiet.attr("__exit__")(py::none(), py::none(), py::none());
      check_no_overflow(a, f, fn, arg);
    } else {
      f = py::reinterpret_borrow<F32>((*require)(a, py::dtype::of<float>(), "CA"));
    }
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

Tensor to_tensor_strided(const py::handle& obj, const char* fn, const char* arg) {
  py::array a = as_real_array(obj, fn, arg);
  using F32 = py::array_t<float>;
  if (!py::isinstance<F32>(a) || a.size() == 0 || reinterpret_cast<uintptr_t>(a.data()) % alignof(float) != 0) {
    return to_tensor(a, fn, arg);
  }
  Shape shape(a.shape(), a.shape() + a.ndim());
  Shape strides(static_cast<size_t>(a.ndim()));
  for (py::ssize_t d = 0; d < a.ndim(); ++d) {
    const py::ssize_t s = a.strides()[d];
    if (s < 0 || s % static_cast<py::ssize_t>(sizeof(float)) != 0) return to_tensor(a, fn, arg);
    strides[static_cast<size_t>(d)] = s / static_cast<py::ssize_t>(sizeof(float));
  }
  auto* keep = new py::object(a);
  std::shared_ptr<void> owner(keep, [](void* p) {
    py::gil_scoped_acquire gil;
    delete static_cast<py::object*>(p);
  });
  return Tensor::from_blob(const_cast<float*>(static_cast<const float*>(a.data())), shape, strides, owner);
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

py::array_t<float> to_numpy_shared(const Tensor& t) {
  const Tensor c = t.contiguous();
  std::vector<py::ssize_t> shape(c.shape().begin(), c.shape().end());
  std::vector<py::ssize_t> strides;
  for (int64_t s : c.strides()) strides.push_back(static_cast<py::ssize_t>(s * static_cast<int64_t>(sizeof(float))));
  auto* keep = new Tensor(c);
  py::capsule owner(keep, [](void* p) { delete static_cast<Tensor*>(p); });
  static float dummy = 0.0f;
  float* data = c.numel() ? keep->data() : &dummy;
  return py::array_t<float>(shape, strides, data, owner);
}

MaskArg to_mask(const py::handle& obj, const char* fn, const char* arg, MaskKind bool_kind) {
  if (obj.is_none()) return {};
  py::array a = as_real_array(obj, fn, arg);
  const char kind = a.dtype().kind();
  if (kind != 'b' && kind != 'f') {
    throw py::type_error(std::string(fn) + ": " + arg + " has dtype " + std::string(py::str(a.dtype())) +
                         "; only bool and floating masks are supported (as in PyTorch)");
  }
  return {to_tensor(a, fn, arg), kind == 'b' ? bool_kind : MaskKind::kAdditive};
}

nn::StateDict to_state_dict(const py::handle& obj, const char* fn) {
  if (!py::isinstance<py::dict>(obj)) {
    throw py::type_error(std::string(fn) + ": state_dict must be a dict of arrays (NumPy or torch), got " +
                         type_name(obj));
  }
  nn::StateDict out;
  for (auto item : py::reinterpret_borrow<py::dict>(obj)) {
    if (!py::isinstance<py::str>(item.first)) {
      throw py::type_error(std::string(fn) + ": state_dict keys must be str, got " + type_name(item.first));
    }
    const std::string name = py::str(item.first);
    out[name] = to_tensor(item.second, fn, ("state_dict['" + name + "']").c_str());
  }
  return out;
}

py::dict state_dict_to_python(nn::Module& module) {
  py::dict d;
  for (auto& [name, p] : module.named_parameters()) d[py::str(name)] = to_numpy(*p);
  return d;
}

uint64_t module_seed(const py::object& seed) {
  if (seed.is_none()) {
    Rng& r = process_rng();
    return (static_cast<uint64_t>(r.next_u32()) << 32) | r.next_u32();
  }
  if (!py::isinstance<py::int_>(seed) || py::isinstance<py::bool_>(seed)) {
    throw py::type_error("seed must be an int or None, got " + type_name(seed));
  }
  // Any Python int, reduced modulo 2^64, so negative and huge seeds work too.
  const unsigned long long bits = PyLong_AsUnsignedLongLongMask(seed.ptr());
  if (PyErr_Occurred()) throw py::error_already_set();
  return static_cast<uint64_t>(bits);
}

void check_sizes(const char* fn, std::initializer_list<std::pair<const char*, int64_t>> sizes, int64_t min_size) {
  constexpr double kMaxElements = 1099511627776.0;  // 2^40
  double product = 1.0;
  std::string listing;
  for (const auto& [name, n] : sizes) {
    if (!listing.empty()) listing += ", ";
    listing += name;
    listing += ' ';
    listing += std::to_string(n);
    if (n < min_size) {
      throw py::value_error("[" + std::string(fn) + "] " + name + " must be >= " + std::to_string(min_size) +
                            ", got " + std::to_string(n));
    }
    product *= static_cast<double>(n);
  }
  if (product > kMaxElements) {
    throw py::value_error("[" + std::string(fn) + "] sizes too large (" + listing + "): more than 2^40 elements");
  }
}

void register_errors(py::module_& m) {
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const std::invalid_argument& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    }
  });
  m.def(
      "manual_seed",
      [](const py::object& seed) {
        if (seed.is_none()) throw py::type_error("manual_seed: seed must be an int, got None");
        process_rng() = Rng(module_seed(seed));
      },
      py::arg("seed"),
      "Reseeds the generator that initialises modules built without an explicit seed (like torch.manual_seed).");
}

}  // namespace qkv::python
