// SentenceEncoder: loads a sentence-transformers folder (config, vocab, safetensors weights, pooling settings)
// and encodes texts: WordPiece -> packed BERT forward -> mean pooling -> L2 normalisation.
#include <algorithm>
#include <numeric>

#include "model_files.h"
#include "qkv/core/error.h"
#include "qkv/core/safetensors.h"
#include "qkv/models/bert.h"
#include "qkv/nn/init.h"
#include "qkv/nn/serialize.h"

namespace qkv::models {
namespace {

constexpr const char* kOp = "SentenceEncoder";

std::string join(const std::string& dir, const std::string& name) {
  return dir.empty() || dir.back() == '/' ? dir + name : dir + "/" + name;
}

files::JsonObject object_in(const json::Value& v, const std::string& path, const char* op) {
  QKV_CHECK_RUNTIME(v.type() == json::Value::Type::kObject, "[", op, "] ", path, " must hold a JSON object, not ",
                    json::type_name(v.type()));
  return files::JsonObject{v, path, op};
}

// A special token in tokenizer_config.json: "[UNK]" or {"content": "[UNK]", ...}.
std::string special_token(const files::JsonObject& o, const std::string& key, const std::string& fallback) {
  const json::Value* v = o.get(key);
  if (v && v->type() == json::Value::Type::kObject) {
    const json::Value* content = v->find("content");
    QKV_CHECK_RUNTIME(content && content->type() == json::Value::Type::kString, "[", o.op, "] ", o.path, ": \"", key,
                      "\" has no string \"content\"");
    return content->as_string();
  }
  return o.string_or(key, fallback);
}

}  // namespace

BertConfig BertConfig::from_json_file(const std::string& path) {
  const json::Value doc = files::read_json(path, "bert");
  const files::JsonObject o = object_in(doc, path, "bert");
  const std::string model_type = o.string_or("model_type", "bert");
  QKV_CHECK_RUNTIME(model_type == "bert", "[bert] ", path, ": model_type \"", model_type,
                    "\" is not supported (only \"bert\")");
  const std::string positions = o.string_or("position_embedding_type", "absolute");
  QKV_CHECK_RUNTIME(positions == "absolute", "[bert] ", path, ": position_embedding_type \"", positions,
                    "\" is not supported (only \"absolute\")");
  BertConfig c;
  c.vocab_size = o.integer("vocab_size");
  c.hidden_size = o.integer("hidden_size");
  c.num_hidden_layers = o.integer("num_hidden_layers");
  c.num_attention_heads = o.integer("num_attention_heads");
  c.intermediate_size = o.integer("intermediate_size");
  c.max_position_embeddings = o.integer_or("max_position_embeddings", 512);
  c.type_vocab_size = o.integer_or("type_vocab_size", 2);
  c.layer_norm_eps = static_cast<float>(o.number_or("layer_norm_eps", 1e-12));
  const std::string act = o.string_or("hidden_act", "gelu");
  if (act == "gelu") {
    c.hidden_act = nn::Activation::kGelu;
  } else if (act == "gelu_new" || act == "gelu_pytorch_tanh") {
    c.hidden_act = nn::Activation::kGeluTanh;
  } else if (act == "relu") {
    c.hidden_act = nn::Activation::kRelu;
  } else {
    throw std::runtime_error("[bert] " + path + ": hidden_act \"" + act + "\" is not supported");
  }
  QKV_CHECK_RUNTIME(c.vocab_size > 0 && c.hidden_size > 0 && c.num_attention_heads > 0 && c.intermediate_size > 0 &&
                        c.max_position_embeddings > 0 && c.type_vocab_size > 0 && c.layer_norm_eps > 0.0f &&
                        c.hidden_size % c.num_attention_heads == 0,
                    "[bert] ", path, ": inconsistent sizes (hidden_size ", c.hidden_size, ", num_attention_heads ",
                    c.num_attention_heads, ", ...)");
  return c;
}

SentenceEncoder::SentenceEncoder(const std::string& dir, Precision precision) {
  QKV_CHECK_RUNTIME(files::exists(dir), "[", kOp, "] model folder ", dir, " does not exist");
  for (const char* required : {"config.json", "vocab.txt", "model.safetensors"}) {
    QKV_CHECK_RUNTIME(files::exists(join(dir, required)), "[", kOp, "] model folder ", dir, " has no ", required);
  }
  const BertConfig config = BertConfig::from_json_file(join(dir, "config.json"));

  // Tokenizer: vocab.txt + the options of tokenizer_config.json (BERT uncased defaults when absent).
  WordPieceOptions wp;
  int64_t tokenizer_max = config.max_position_embeddings;
  const std::string tok_path = join(dir, "tokenizer_config.json");
  if (files::exists(tok_path)) {
    const json::Value doc = files::read_json(tok_path, kOp);
    const files::JsonObject o = object_in(doc, tok_path, kOp);
    wp.lowercase = o.boolean_or("do_lower_case", true);
    wp.strip_accents = o.boolean_or("strip_accents", wp.lowercase);  // null: follows lower-casing, as BERT
    wp.tokenize_chinese_chars = o.boolean_or("tokenize_chinese_chars", true);
    wp.unk_token = special_token(o, "unk_token", wp.unk_token);
    wp.cls_token = special_token(o, "cls_token", wp.cls_token);
    wp.sep_token = special_token(o, "sep_token", wp.sep_token);
    wp.pad_token = special_token(o, "pad_token", wp.pad_token);
    wp.mask_token = special_token(o, "mask_token", wp.mask_token);
    if (o.has("model_max_length")) {
      const json::Value& m = *o.get("model_max_length");  // HF writes 1e30 for "no limit"
      if (m.type() == json::Value::Type::kNumber && m.as_number() >= 2 && m.as_number() < 1e9) {
        tokenizer_max = static_cast<int64_t>(m.as_number());
      }
    }
  }
  try {
    tokenizer_ = std::make_unique<WordPieceTokenizer>(WordPieceTokenizer::from_file(join(dir, "vocab.txt"), wp));
  } catch (const std::invalid_argument& e) {
    throw std::runtime_error(std::string("[") + kOp + "] " + join(dir, "vocab.txt") + ": " + e.what());
  }
  QKV_CHECK_RUNTIME(tokenizer_->vocab_size() == config.vocab_size, "[", kOp, "] vocab.txt has ",
                    tokenizer_->vocab_size(), " tokens but config.json says vocab_size ", config.vocab_size);

  // max_seq_length: sentence_bert_config.json, else the tokenizer's, capped by the position table (as ST does).
  max_seq_length_ = tokenizer_max;
  const std::string sbert_path = join(dir, "sentence_bert_config.json");
  if (files::exists(sbert_path)) {
    const json::Value doc = files::read_json(sbert_path, kOp);
    max_seq_length_ = object_in(doc, sbert_path, kOp).integer_or("max_seq_length", max_seq_length_);
  }
  max_seq_length_ = std::min(max_seq_length_, config.max_position_embeddings);
  QKV_CHECK_RUNTIME(max_seq_length_ >= 2, "[", kOp, "] max_seq_length ", max_seq_length_, " must be >= 2");

  // modules.json: Transformer -> Pooling (mean only) -> Normalize (optional). Absent: mean pooling, no Normalize.
  const std::string modules_path = join(dir, "modules.json");
  if (files::exists(modules_path)) {
    const json::Value doc = files::read_json(modules_path, kOp);
    QKV_CHECK_RUNTIME(doc.type() == json::Value::Type::kArray, "[", kOp, "] ", modules_path,
                      " must hold a JSON array of modules");
    for (const json::Value& m : doc.items()) {
      const files::JsonObject o = object_in(m, modules_path, kOp);
      const std::string type = o.string_or("type", "");
      const std::string name = type.substr(type.rfind('.') + 1);
      if (name == "Transformer") continue;
      if (name == "Normalize") {
        normalize_ = true;
      } else if (name == "Pooling") {
        const std::string pool_path = join(join(dir, o.string_or("path", "")), "config.json");
        QKV_CHECK_RUNTIME(files::exists(pool_path), "[", kOp, "] model folder ", dir, " has no ", pool_path);
        const json::Value pdoc = files::read_json(pool_path, kOp);
        const files::JsonObject p = object_in(pdoc, pool_path, kOp);
        const bool mean = p.boolean_or("pooling_mode_mean_tokens", false) ||
                          p.string_or("pooling_mode", "") == "mean";
        const bool other = p.boolean_or("pooling_mode_cls_token", false) ||
                           p.boolean_or("pooling_mode_max_tokens", false) ||
                           p.boolean_or("pooling_mode_mean_sqrt_len_tokens", false);
        QKV_CHECK_RUNTIME(mean && !other, "[", kOp, "] ", pool_path, ": only mean pooling is supported");
      } else {
        throw std::runtime_error(std::string("[") + kOp + "] " + modules_path + ": module type \"" + type +
                                 "\" is not supported");
      }
    }
  }

  Rng rng(0);
  {
    const nn::SkipInit skip;  // every weight is loaded below: nothing drawn
    model_ = std::make_unique<BertModel>(config, rng);
  }
  const std::string weights = join(dir, "model.safetensors");
  SafeTensorsFile st;
  try {
    st = load_safetensors(weights);
  } catch (const std::exception& e) {
    throw std::runtime_error(std::string("[") + kOp + "] " + weights + ": " + e.what());
  }
  try {
    nn::check_finite(st.tensors, "");
    model_->load_hf_state_dict(st.tensors);
  } catch (const std::exception& e) {
    throw std::runtime_error(std::string("[") + kOp + "] " + weights + ": " + e.what());
  }
  model_->set_precision(precision);  // the linear weights converted once, here
}

SentenceEncoder::~SentenceEncoder() = default;

Tensor SentenceEncoder::encode(const std::vector<std::string>& texts, int64_t batch_size) const {
  QKV_CHECK_ARG(batch_size >= 1, "[", kOp, "] batch_size must be >= 1, got ", batch_size);
  const auto n = static_cast<int64_t>(texts.size());
  const int64_t e = embedding_dim();
  std::vector<std::vector<int64_t>> ids(texts.size());
  for (size_t i = 0; i < texts.size(); ++i) ids[i] = tokenizer_->encode(texts[i], max_seq_length_);
  // Longest first, so that each batch holds similar lengths (the attention work per batch stays balanced).
  std::vector<int64_t> order(texts.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return ids[a].size() > ids[b].size(); });

