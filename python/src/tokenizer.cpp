// Bindings of the language-model tokenizers: qkv.Tokenizer.from_pretrained(path) (a .gguf file, a tokenizer.json,
// or a folder holding one) with HF's encode / decode / convert_ids_to_tokens, and its streaming decoder.
#include <pybind11/stl.h>

#include <optional>

#include "bindings.h"
#include "qkv/models/language_model.h"
#include "qkv/text/chat_template.h"
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

  // The chat template and the special tokens it is rendered with ride on the Python object (_chat_template: a
  // qkv.ChatTemplate or None; special_tokens_map: a dict), set by from_pretrained.
  py::class_<Tokenizer>(m, "Tokenizer", py::dynamic_attr(),
                        "A language model's tokenizer (byte-level BPE: GPT-2, SmolLM2, Llama 3, Qwen 2; SentencePiece "
                        "BPE with byte fallback: Llama 2, Mistral), giving the ids of Hugging Face tokenizers.")
      .def_static(
          "from_pretrained",
          [](const py::object& path_obj) {
            const std::string path = fs_path(path_obj);
            return value_errors([&] {
              std::unique_ptr<Tokenizer> t = text::load_tokenizer(path);
              std::optional<text::ChatTemplate> tmpl = models::load_chat_template(path);
              const json::Value tokens = models::chat_special_tokens(path, *t);
              py::dict special;
              for (const auto& [key, value] : tokens.members())
                special[py::str(key)] = py::str(value.as_string());
              py::object self = py::cast(std::move(t));
              self.attr("_chat_template") = tmpl ? py::cast(std::move(*tmpl)) : py::none();
              self.attr("special_tokens_map") = special;
              return self;
            });
          },
          py::arg("path"),
          "Loads a .gguf file, a tokenizer.json, or a folder holding tokenizer.json (str or os.PathLike); bos and eos "
          "come from tokenizer_config.json / special_tokens_map.json beside it. A file or a component this reader "
          "does not implement raises ValueError naming the file and the key. The chat template comes from the GGUF's "
          "tokenizer.chat_template or the folder's chat_template.jinja / tokenizer_config.json.")
      .def(
          "apply_chat_template",
          [](const py::object& self, const py::object& messages, bool add_generation_prompt, bool tokenize,
             const py::kwargs& kwargs) -> py::object {
            const py::object tmpl = py::getattr(self, "_chat_template", py::none());
            if (tmpl.is_none())
              throw py::value_error("[Tokenizer.apply_chat_template] this tokenizer has no chat template (none in the "
                                    "GGUF's tokenizer.chat_template, chat_template.jinja or tokenizer_config.json)");
            const char* fn = "Tokenizer.apply_chat_template";
            json::Value vars = to_json(py::getattr(self, "special_tokens_map", py::dict()), fn, "special_tokens_map");
            for (const auto& kv : kwargs) {  // like transformers: keyword arguments override the special tokens
              const std::string key = kv.first.cast<std::string>();
              vars.set(key, to_json(kv.second, fn, key));
            }
            const json::Value msgs = to_json(messages, fn, "messages");
            const text::ChatTemplate& t = tmpl.cast<const text::ChatTemplate&>();
            const Tokenizer& tok = self.cast<const Tokenizer&>();
            if (!tokenize) {
              py::gil_scoped_release nogil;
              return py::str(models::render_chat(t, vars, msgs, add_generation_prompt)).cast<py::object>();
            }
            std::vector<int64_t> ids;
            {
              py::gil_scoped_release nogil;
              ids = models::encode_chat(tok, models::render_chat(t, vars, msgs, add_generation_prompt), msgs);
            }
            return py::cast(ids);
          },
          py::arg("messages"), py::arg("add_generation_prompt") = false, py::arg("tokenize") = false,
          "messages: a list of {'role', 'content'} dicts -> the chat rendered by the model's template as transformers' "
          "apply_chat_template(messages, add_generation_prompt, tokenize=False) renders it (bos_token, eos_token and "
          "the other named special tokens, overridden by keyword arguments, are the template's variables). "
          "tokenize=True: the ids of that text, special tokens not added again, and text inside the messages kept "
          "plain even where it looks like a special token (what transformers' sanitize_control_tokens=True aims at); a "
          "list of ints, not transformers 5's BatchEncoding. A tokenizer without a template raises ValueError.")
      .def_property_readonly(
          "chat_template",
          [](const py::object& self) -> py::object {
            const py::object tmpl = py::getattr(self, "_chat_template", py::none());
            return tmpl.is_none() ? tmpl : tmpl.attr("source");
          },
          "The chat template's text, or None when the model ships none.")
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
