// Shared helpers of the Python bindings: NumPy <-> Tensor conversion, PyTorch-style masks, state dicts, the module
// seed and error translation. Each area binds itself from its own file and is registered in module.cpp.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <initializer_list>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "qkv/core/ids.h"
#include "qkv/core/json.h"
#include "qkv/core/rng.h"
#include "qkv/core/tensor.h"
#include "qkv/models/outputs.h"
#include "qkv/nn/module.h"
#include "qkv/ops/attention.h"

// A SmallVector (Shape: dims, strides) crosses to Python as std::vector does: a list out, any sequence of ints in,
// with the same conversions, signatures and errors.
namespace pybind11::detail {
template <typename T, size_t N>
struct type_caster<qkv::SmallVector<T, N>> : list_caster<qkv::SmallVector<T, N>, T> {};
}  // namespace pybind11::detail

namespace qkv::python {

namespace py = pybind11;

// A file-system path argument: str, bytes or os.PathLike (pathlib.Path), decoded as the os module does; anything
// else raises TypeError.
std::string fs_path(const py::handle& path);

// A Python value (None, bool, int, float, str, list/tuple, dict with str keys) as JSON; anything else raises
// TypeError "[fn] <where> is a ..." naming where it sits ("messages[0]['content']") (python/src/chat_template.cpp).
json::Value to_json(const py::handle& obj, const char* fn, const std::string& where);

// obj as an ndarray: an ndarray itself, an object with __dlpack__ (a CPU torch tensor) through numpy.from_dlpack,
// anything else NumPy can read (lists, __array__, buffers) through numpy.asarray; no copy where the memory already
// fits. None, str, bytes, dicts and unreadable objects raise a one-line TypeError naming `fn` and `arg`.
py::array to_array(const py::handle& obj, const char* fn, const char* arg);
// Borrows a float32 C-contiguous aligned array without copying (the Tensor keeps the array alive).
// Other real dtypes (bool, ints, float16/64, ...) and layouts are converted to a float32 C-contiguous copy;
// input that is not array-like (to_array) or not of a real dtype raises TypeError naming `fn` and `arg`.
Tensor to_tensor(const py::handle& obj, const char* fn, const char* arg);
// Same, but None gives an undefined Tensor.
Tensor to_tensor_or_none(const py::handle& obj, const char* fn, const char* arg);
// Copies a Tensor into a new float32 ndarray.
py::array_t<float> to_numpy(const Tensor& t);
// A float32 ndarray viewed in place with its own strides when they are non-negative multiples of 4 bytes and the data
// is aligned (a torch tensor's transposed or expanded view through .numpy()); anything else as to_tensor.
// For inputs of the attention kernels, which read strided Q/K/V/masks whose last dimension is contiguous.
Tensor to_tensor_strided(const py::handle& obj, const char* fn, const char* arg);
// Hands a Tensor to NumPy without a copy: the array views the Tensor's storage and keeps it alive.
py::array_t<float> to_numpy_shared(const Tensor& t);

// A PyTorch mask argument: a bool array is read with `bool_kind` (kKeep for SDPA, kBlock for nn.MultiheadAttention),
// a floating array is additive (-inf blocks). Integer dtypes raise TypeError, as PyTorch's masks accept only bool
// and floating types. None gives {undefined, kNone}.
struct MaskArg {
  Tensor t;
  MaskKind kind = MaskKind::kNone;
};
MaskArg to_mask(const py::handle& obj, const char* fn, const char* arg, MaskKind bool_kind);

// window_size (left, right) and softcap, FlashAttention's names as scaled_dot_product_attention takes them, into the
// options: a side below -1 or a softcap not finite and >= 0 raises ValueError "[fn] ..." (python/src/sdpa.cpp).
void set_variants(AttentionOptions& o, std::pair<int64_t, int64_t> window_size, double softcap, const char* fn);

// {name: ndarray} -> StateDict (keys must be str, values ndarrays of a real dtype; TypeError otherwise).
nn::StateDict to_state_dict(const py::handle& obj, const char* fn);
// The module's parameters as {name: float32 ndarray} in registration order (PyTorch's state_dict order).
py::dict state_dict_to_python(nn::Module& module);

// The model calls' shared conventions (python/src/model_outputs.cpp).
// ids: a 1-D (T) or 2-D (B, T) array of integers -> Ids (B, T), and whether it was 1-D; `arg` names it in errors.
// Unsigned ids past int64 are refused by their value (never wrapped to a negative id).
Ids to_ids(const py::handle& obj, const char* fn, bool& one_d, const char* arg = "ids");
// A types.SimpleNamespace of d's items (a model call's outputs, attributes under HF's names).
py::object namespace_of(const py::dict& d);
// output_attentions / output_hidden_states / attention_layers (None, or a list of ints that needs
// output_attentions=True, else ValueError) as models::ForwardOptions.
models::ForwardOptions forward_options(const char* fn, bool output_attentions, bool output_hidden_states,
                                       const py::object& attention_layers);
// One output as a float32 array (None when undefined), its batch axis dropped for 1-D ids; per-layer outputs as a
// tuple of those, or None when not asked for.
py::object output_array(const Tensor& t, bool one_d);
py::object output_tuple(const std::vector<Tensor>& v, bool asked, bool one_d);

// Seed of a new module's Rng: `seed` when it is an int, else the next draw of the process-wide generator
// (reseeded by qkv.manual_seed), so two modules built in a row get different weights, as in PyTorch.
uint64_t module_seed(const py::object& seed);
// The process-wide generator qkv.manual_seed reseeds: module seeds and SDPA's dropout draw from it. Use it only
// while holding the GIL.
Rng& process_rng();

// Throws ValueError "[fn] ..." unless every size is >= min_size and their product is <= 2^40 elements: stops absurd
// size arguments (MultiheadAttention(2**40, 1), sinusoidal_table(2**31, 2**31)) before any allocation.
void check_sizes(const char* fn, std::initializer_list<std::pair<const char*, int64_t>> sizes,
                 int64_t min_size = 1);

// Runs f() with the GIL released and `mu` held. Take the lock only this way (never while holding the GIL), so a
// thread waiting for the lock never blocks one that needs the GIL.
template <class F>
auto locked_nogil(std::mutex& mu, F&& f) {
  py::gil_scoped_release nogil;
  std::lock_guard<std::mutex> lock(mu);
  return f();
}

void register_errors(py::module_& m);  // std::invalid_argument -> ValueError; qkv.manual_seed
void bind_attention(py::module_& m);
void bind_sdpa(py::module_& m);        // scaled_dot_product_attention[_backward] (python/src/sdpa.cpp)
void bind_mha(py::module_& m);         // MultiheadAttention (python/src/mha.cpp)
void bind_transformer(py::module_& m);  // Transformer layers, stacks and Transformer (python/src/transformer.cpp)
void bind_rnn(py::module_& m);         // GRU, LSTM (python/src/rnn.cpp)
void bind_positional(py::module_& m);  // submodule _qkv.positional (python/src/positional.cpp)
void bind_bert(py::module_& m);         // WordPieceTokenizer, SentenceEncoder (python/src/bert.cpp)
void bind_llama(py::module_& m);        // CausalLM (python/src/llama.cpp)
void bind_safetensors(py::module_& m);  // load_safetensors / save_safetensors (python/src/safetensors.cpp)
void bind_train(py::module_& m);       // TrainRun: qkv.train / qkv.train.Run (python/src/train.cpp)
void bind_metrics(py::module_& m);      // corpus_bleu / corpus_chrf (python/src/metrics.cpp)

}  // namespace qkv::python
