// Bindings of the BERT models: qkv.WordPieceTokenizer(vocab_path) and qkv.SentenceEncoder(model_dir) (encode, the
// viewer's attentions, and the BERT forward with output_attentions / output_hidden_states as transformers' BertModel).
// Thin: argument conversion only; the work happens in qkv::models with the GIL released.
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <optional>
#include <string>
#include <vector>

#include "bindings.h"
#include "qkv/models/bert.h"
#include "qkv/models/wordpiece.h"

namespace qkv::python {

namespace {

py::array_t<int64_t> to_numpy_ids(const Ids& ids) {
  std::vector<py::ssize_t> shape(ids.shape.begin(), ids.shape.end());
  py::array_t<int64_t> out(shape);
  std::copy(ids.data.begin(), ids.data.end(), out.mutable_data());
  return out;
}

// encoder(ids, attention_mask=None, token_type_ids=None, output_attentions=..., output_hidden_states=...): the
// BERT model's forward (models::BertModel::forward) as transformers' BertModel returns it.
py::object bert_outputs(const models::SentenceEncoder& e, const py::object& ids_obj, const py::object& mask_obj,
                        const py::object& types_obj, bool output_attentions, bool output_hidden_states,
                        const py::object& attention_layers) {
  const char* fn = "SentenceEncoder.forward";
  bool one_d = false;
  const Ids ids = to_ids(ids_obj, fn, one_d);
  auto same_shape = [&](const py::object& obj, const char* arg) {
    if (obj.is_none()) return Ids();
    bool arg_1d = false;
    Ids r = to_ids(obj, fn, arg_1d, arg);
    if (arg_1d != one_d || r.shape != ids.shape)
      throw py::value_error(std::string("[") + fn + "] " + arg + " must have the shape of ids");
    return r;
  };
  const Ids mask = same_shape(mask_obj, "attention_mask");
  const Ids types = same_shape(types_obj, "token_type_ids");
  const models::ForwardOptions o = forward_options(fn, output_attentions, output_hidden_states, attention_layers);
  models::BaseModelOutput out;
  {
    py::gil_scoped_release nogil;
    out = e.model().forward(ids, mask, o, types);
  }
  py::dict d;
  d["last_hidden_state"] = output_array(out.last_hidden_state, one_d);
  d["attentions"] = output_tuple(out.attentions, output_attentions, one_d);
  d["hidden_states"] = output_tuple(out.hidden_states, output_hidden_states, one_d);
  return namespace_of(d);
}

}  // namespace

void bind_bert(py::module_& m) {
  using models::SentenceEncoder;
  using models::WordPieceTokenizer;

  py::class_<WordPieceTokenizer>(m, "WordPieceTokenizer",
                                 "BERT's uncased WordPiece tokenizer; the same ids as HF's BertTokenizer.")
      .def(py::init([](const std::string& vocab_path) { return WordPieceTokenizer::from_file(vocab_path); }),
           py::arg("vocab_path"), "Loads BERT's vocab.txt (one token per line).")
      .def(
          "encode",
          [](const WordPieceTokenizer& t, const std::vector<std::string>& texts, int64_t max_length) {
            models::TokenBatch b;
            {
              py::gil_scoped_release nogil;
              b = t.encode_batch(texts, max_length);
            }
            return py::make_tuple(to_numpy_ids(b.ids), to_numpy_ids(b.attention_mask));
          },
          py::arg("texts"), py::arg("max_length") = 512,
          "texts: list of N str -> (ids, attention_mask), both int64 (N, T), right-padded to the longest row.")
      .def("tokenize", &WordPieceTokenizer::tokenize, py::arg("text"), "The word pieces of text, without [CLS]/[SEP].")
      .def("normalize", &WordPieceTokenizer::normalize, py::arg("text"), "BERT's normalizer alone.")
      .def("token_to_id", &WordPieceTokenizer::token_to_id, py::arg("token"), "-1 when absent.")
      .def("id_to_token", &WordPieceTokenizer::id_to_token, py::arg("id"))
      .def_property_readonly("vocab_size", &WordPieceTokenizer::vocab_size);

  py::class_<SentenceEncoder> encoder(m, "SentenceEncoder",
                                      "A sentence-transformers BERT model folder (all-MiniLM-L6-v2) run by qkv.");
  encoder
      .def(py::init([](const py::object& path_obj, const std::string& precision) {
             const std::string path = fs_path(path_obj);
             const Precision p = parse_precision(precision);
             try {
               py::gil_scoped_release nogil;
               return std::make_unique<SentenceEncoder>(path, p);
             } catch (const std::runtime_error& e) {
               throw py::value_error(e.what());  // a missing or broken folder: ValueError, as CausalLM
             }
           }),
           py::arg("path"), py::arg("precision") = "fp32",
           "Loads config.json, vocab.txt, model.safetensors (+ sentence_bert_config.json, 1_Pooling/config.json) "
           "from the folder `path` (str or os.PathLike); a missing or broken folder raises ValueError. "
           "precision: 'fp32' (default), 'bf16' or 'int8' for the linear layers (bf16 also for attention); the "
           "weights are converted once, here (docs/PRECISION.md).")
      .def(
          "encode",
          [](const SentenceEncoder& e, const std::vector<std::string>& texts, int64_t batch_size) {
            Tensor out;
            {
              py::gil_scoped_release nogil;
              out = e.encode(texts, batch_size);
            }
            return to_numpy(out);
          },
          py::arg("texts"), py::arg("batch_size") = 32,
          "texts: list of N str -> float32 (N, E) embeddings, mean-pooled and L2-normalised.")
      .def(
          "tokenize",
          [](const SentenceEncoder& e, const std::vector<std::string>& texts) {
            const models::TokenBatch b = e.tokenizer().encode_batch(texts, e.max_seq_length());
            return py::make_tuple(to_numpy_ids(b.ids), to_numpy_ids(b.attention_mask));
          },
          py::arg("texts"), "The ids encode() feeds the model: (ids, attention_mask) int64 (N, T).")
      .def(
          "attentions",
          [](const SentenceEncoder& e, const std::string& text, const std::optional<std::string>& second,
             const std::vector<int64_t>& mask) {
            SentenceEncoder::TokenAttentions r;
            {
              py::gil_scoped_release nogil;
              r = e.attentions(text, second ? &*second : nullptr, mask);
            }
            py::list layers;
            for (const Tensor& w : r.weights) layers.append(to_numpy(w.unsqueeze(0)));
            return py::make_tuple(r.tokens, layers);
          },
          py::arg("text"), py::arg("second") = py::none(), py::arg("mask") = std::vector<int64_t>{},
          "text [, second]: str -> (tokens, attentions): the T word pieces ([CLS] text [SEP] [second [SEP]]) and "
          "one float32 (1, H, T, T) array per layer, as transformers' output_attentions (bertviz's input). "
          "mask: token positions replaced by [MASK] first.")
      .def(
          "forward",
          [](const SentenceEncoder& e, const py::object& ids, const py::object& attention_mask,
             const py::object& token_type_ids, bool output_attentions, bool output_hidden_states,
             const py::object& attention_layers) {
            return bert_outputs(e, ids, attention_mask, token_type_ids, output_attentions, output_hidden_states,
                                attention_layers);
          },
          py::arg("ids"), py::arg("attention_mask") = py::none(), py::arg("token_type_ids") = py::none(),
          py::arg("output_attentions") = false, py::arg("output_hidden_states") = false, py::kw_only(),
          py::arg("attention_layers") = py::none(),
          "The BERT model under the pooling: transformers' BertModel(input_ids, attention_mask, token_type_ids, "
          "output_attentions=..., output_hidden_states=...). ids: int (T) or (B, T) (tokenize() gives them); "
          "attention_mask: 1 = token, 0 = padding (None: all tokens); token_type_ids: None for all 0 -> an object "
          "with .last_hidden_state (B, T, E); .attentions: one (B, H, T, T) array of probabilities per layer (0 at "
          "padded keys; None for a layer outside attention_layers when given), else None; .hidden_states: L + 1 "
          "arrays (B, T, E), the embeddings then each layer's output, else None. The batch axis is dropped for 1-D "
          "ids. No pooler output (the folder's pooler weights are not loaded).")
      .def_property_readonly("max_seq_length", &SentenceEncoder::max_seq_length)
      .def_property_readonly("embedding_dim", &SentenceEncoder::embedding_dim)
      .def_property_readonly("normalizes", &SentenceEncoder::normalizes)
      .def_property_readonly("precision",
                             [](const SentenceEncoder& e) { return std::string(precision_name(e.precision())); });
  encoder.attr("__call__") = encoder.attr("forward");  // encoder(ids, ...), as transformers' model(...)
}

}  // namespace qkv::python
