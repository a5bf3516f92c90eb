// Entry point of the _qkv extension: each area registers its bindings from its own file.
#include <pybind11/pybind11.h>

#include "bindings.h"

PYBIND11_MODULE(_qkv, m) {
  m.doc() = "qkv: attention from Seq2Seq to self-attention (C++ core)";
  m.attr("__version__") = "0.1.0";
  qkv::python::register_errors(m);
  qkv::python::bind_attention(m);
  qkv::python::bind_sdpa(m);
  qkv::python::bind_mha(m);
  qkv::python::bind_transformer(m);
  qkv::python::bind_rnn(m);
  qkv::python::bind_positional(m);
  qkv::python::bind_bert(m);
  qkv::python::bind_train(m);
  qkv::python::bind_safetensors(m);
  qkv::python::bind_metrics(m);
}
