// BERT from qkv modules: BertEmbeddings + nn::TransformerEncoder (post-LN), the HF name mapping, the packed
// (padding-free) forward and its padded twin, and the pooling helpers of sentence-transformers.
#include "qkv/models/bert.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "qkv/core/error.h"
#include "qkv/nn/init.h"
#include "qkv/ops/elementwise.h"
#include "qkv/ops/layer_norm.h"
#include "qkv/ops/shape_ops.h"

namespace qkv::models {
namespace {

nn::TransformerLayerConfig layer_config(const BertConfig& c) {
  nn::TransformerLayerConfig l;
  l.d_model = c.hidden_size;
  l.nhead = c.num_attention_heads;
  l.dim_feedforward = c.intermediate_size;
  l.dropout = 0.0f;  // inference only
  l.activation = c.hidden_act;
  l.layer_norm_eps = c.layer_norm_eps;
  l.norm_first = false;  // BERT is post-LN
  return l;
}

const BertConfig& checked(const BertConfig& c) {
  QKV_CHECK_ARG(c.vocab_size > 0 && c.hidden_size > 0 && c.num_hidden_layers >= 0 && c.num_attention_heads > 0 &&
                    c.intermediate_size > 0 && c.max_position_embeddings > 0 && c.type_vocab_size > 0,
                "[bert] config sizes must be positive: vocab ", c.vocab_size, ", hidden ", c.hidden_size,
                ", layers ", c.num_hidden_layers, ", heads ", c.num_attention_heads, ", intermediate ",
                c.intermediate_size, ", positions ", c.max_position_embeddings, ", types ", c.type_vocab_size);
  QKV_CHECK_ARG(c.hidden_size % c.num_attention_heads == 0, "[bert] hidden_size ", c.hidden_size,
                " must be divisible by num_attention_heads ", c.num_attention_heads);
  return c;
}

// HF BertLayer name (after "encoder.layer.N.") -> nn::TransformerEncoderLayer name (after "encoder.layers.N.").
// query/key/value are handled apart: they are stacked into self_attn.in_proj_{weight,bias}.
struct NamePair {
  const char* hf;
  const char* qkv;
};
constexpr NamePair kLayerNames[] = {
    {"attention.output.dense.weight", "self_attn.out_proj.weight"},
    {"attention.output.dense.bias", "self_attn.out_proj.bias"},
    {"attention.output.LayerNorm.weight", "norm1.weight"},
    {"attention.output.LayerNorm.bias", "norm1.bias"},
    {"intermediate.dense.weight", "linear1.weight"},
    {"intermediate.dense.bias", "linear1.bias"},
    {"output.dense.weight", "linear2.weight"},
    {"output.dense.bias", "linear2.bias"},
    {"output.LayerNorm.weight", "norm2.weight"},
    {"output.LayerNorm.bias", "norm2.bias"},
};
constexpr NamePair kEmbeddingNames[] = {
    {"embeddings.word_embeddings.weight", "embeddings.word_embeddings.weight"},
    {"embeddings.position_embeddings.weight", "embeddings.position_embeddings.weight"},
    {"embeddings.token_type_embeddings.weight", "embeddings.token_type_embeddings.weight"},
    {"embeddings.LayerNorm.weight", "embeddings.norm.weight"},
    {"embeddings.LayerNorm.bias", "embeddings.norm.bias"},
};
constexpr const char* kQkv[] = {"query", "key", "value"};

}  // namespace

// --- embeddings ----------------------------------------------------------------------------------------------

BertEmbeddings::BertEmbeddings(const BertConfig& c, Rng& rng)
    : word_embeddings(nn::init_normal(rng, {checked(c).vocab_size, c.hidden_size})),
      position_embeddings(c.max_position_embeddings, c.hidden_size, rng),
      token_type_embeddings(c.type_vocab_size, c.hidden_size, rng),
      norm(c.hidden_size, c.layer_norm_eps) {
  register_module("word_embeddings", &word_embeddings);
  register_module("position_embeddings", &position_embeddings);
  register_module("token_type_embeddings", &token_type_embeddings);
  register_module("norm", &norm);
}

Tensor BertEmbeddings::forward(const std::vector<int64_t>& ids, const std::vector<int64_t>& positions,
                               const std::vector<int64_t>& token_types) const {
  QKV_CHECK_ARG(ids.size() == positions.size(), "[bert] ", ids.size(), " ids but ", positions.size(),
                " positions");
  QKV_CHECK_ARG(token_types.empty() || token_types.size() == ids.size(), "[bert] ", ids.size(), " ids but ",
                token_types.size(), " token types");
  const auto n = static_cast<int64_t>(ids.size());
  const int64_t v = word_embeddings.num_embeddings(), p = position_embeddings.num_embeddings();
  for (int64_t i = 0; i < n; ++i) {
    QKV_CHECK_ARG(ids[i] >= 0 && ids[i] < v, "[bert] token id ", ids[i], " at ", i, " is outside [0, ", v, ")");
    QKV_CHECK_ARG(positions[i] >= 0 && positions[i] < p, "[bert] position ", positions[i],
                  " is outside [0, max_position_embeddings = ", p, ")");
  }
  Tensor words = word_embeddings.forward(Ids{ids, {n}});
  const Tensor pos = position_embeddings.forward(Ids{positions, {n}});
  if (!token_types.empty()) {
    const int64_t types = token_type_embeddings.num_embeddings();
    for (int64_t i = 0; i < n; ++i)
      QKV_CHECK_ARG(token_types[i] >= 0 && token_types[i] < types, "[bert] token type ", token_types[i], " at ", i,
                    " is outside [0, ", types, ")");
    const Tensor type_rows = token_type_embeddings.forward(Ids{token_types, {n}});
    add_layer_norm_(words, add(type_rows, pos), Tensor(), norm.weight, norm.bias, norm.eps());
    return words;
  }
  const Tensor type0 = token_type_embeddings.weight.select(0, 0);  // token_type_ids are all 0: (E), broadcast
  // norm(words + type0 + pos) in one fused pass, in place (HF's order of the sums).
  add_layer_norm_(words, pos, type0, norm.weight, norm.bias, norm.eps());
  return words;
}

// --- model -----------------------------------------------------------------------------------------------------

BertModel::BertModel(const BertConfig& c, Rng& rng)
    : embeddings(checked(c), rng), encoder(layer_config(c), c.num_hidden_layers, false, rng), config_(c) {
  register_module("embeddings", &embeddings);
  register_module("encoder", &encoder);
  eval();
}

// The one place where HF's BertModel names meet qkv's.
void BertModel::load_hf_state_dict(const nn::StateDict& hf) {
  const std::string prefix = hf.count("bert.embeddings.word_embeddings.weight") ? "bert." : "";
  std::map<std::string, Tensor*> params;
  for (auto& [name, p] : named_parameters()) params[name] = p;

  auto take = [&](const std::string& hf_name, const Shape& want) -> Tensor {
    auto it = hf.find(prefix + hf_name);
    QKV_CHECK_RUNTIME(it != hf.end(), "[bert] the weights have no tensor '", prefix + hf_name, "'");
    QKV_CHECK_RUNTIME(it->second.shape() == want, "[bert] tensor '", prefix + hf_name, "' has shape ",
                      str(it->second.shape()), ", the config expects ", str(want));
    return it->second;
  };
  auto want = [&](const std::string& qkv_name) { return params.at(qkv_name)->shape(); };

  nn::StateDict mapped;
  for (const NamePair& n : kEmbeddingNames) mapped[n.qkv] = take(n.hf, want(n.qkv));
  const int64_t e = config_.hidden_size;
  for (int64_t i = 0; i < config_.num_hidden_layers; ++i) {
    const std::string h = "encoder.layer." + std::to_string(i) + ".";
    const std::string q = "encoder.layers." + std::to_string(i) + ".";
    std::vector<Tensor> w, b;
    for (const char* part : kQkv) {
      w.push_back(take(h + "attention.self." + part + ".weight", {e, e}));
      b.push_back(take(h + "attention.self." + part + ".bias", {e}));
    }
    mapped[q + "self_attn.in_proj_weight"] = concat(w, 0);
    mapped[q + "self_attn.in_proj_bias"] = concat(b, 0);
    for (const NamePair& n : kLayerNames) mapped[q + n.qkv] = take(h + n.hf, want(q + n.qkv));
  }
  load_state_dict(mapped, /*strict=*/true);
}

nn::StateDict BertModel::hf_state_dict() const {
  const nn::StateDict own = state_dict();
  const int64_t e = config_.hidden_size;
  nn::StateDict hf;
  for (const NamePair& n : kEmbeddingNames) hf[n.hf] = own.at(n.qkv);
  for (int64_t i = 0; i < config_.num_hidden_layers; ++i) {
    const std::string h = "encoder.layer." + std::to_string(i) + ".";
    const std::string q = "encoder.layers." + std::to_string(i) + ".";
    const Tensor& w = own.at(q + "self_attn.in_proj_weight");
    const Tensor& b = own.at(q + "self_attn.in_proj_bias");
    for (int64_t k = 0; k < 3; ++k) {
      hf[h + "attention.self." + kQkv[k] + ".weight"] = w.slice(0, k * e, (k + 1) * e).clone();
      hf[h + "attention.self." + kQkv[k] + ".bias"] = b.slice(0, k * e, (k + 1) * e).clone();
    }
    for (const NamePair& n : kLayerNames) hf[h + n.hf] = own.at(q + n.qkv);
  }
  return hf;
}

Tensor BertModel::forward_packed(const std::vector<int64_t>& ids, const std::vector<int64_t>& lengths) {
  int64_t total = 0;
  for (int64_t len : lengths) {
    QKV_CHECK_ARG(len >= 1 && len <= config_.max_position_embeddings, "[bert] sequence length ", len,
                  " must be in [1, max_position_embeddings = ", config_.max_position_embeddings, "]");
    total += len;
  }
  QKV_CHECK_ARG(total == static_cast<int64_t>(ids.size()), "[bert] lengths add up to ", total, " but ",
                ids.size(), " ids were given");
  QKV_CHECK_ARG(total <= std::numeric_limits<int32_t>::max(), "[bert] ", total,
                " packed tokens exceed the int32 offsets of attention_varlen");
  std::vector<int64_t> positions;
  positions.reserve(ids.size());
  nn::AttentionMasks masks;  // each sequence attends to itself only: the encoder's packed path
  masks.cu_seqlens.push_back(0);
  for (int64_t len : lengths) {
    for (int64_t t = 0; t < len; ++t) positions.push_back(t);
    masks.cu_seqlens.push_back(static_cast<int32_t>(positions.size()));
  }
  const Tensor x = embeddings.forward(ids, positions);  // (N, E)
  if (total == 0) return x;
  return encoder.forward(x, masks);
}

Tensor BertModel::forward(const Ids& ids, const Ids& attention_mask) const {
  QKV_CHECK_ARG(ids.shape.size() == 2 && attention_mask.shape == ids.shape, "[bert] ids ", str(ids.shape),
                " and attention_mask ", str(attention_mask.shape), " must both be (B, T)");
  return forward(ids, attention_mask, ForwardOptions()).last_hidden_state;
}

BaseModelOutput BertModel::forward(const Ids& ids, const Ids& attention_mask, const ForwardOptions& options,
                                   const Ids& token_type_ids) const {
  QKV_CHECK_ARG(ids.shape.size() == 2 && static_cast<int64_t>(ids.data.size()) == shape_numel(ids.shape),
                "[bert] ids ", str(ids.shape), " must be (B, T) holding B·T values, got ", ids.data.size());
  QKV_CHECK_ARG((attention_mask.shape.empty() && attention_mask.data.empty()) || (attention_mask.shape == ids.shape &&
                                                 attention_mask.data.size() == ids.data.size()),
                "[bert] attention_mask ", str(attention_mask.shape), " must be empty or have the shape of ids ",
                str(ids.shape));
  QKV_CHECK_ARG((token_type_ids.shape.empty() && token_type_ids.data.empty()) || (token_type_ids.shape == ids.shape &&
                                                 token_type_ids.data.size() == ids.data.size()),
                "[bert] token_type_ids ", str(token_type_ids.shape), " must be empty or have the shape of ids ",
                str(ids.shape));
  const int64_t b = ids.shape[0], t = ids.shape[1];
  QKV_CHECK_ARG(t >= 1 && t <= config_.max_position_embeddings, "[bert] sequence length ", t,
                " must be in [1, max_position_embeddings = ", config_.max_position_embeddings, "]");
  std::vector<int64_t> positions(static_cast<size_t>(b * t));
  for (int64_t i = 0; i < b * t; ++i) positions[static_cast<size_t>(i)] = i % t;
  nn::AttentionMasks masks;
  // kBlock: nonzero = padding key; none at all when every position is a token
  const auto& m = attention_mask.data;
  if (std::any_of(m.begin(), m.end(), [](int64_t k) { return k == 0; })) {
    Tensor padding = Tensor::zeros({b, t});
    for (int64_t i = 0; i < b * t; ++i) padding.data()[i] = m[static_cast<size_t>(i)] ? 0.0f : 1.0f;
    masks.key_padding_mask = padding;
    masks.key_padding_mask_kind = MaskKind::kBlock;
  }
  const Tensor x = embeddings.forward(ids.data, positions, token_type_ids.data).view({b, t, config_.hidden_size});
  nn::StackRecord record;
  record.attention_layers = attention_layers_asked(options, encoder.num_layers(), "bert");
  if (!options.output_attentions) record.attention_layers.clear();
  record.output_hidden_states = options.output_hidden_states;
  BaseModelOutput out;
  out.last_hidden_state = encoder.forward(nn::Context(), x, masks, &record).value;
  if (options.output_attentions) out.attentions = std::move(record.attentions);
  if (options.output_hidden_states) out.hidden_states = std::move(record.hidden_states);
  return out;
}

// --- pooling -----------------------------------------------------------------------------------------------------

Tensor mean_pool_packed(const Tensor& hidden, const std::vector<int64_t>& lengths) {
  QKV_CHECK_ARG(hidden.dim() == 2, "[mean_pool] hidden ", str(hidden.shape()), " must be (N, E)");
  int64_t total = 0;
  for (int64_t len : lengths) {
    QKV_CHECK_ARG(len >= 1, "[mean_pool] every length must be >= 1, got ", len);
    total += len;
  }
  QKV_CHECK_ARG(total == hidden.size(0), "[mean_pool] lengths add up to ", total, " but hidden is ",
                str(hidden.shape()));
  const Tensor c = hidden.contiguous();
  const int64_t e = c.size(1);
  Tensor out = Tensor::zeros({static_cast<int64_t>(lengths.size()), e});
  const float* src = c.data();
  float* dst = out.data();
  for (size_t s = 0; s < lengths.size(); ++s) {
    float* row = dst + static_cast<int64_t>(s) * e;
    for (int64_t t = 0; t < lengths[s]; ++t, src += e)
      for (int64_t j = 0; j < e; ++j) row[j] += src[j];
    const auto count = static_cast<float>(lengths[s]);
    for (int64_t j = 0; j < e; ++j) row[j] /= count;
  }
  return out;
}

Tensor l2_normalize_rows(const Tensor& x) {
  QKV_CHECK_ARG(x.dim() == 2, "[l2_normalize] x ", str(x.shape()), " must be (B, E)");
  Tensor out = x.clone();
  const int64_t rows = out.size(0), e = out.size(1);
  float* p = out.data();
  for (int64_t r = 0; r < rows; ++r, p += e) {
    double ss = 0.0;
    for (int64_t j = 0; j < e; ++j) ss += static_cast<double>(p[j]) * p[j];
    const float inv = 1.0f / std::max(static_cast<float>(std::sqrt(ss)), 1e-12f);
    for (int64_t j = 0; j < e; ++j) p[j] *= inv;
  }
  return out;
}

}  // namespace qkv::models
