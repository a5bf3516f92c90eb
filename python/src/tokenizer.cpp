// Bindings of the language-model tokenizers: qkv.Tokenizer.from_pretrained(path) (a .gguf file, a tokenizer.json,
// or a folder holding one) with HF's encode / decode / convert_ids_to_tokens, and its streaming decoder.
#include <pybind11/stl.h>

#include "bindings.h"
#include "qkv/text/tokenizer.h"

namespace qkv::python {

namespace {

using text::Tokenizer;

// The library's I/O and unsupported-file errors surface as ValueError, like its argument errors.
template <typename F>
auto value_errors(F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const std::runtime_error& e) {
    throw py::value_error(e.what());
  }
}

std::vector<int64_t> to_ids(const py::handle& ids, const char* fn) {
  if (py::isinstance<py::str>(ids) || py::isinstance<py::bytes>(ids))
    throw py::type_error(std::string(fn) + ": ids must be a sequence of ints, not str");
  std::vector<int64_t> out;
  for (const auto& item : py::iter(ids)) {
    py::object v = py::reinterpret_borrow<py::object>(item);
    if (py::hasattr(v, "__index__") && !py::isinstance<py::bool_>(v)) {
      out.push_back(py::cast<int64_t>(v.attr("__index__")()));
    } else {
      throw py::type_error(std::string(fn) + ": ids must be ints, got " +
                           std::string(py::str(py::type::of(v).attr("__name__"))));
    }
  }
  return out;
}

}  // namespace

void bind_tokenizer(py::module_& m) {
  py::class_<text::StreamDecoder>(m, "DecodeStream",
                                  "Ids in one at a time, text out: step(id) returns the text completed by this id "
                                  "(a UTF-8 character cut by a byte token waits for its last byte); flush() returns "
                                  "what is held back and starts over.")
      .def("step", [](text::StreamDecoder& s, int64_t id) { return s.push(id); }, py::arg("id"))
      .def("flush", &text::StreamDecoder::flush);

  py::class_<Tokenizer>(m, "Tokenizer",
                        "A language model's tokenizer (byte-level BPE: GPT-2, SmolLM2, Llama 3, Qwen 2; SentencePiece "
                        "BPE with byte fallback: Llama 2, Mistral), giving the ids of Hugging Face tokenizers.")
      .def_static(
          "from_pretrained",
          [](const py::object& path) { return value_errors([&] { return text::load_tokenizer(fs_path(path)); }); },
          py::arg("path"),
          "Loads a .gguf file, a tokenizer.json, or a folder holding tokenizer.json (str or os.PathLike); bos and eos "
          "come from tokenizer_config.json / special_tokens_map.json beside it. A file or a component this reader "
          "does not implement raises ValueError naming the file and the key.")
      .def(
          "encode",
          [](const Tokenizer& t, const std::string& text, bool add_special_tokens) {
            return t.encode(text, add_special_tokens);
          },
          py::arg("text"), py::arg("add_special_tokens") = true,
          "text -> list of ids; add_special_tokens adds what the post-processor adds (bos for Llama), as HF.")
      .def(
          "decode",
          [](const Tokenizer& t, const py::object& ids, bool skip) { return t.decode(to_ids(ids, "decode"), skip); },
          py::arg("ids"), py::arg("skip_special_tokens") = false, "ids -> str, as HF's decode.")
      .def(
          "decode_bytes",
          [](const Tokenizer& t, const py::object& ids, bool skip) {
            return py::bytes(t.decode_bytes(to_ids(ids, "decode_bytes"), skip));
          },
          py::arg("ids"), py::arg("skip_special_tokens") = false,
          "ids -> the decoder's bytes, unchanged (a byte token may end inside a UTF-8 character).")
      .def(
          "convert_ids_to_tokens",
          [](const Tokenizer& t, const py::object& ids) -> py::object {
            if (py::isinstance<py::int_>(ids) && !py::isinstance<py::bool_>(ids))
              return py::str(t.token(ids.cast<int64_t>()));
            py::list out;
            for (int64_t id : to_ids(ids, "convert_ids_to_tokens")) out.append(py::str(t.token(id)));
            return out;
          },
          py::arg("ids"), "An id -> its token string; a list of ids -> a list of token strings.")
      .def(
          "convert_tokens_to_ids",
          [](const Tokenizer& t, const py::object& tokens) -> py::object {
            if (py::isinstance<py::str>(tokens)) return py::cast(t.id(tokens.cast<std::string>()));
            py::list out;
            for (const auto& tok : tokens) out.append(t.id(tok.cast<std::string>()));
            return out;
          },
          py::arg("tokens"), "A token string -> its id (None-free: -1 when absent); a list -> a list.")
      .def(
          "decode_stream", [](const Tokenizer& t, bool skip) { return text::StreamDecoder(t, skip); },
          py::arg("skip_special_tokens") = false, py::keep_alive<0, 1>(),
          "A DecodeStream over this tokenizer.")
      .def_property_readonly("vocab_size", &Tokenizer::vocab_size)
      .def("__len__", &Tokenizer::vocab_size)
      .def_property_readonly("bos_token_id",
                             [](const Tokenizer& t) -> py::object {
                               return t.bos_token_id() < 0 ? py::none() : py::cast(t.bos_token_id());
                             })
      .def_property_readonly("eos_token_id",
                             [](const Tokenizer& t) -> py::object {
                               return t.eos_token_id() < 0 ? py::none() : py::cast(t.eos_token_id());
                             })
      .def_property_readonly("all_special_ids", &Tokenizer::special_token_ids);
}

}  // namespace qkv::python