  Tensor out = Tensor::empty({n, e});
  for (int64_t start = 0; start < n; start += batch_size) {
    const int64_t stop = std::min(n, start + batch_size);
    std::vector<int64_t> packed, lengths;
    for (int64_t k = start; k < stop; ++k) {
      const auto& row = ids[order[k]];
      packed.insert(packed.end(), row.begin(), row.end());
      lengths.push_back(static_cast<int64_t>(row.size()));
    }
    Tensor pooled = mean_pool_packed(model_->forward_packed(packed, lengths), lengths);
    if (normalize_) pooled = l2_normalize_rows(pooled);
    for (int64_t k = start; k < stop; ++k) {
      std::copy_n(pooled.data() + (k - start) * e, e, out.data() + order[k] * e);
    }
  }
  return out;
}

SentenceEncoder::TokenAttentions SentenceEncoder::attentions(const std::string& text, const std::string* second,
                                                             const std::vector<int64_t>& mask) const {
  std::vector<int64_t> ids = tokenizer_->encode(text, max_seq_length_);
  TokenAttentions r;
  r.first_length = static_cast<int64_t>(ids.size());
  std::vector<int64_t> types;
  if (second) {
    const std::vector<int64_t> b = tokenizer_->encode(*second, max_seq_length_);  // [CLS] b [SEP]: drop its [CLS]
    const auto total = static_cast<int64_t>(ids.size() + b.size() - 1);
    QKV_CHECK_ARG(total <= max_seq_length_, "[", kOp, "] the sentence pair has ", total,
                  " tokens, more than max_seq_length = ", max_seq_length_);
    types.assign(ids.size(), 0);
    ids.insert(ids.end(), b.begin() + 1, b.end());
    types.resize(ids.size(), 1);
  }
  if (!mask.empty()) {
    const int64_t mask_id = tokenizer_->token_to_id("[MASK]");
    QKV_CHECK_ARG(mask_id >= 0, "[", kOp, "] the vocabulary has no [MASK] token");
    for (int64_t p : mask) {
      QKV_CHECK_ARG(p >= 0 && p < static_cast<int64_t>(ids.size()), "[", kOp, "] mask position ", p,
                    " is outside [0, ", ids.size(), ")");
      ids[static_cast<size_t>(p)] = mask_id;
    }
  }
  for (int64_t id : ids) r.tokens.push_back(tokenizer_->id_to_token(id));
  const auto t = static_cast<int64_t>(ids.size());
  ForwardOptions o;
  o.output_attentions = true;
  const Ids type_ids = types.empty() ? Ids() : Ids{types, {1, t}};
  for (const Tensor& w : model_->forward(Ids{ids, {1, t}}, Ids(), o, type_ids).attentions)
    r.weights.push_back(w.select(0, 0).contiguous());  // (1, H, T, T) -> (H, T, T)
  return r;
}

}  // namespace qkv::models
