// Bindings of the Llama-style decoders: qkv.CausalLM.from_pretrained(path) (a .gguf file or a folder) with .config,
// .generation_config, .logits(ids) and .generate(...). Thin: argument conversion only; the work happens in
// qkv::models / qkv::decode with the GIL released.
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "bindings.h"
#include "qkv/core/error.h"
#include "qkv/decode/cached_step.h"
#include "qkv/decode/generate.h"
#include "qkv/decode/sampling.h"
#include "qkv/decode/search.h"
#include "qkv/models/language_model.h"
#include "qkv/models/llama.h"
#include "qkv/text/tokenizer.h"

namespace qkv::python {

namespace {

using models::LlamaForCausalLM;

// qkv.CausalLM: the decoder and the ids that end its replies (models::end_of_generation_ids).
struct CausalLM {
  std::unique_ptr<LlamaForCausalLM> model;
  std::vector<int64_t> stop_ids;  // ascending
};


// eos_token_id: None -> the model's stop ids; an int or a list of ints -> those; -1 or [] -> none (never stops).
std::vector<int64_t> stop_ids_arg(const CausalLM& m, const py::object& eos) {
  const char* fn = "[CausalLM.generate] ";
  if (eos.is_none()) return m.stop_ids;
  std::vector<int64_t> ids;
  auto add = [&](const py::handle& x) {
    if (py::isinstance<py::bool_>(x) || !py::hasattr(x, "__index__"))
      throw py::type_error(std::string(fn) + "eos_token_id must be None, an int or a list of ints, got " +
                           std::string(py::str(py::type::of(x).attr("__name__"))));
    const int64_t id = py::cast<int64_t>(x.attr("__index__")());
    if (id != -1) ids.push_back(id);
  };
  if (py::hasattr(eos, "__index__")) {
    add(eos);
  } else if (py::isinstance<py::str>(eos) || !py::isinstance<py::sequence>(eos)) {
    add(eos);  // raises TypeError
  } else {
    for (const auto& x : eos) add(x);
  }
  const int64_t v = m.model->config().vocab_size;
  for (int64_t id : ids)
    if (id < 0 || id >= v)
      throw py::value_error(std::string(fn) + "eos_token_id " + std::to_string(id) + " is outside [0, " +
                            std::to_string(v) + ") (-1 or [] never stops)");
  return ids;
}

// One prompt continued: greedy or sampled (decode::generate) or by beam search; the new ids, with the stop id that
// ended the reply (as transformers returns it).
std::vector<int64_t> continue_prompt(const LlamaForCausalLM& model, const std::vector<int64_t>& prompt,
                                     const decode::GenerateOptions& o, int64_t num_beams) {
  if (num_beams <= 1) {
    decode::Generation g = decode::generate(model, prompt, o);
    if (g.finish == decode::FinishReason::kStop) g.tokens.push_back(g.stop_id);
    return g.tokens;
  }
  if (o.max_new_tokens == 0) return {};
  QKV_CHECK_ARG(!prompt.empty(), "[CausalLM.generate] a prompt is empty: it needs at least one id");
  // transformers' beam search: scores are log-probabilities over the generated length (length_penalty 1.0)
  // the prompt but its last token runs at once; the search feeds that token first
  decode::CachedStep step = decode::cached_step(model, {{prompt.begin(), prompt.end() - 1}}, o.page_size, o.kv_cache);
  decode::SearchOptions so;
  so.max_len = o.max_new_tokens;
  so.bos = prompt.back();
  so.eos = o.stop_ids.empty() ? -1 : o.stop_ids[0];
  decode::BeamOptions bo;
  bo.beam_size = num_beams;
  bo.penalty = decode::LengthPenalty::kAverage;
  bo.alpha = 1.0;
  const auto best = decode::beam_search(step, so, bo);
  return best.at(0).empty() ? std::vector<int64_t>{} : best[0][0].tokens;
}

py::array_t<int64_t> to_numpy_ids(const std::vector<int64_t>& ids) {
  py::array_t<int64_t> r(static_cast<py::ssize_t>(ids.size()));
  std::copy(ids.begin(), ids.end(), r.mutable_data());
  return r;
}

py::object config_of(const LlamaForCausalLM& m) {
  const models::LlamaConfig& c = m.config();
  auto id = [](int64_t x) -> py::object { return x < 0 ? py::none() : py::cast(x); };
  py::dict d;
  d["model_type"] = c.model_type;
  d["vocab_size"] = c.vocab_size;
  d["hidden_size"] = c.hidden_size;
  d["intermediate_size"] = c.intermediate_size;
  d["num_hidden_layers"] = c.num_hidden_layers;
  d["num_attention_heads"] = c.num_attention_heads;
  d["num_key_value_heads"] = c.num_key_value_heads;
  d["head_dim"] = c.head_dim;
  d["max_position_embeddings"] = c.max_position_embeddings;
  d["rope_theta"] = c.rope_theta;
  d["rms_norm_eps"] = c.rms_norm_eps;
  d["tie_word_embeddings"] = c.tie_word_embeddings;
  d["sliding_window"] = c.sliding_window > 0 ? py::cast(c.sliding_window) : py::none();
  d["bos_token_id"] = id(c.bos_token_id);
  d["eos_token_id"] = id(c.eos_token_id);
  return namespace_of(d);
}

// model(ids, output_attentions=..., output_hidden_states=..., attention_mask=..., position_ids=...): a namespace with
// logits, attentions and hidden_states (tuples of float32 arrays, or None when not asked), batch axis dropped for
// 1-D ids.
py::object forward_outputs(const CausalLM& m, const py::object& ids_obj, bool output_attentions,
                           bool output_hidden_states, const py::object& attention_layers,
                           const py::object& mask_obj, const py::object& positions_obj) {
  const char* fn = "CausalLM.forward";
  bool one_d = false;
  const Ids ids = to_ids(ids_obj, fn, one_d);
  Ids mask;
  if (!mask_obj.is_none()) {
    bool mask_1d = false;
    mask = to_ids(mask_obj, fn, mask_1d, "attention_mask");
    if (mask_1d != one_d || mask.shape != ids.shape)
      throw py::value_error(std::string("[") + fn + "] attention_mask must have the shape of ids");
  }
  // position_ids: the shape of ids (one set per row), or (T) / (1, T) shared by the rows, as transformers takes them
  std::vector<int64_t> positions;
  if (!positions_obj.is_none()) {
    bool positions_1d = false;
    const Ids p = to_ids(positions_obj, fn, positions_1d, "position_ids");
    const int64_t t = ids.shape[1];
    if (p.shape != ids.shape && p.shape != (Shape{1, t}))
      throw py::value_error(std::string("[") + fn + "] position_ids must have the shape of ids, or (T) / (1, T) "
                            "shared by the rows, T = " + std::to_string(t));
    for (int64_t x : p.data)
      if (x < 0) throw py::value_error(std::string("[") + fn + "] position_ids holds " + std::to_string(x) + " < 0");
    positions = p.data;
  }
  const models::ForwardOptions o = forward_options(fn, output_attentions, output_hidden_states, attention_layers);
  models::CausalLMOutput out;
  {
    py::gil_scoped_release nogil;
    out = m.model->forward(ids, o, nullptr, mask, positions_obj.is_none() ? nullptr : &positions);
  }
  py::dict d;
  d["logits"] = output_array(out.logits, one_d);
  d["attentions"] = output_tuple(out.attentions, output_attentions, one_d);
  d["hidden_states"] = output_tuple(out.hidden_states, output_hidden_states, one_d);
  return namespace_of(d);
}

}  // namespace

void bind_llama(py::module_& m) {
  py::class_<CausalLM>(m, "CausalLM",
                       "A Llama / Mistral / Qwen 2 / Gemma 2 causal language model (a GGUF file, or a folder that "
                       "transformers' save_pretrained wrote) run by qkv.")
      .def_static(
          "from_pretrained",
          [](const py::object& path_obj, const py::object& precision) {
            const std::string path = fs_path(path_obj);
            std::optional<Precision> p;
            if (!precision.is_none()) p = parse_precision(py::cast<std::string>(precision));
            try {
              py::gil_scoped_release nogil;
              CausalLM lm;
              // None: the file's own types (a GGUF's quantized weights read in place; a folder's float32)
              lm.model = LlamaForCausalLM::from_pretrained(path, p);
              std::unique_ptr<text::Tokenizer> tok;
              try {
                tok = text::load_tokenizer(path);
              } catch (const std::runtime_error&) {
                // a folder without tokenizer.json: config.json's and generation_config.json's ids only
              }
              lm.stop_ids = models::end_of_generation_ids(path, tok.get());
              return lm;
            } catch (const std::runtime_error& e) {
              throw py::value_error(e.what());
            }
          },
          py::arg("path"), py::arg("precision") = py::none(),
          "Loads a .gguf file (its metadata and tensors, quantized ones dequantized) or a folder (config.json + "
          "model.safetensors or the shards of model.safetensors.index.json), str or os.PathLike; a missing or broken "
          "file raises ValueError. precision: None (the file's own types: a GGUF's quantized weights as stored), 'fp32', 'bf16' or 'int8' "
          "for the linear layers (bf16 also for attention); the weights are converted once, here "
          "(docs/PRECISION.md).")
      .def(
          "logits",
          [](const CausalLM& m, const py::object& ids_obj) {
            bool one_d = false;
            const Ids ids = to_ids(ids_obj, "CausalLM.logits", one_d);
            Tensor out;
            {
              py::gil_scoped_release nogil;
              out = m.model->logits(ids);
            }
            return to_numpy(one_d ? out.select(0, 0) : out);
          },
          py::arg("ids"), "ids: int (T) or (B, T) -> float32 logits (T, V) or (B, T, V).")
      .def(
          "forward",
          [](const CausalLM& m, const py::object& ids, bool output_attentions, bool output_hidden_states,
             const py::object& attention_layers, const py::object& attention_mask, const py::object& position_ids) {
            return forward_outputs(m, ids, output_attentions, output_hidden_states, attention_layers,
                                   attention_mask, position_ids);
          },
          py::arg("ids"), py::arg("output_attentions") = false, py::arg("output_hidden_states") = false,
          py::kw_only(), py::arg("attention_layers") = py::none(), py::arg("attention_mask") = py::none(),
          py::arg("position_ids") = py::none(),
          "transformers' model(ids, output_attentions=..., output_hidden_states=..., attention_mask=...). ids: int "
          "(T) or (B, T) -> an object with .logits (B, T, V); .attentions: one (B, H, T, T) array of probabilities "
          "per layer (H = num_attention_heads; None for a layer outside attention_layers when given), else None; "
          ".hidden_states: L + 1 arrays (B, T, E): the embeddings, each layer's output, the last one after the final "
          "norm (as transformers), else None. The batch axis is dropped for 1-D ids. The attention still runs its "
          "fused kernel; the probabilities are recomputed beside it.\n"
          "attention_mask: integers of the shape of ids, 1 = token, 0 = padding (left, as generate pads, or right); "
          "positions are 0 .. T-1 as in transformers' forward unless position_ids gives them: integers >= 0 of the "
          "shape of ids (one set per row; a left-padded batch with cumsum(mask) - 1, as transformers' generate, puts "
          "each row's tokens at the positions they have alone), or (T) / (1, T) shared by the rows. Each row then "
          "gets, at its tokens, what it gets alone "
          "(0 probability on padded keys). A query whose keys are all padding (a left-padded row's padding) gets "
          "attention output 0 and probabilities 0, where transformers' eager attention spreads it uniformly: finite "
          "values that belong to no sequence.")
      .def(
          "__call__",
          [](const CausalLM& m, const py::object& ids, bool output_attentions, bool output_hidden_states,
             const py::object& attention_layers, const py::object& attention_mask, const py::object& position_ids) {
            return forward_outputs(m, ids, output_attentions, output_hidden_states, attention_layers,
                                   attention_mask, position_ids);
          },
          py::arg("ids"), py::arg("output_attentions") = false, py::arg("output_hidden_states") = false,
          py::kw_only(), py::arg("attention_layers") = py::none(), py::arg("attention_mask") = py::none(),
          py::arg("position_ids") = py::none(),
          "The same as forward.")
      .def(
          "generate",
          [](const CausalLM& m, const py::object& ids_obj, int64_t max_new_tokens, const py::object& do_sample,
             const py::object& temperature, int64_t top_k, float top_p, uint64_t seed, const py::object& eos_token_id,
             int64_t num_beams, const py::object& attention_mask, const py::object& pad_token_id,
             int64_t page_size, const std::string& kv_cache) -> py::object {
            const char* fn = "CausalLM.generate";
            const std::string pre = std::string("[") + fn + "] ";
            if (kv_cache != "float32" && kv_cache != "bfloat16")
              throw py::value_error(pre + "kv_cache '" + kv_cache + "' is not one of 'float32', 'bfloat16'");
            if (max_new_tokens < 0)
              throw py::value_error(pre + "max_new_tokens must be >= 0, got " + std::to_string(max_new_tokens));
            if (num_beams < 1) throw py::value_error(pre + "num_beams must be >= 1, got " + std::to_string(num_beams));
            decode::GenerateOptions o;
            o.max_new_tokens = max_new_tokens;
            o.page_size = page_size;
            o.kv_cache = kv_cache == "bfloat16" ? Precision::kBFloat16 : Precision::kFloat32;
            o.stop_ids = stop_ids_arg(m, eos_token_id);
            // do_sample None: sampled when temperature > 0 (greedy at the default 0); False: greedy; True: sampled at
            // temperature (1.0 when not given), as transformers.
            const bool sample = do_sample.is_none() ? (!temperature.is_none() && temperature.cast<float>() > 0.0f)
                                                    : do_sample.cast<bool>();
            if (sample) {
              o.sampling.temperature = temperature.is_none() ? 1.0f : temperature.cast<float>();
              if (!(o.sampling.temperature > 0.0f))
                throw py::value_error(pre + "do_sample=True needs temperature > 0, got " +
                                      std::to_string(o.sampling.temperature));
              o.sampling.top_k = top_k;
              o.sampling.top_p = top_p;
              o.sampling.seed = seed;
            } else if (!(top_p > 0.0f && top_p <= 1.0f) || top_k < 0) {
              decode::SamplingOptions check;  // the same one-line errors as sampling gives
              check.top_k = top_k;
              check.top_p = top_p;
              decode::check_sampling(check);
            }
            if (num_beams > 1 && sample)
              throw py::value_error(pre + "num_beams > 1 is beam search, which does not sample: pass do_sample=False");
            if (num_beams > 1 && o.stop_ids.size() > 1) {
              std::string list;
              for (int64_t id : o.stop_ids) list += (list.empty() ? "" : ", ") + std::to_string(id);
              throw py::value_error(pre + "beam search ends hypotheses at one id; the stop ids are [" + list +
                                    "]: pass eos_token_id=<one of them> (or -1)");
            }
            // The prompts: a list of lists (each its own length), or ids (T) / (B, T) with an optional
            // attention_mask (B, T) whose ones mark each row's prompt (left padding, as transformers).
            std::vector<std::vector<int64_t>> prompts;
            bool ragged = false, one_d = false;
            Ids ids;
            if (py::isinstance<py::list>(ids_obj) || py::isinstance<py::tuple>(ids_obj)) {
              const py::sequence seq = ids_obj.cast<py::sequence>();
              ragged = seq.size() > 0 && (py::isinstance<py::list>(seq[0]) || py::isinstance<py::tuple>(seq[0]) ||
                                          py::isinstance<py::array>(seq[0]));
            }
            if (ragged) {
              if (!attention_mask.is_none())
                throw py::value_error(pre + "attention_mask goes with a (B, T) array of ids, not a list of prompts");
              for (const auto& row : ids_obj) {
                if (py::len(row) == 0) {  // reported below, before any prompt runs
                  prompts.emplace_back();
                  continue;
                }
                bool row_1d = false;
                const Ids r = to_ids(row, fn, row_1d);
                if (!row_1d) throw py::value_error(pre + "each prompt of a list must be 1-D ids");
                prompts.push_back(r.data);
              }
            } else {
              ids = to_ids(ids_obj, fn, one_d);
              const int64_t B = ids.shape[0], T = ids.shape[1];
              if (one_d && !attention_mask.is_none())
                throw py::value_error(pre + "attention_mask goes with (B, T) ids; a 1-D prompt needs none");
              std::vector<int64_t> mask(static_cast<size_t>(B * T), 1);
              if (!attention_mask.is_none()) {
                bool mask_1d = false;
                const Ids mk = to_ids(attention_mask, fn, mask_1d);
                if (mask_1d || mk.shape != ids.shape)
                  throw py::value_error(pre + "attention_mask must have the shape of ids (" + std::to_string(B) +
                                        ", " + std::to_string(T) + ")");
                mask = mk.data;
              }
              for (int64_t b = 0; b < B; ++b) {
                std::vector<int64_t> p;
                int64_t first = -1, last = -1;
                for (int64_t t = 0; t < T; ++t) {
                  const int64_t k = mask[static_cast<size_t>(b * T + t)];
                  if (k != 0 && k != 1)
                    throw py::value_error(pre + "attention_mask holds " + std::to_string(k) + "; only 0 and 1");
                  if (k == 1) {
                    if (first < 0) first = t;
                    if (last >= 0 && last != t - 1)
                      throw py::value_error(pre + "attention_mask row " + std::to_string(b) +
                                            " has a hole: each prompt must be one run of ones (left padding)");
                    last = t;
                    p.push_back(ids.data[static_cast<size_t>(b * T + t)]);
                  }
                }
                prompts.push_back(std::move(p));
              }
            }
            for (size_t b = 0; b < prompts.size(); ++b)
              if (prompts[b].empty())
                throw py::value_error(pre + "prompt " + std::to_string(b) + " is empty: it needs at least one id");
            std::vector<std::vector<int64_t>> outs(prompts.size());
            {
              py::gil_scoped_release nogil;
              for (size_t b = 0; b < prompts.size(); ++b)
                outs[b] = continue_prompt(*m.model, prompts[b], o, num_beams);
            }
            if (ragged) {
              py::list r;
              for (const auto& x : outs) r.append(to_numpy_ids(x));
              return r;
            }
            if (one_d) return to_numpy_ids(outs[0]);
            // (B, T) -> (B, T + N): each row's ids as given, its new ids, then pad ids (transformers' layout)
            int64_t pad = 0;
            if (!pad_token_id.is_none()) pad = pad_token_id.cast<int64_t>();
            else if (!m.stop_ids.empty()) pad = m.stop_ids[0];
            size_t n = 0;
            for (const auto& x : outs) n = std::max(n, x.size());
            const int64_t B = ids.shape[0], T = ids.shape[1], W = T + static_cast<int64_t>(n);
            py::array_t<int64_t> r({B, W});
            int64_t* d = r.mutable_data();
            for (int64_t b = 0; b < B; ++b) {
              std::copy_n(ids.data.begin() + b * T, T, d + b * W);
              const auto& x = outs[static_cast<size_t>(b)];
              std::copy(x.begin(), x.end(), d + b * W + T);
              std::fill(d + b * W + T + static_cast<int64_t>(x.size()), d + (b + 1) * W, pad);
            }
            return r;
          },
          py::arg("ids"), py::arg("max_new_tokens") = 256, py::kw_only(), py::arg("do_sample") = py::none(),
          py::arg("temperature") = py::none(), py::arg("top_k") = 0, py::arg("top_p") = 1.0f, py::arg("seed") = 0,
          py::arg("eos_token_id") = py::none(), py::arg("num_beams") = 1, py::arg("attention_mask") = py::none(),
          py::arg("pad_token_id") = py::none(), py::arg("page_size") = 0, py::arg("kv_cache") = "float32",
          "Continues prompts through the KV cache, up to max_new_tokens new ids each.\n"
          "ids: one prompt (T) -> int64 (N) new ids; a list of prompts of any lengths -> a list of such arrays; "
          "(B, T) ids (with attention_mask (B, T): ones mark each row's prompt, left padding) -> int64 (B, T + N): "
          "the ids as given, the new ids, then pad_token_id (default: the first stop id) where a row ended early, "
          "as transformers' generate. The prompts run one after another.\n"
          "Greedy by default; do_sample=True samples at temperature (default 1.0) with top_k, top_p and seed (the "
          "same seed gives the same ids); do_sample=None samples when temperature > 0.\n"
          "eos_token_id: None stops at the model's end-of-generation ids (generation_config.eos_token_id); an int or "
          "a list replaces them; -1 or [] never stops. The stop id that ends a reply is its last new id.\n"
          "num_beams > 1: beam search as transformers' (do_sample=False, length_penalty 1.0), one stop id.\n"
          "page_size > 0: a paged KV cache of that many positions a page, read in place by the attention.\n"
          "kv_cache: 'float32' (default) or 'bfloat16': the KV cache's storage; bfloat16 rounds keys and values to "
          "bfloat16 (round to nearest even) and reads half the bytes a token, as llama.cpp's --cache-type-k/v and "
          "vLLM's kv_cache_dtype.")
      .def_property_readonly(
          "config", [](const CausalLM& m) { return config_of(*m.model); },
          "The model's configuration with transformers' names (vocab_size, hidden_size, num_hidden_layers, "
          "num_attention_heads, num_key_value_heads, head_dim, max_position_embeddings, rope_theta, model_type, "
          "tie_word_embeddings, bos_token_id, eos_token_id, ...).")
      .def_property_readonly(
          "generation_config",
          [](const CausalLM& m) {
            py::dict d;
            d["eos_token_id"] = py::cast(m.stop_ids);
            const int64_t bos = m.model->config().bos_token_id;
            d["bos_token_id"] = bos < 0 ? py::none() : py::cast(bos);
            return namespace_of(d);
          },
          "eos_token_id: the ids generate stops at by default (a list, ascending); bos_token_id.")
      .def_property_readonly("vocab_size", [](const CausalLM& m) { return m.model->config().vocab_size; })
      .def_property_readonly("num_layers", [](const CausalLM& m) { return m.model->config().num_hidden_layers; })
      .def_property_readonly("model_type", [](const CausalLM& m) { return m.model->config().model_type; });
}

}  // namespace qkv::python
