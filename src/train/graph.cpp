// Graph: nn::Linear/LayerNorm/Embedding/FeedForward/MultiheadAttention and the transformer layers and stacks as
// tape forwards, step for step as the modules' own forward (src/nn/*.cpp), reading the modules' parameter tensors.
#include "qkv/train/graph.h"

#include <limits>

#include "qkv/core/error.h"

namespace qkv::train {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

bool same_tensor(const Tensor& a, const Tensor& b) {
  return a.shares_storage(b) && a.offset() == b.offset() && a.shape() == b.shape() && a.strides() == b.strides();
}

// The same value on the tape: one projection may serve both.
bool same_var(const Var& a, const Var& b) {
  return a.tape == b.tape && a.slot == b.slot && same_tensor(a.value, b.value);
}

Tensor to_additive(const Tensor& m, MaskKind kind) {
  if (kind == MaskKind::kAdditive) return m;
  Tensor out = Tensor::empty(m.shape());
  float* po = out.data();
  const float* pm = m.data();
  const bool block = kind == MaskKind::kBlock;
  for_each_offset(m.shape(), m.strides(), [&](int64_t i, int64_t off) {
    po[i] = ((pm[off] != 0.0f) == block) ? kNegInf : 0.0f;
  });
  return out;
}

struct MaskPart {
  Tensor t;  // broadcastable to (B, H, Tq, Tk)
  MaskKind kind;
};

void check_sequence(const Var& x, int64_t d_model, const char* op, const char* name) {
  QKV_CHECK_ARG(x.defined() && x.dim() == 3 && x.size(2) == d_model, "[", op, "] ", name, " ",
                x.defined() ? str(x.shape()) : std::string("(undefined)"), " must be (B, T, d_model = ", d_model,
                ")");
}

}  // namespace

Graph::Graph(Tape& tape, ParameterSet& params, Rng* dropout_rng)
    : tape_(&tape), binder_(tape, params), rng_(dropout_rng) {}

Var Graph::dropout(const Var& x, float p, bool training) {
  if (!training || p == 0.0f) return x;
  QKV_CHECK_ARG(rng_ != nullptr, "[Graph] dropout p = ", p, " in training mode needs the Graph's dropout Rng");
  if (p >= 1.0f) return Var(Tensor::zeros(x.shape()));  // PyTorch: p == 1 zeroes everything
  return train::dropout(x, p, true, *rng_);
}

Var Graph::dropout(const nn::Dropout& d, const Var& x) { return dropout(x, d.p(), d.training()); }

Var Graph::linear(const nn::Linear& m, const Var& x) {
  return train::linear(x, param(m.weight), param(m.bias));
}

Var Graph::layer_norm(const nn::LayerNorm& m, const Var& x) {
  QKV_CHECK_ARG(x.defined() && x.dim() >= 1 && x.size(-1) == m.normalized_shape(), "[LayerNorm] x ",
                x.defined() ? str(x.shape()) : std::string("(undefined)"), " must end in normalized_shape ",
                m.normalized_shape());
  return train::layer_norm(x, param(m.weight), param(m.bias), m.eps());
}

Var Graph::embedding(const nn::Embedding& m, const Ids& ids) {
  return train::embedding(param(m.weight), ids, m.padding_idx());
}

Var Graph::feed_forward(const nn::FeedForward& m, const Var& x) {
  return linear(m.linear2, dropout(m.dropout, activation(linear(m.linear1, x), m.activation())));
}

Var Graph::multihead_attention(const nn::MultiheadAttention& m, const Var& query, const Var& key, const Var& value,
                               const nn::MhaForwardOptions& o, const Var& attn_bias) {
  QKV_CHECK_ARG(query.defined() && key.defined() && value.defined(),
                "[MultiheadAttention] query, key and value must be defined");
  QKV_CHECK_ARG((query.dim() == 3 || query.dim() == 2) && key.dim() == query.dim() && value.dim() == query.dim(),
                "[MultiheadAttention] query ", str(query.shape()), ", key ", str(key.shape()), " and value ",
                str(value.shape()), " must all be (B, T, dim) or all unbatched (T, dim)");
  const bool self = same_var(query, key) && same_var(key, value);
  const bool kv_same = same_var(key, value);
  const bool unbatched = query.dim() == 2;
  const Var q_in = unbatched ? unsqueeze(query, 0) : query;
  const Var k_in = unbatched ? unsqueeze(key, 0) : key;
  const Var v_in = unbatched ? unsqueeze(value, 0) : value;
  const int64_t B = q_in.size(0), Tq = q_in.size(1), Tk = k_in.size(1);
  const int64_t E = m.embed_dim(), H = m.num_heads(), D = m.head_dim();
  QKV_CHECK_ARG(q_in.size(2) == E, "[MultiheadAttention] query ", str(query.shape()),
                " must have last dim embed_dim = ", E);
  QKV_CHECK_ARG(k_in.size(2) == m.kdim() && v_in.size(2) == m.vdim(), "[MultiheadAttention] key ",
                str(key.shape()), " and value ", str(value.shape()), " must have last dims kdim = ", m.kdim(),
                " and vdim = ", m.vdim());
  QKV_CHECK_ARG(k_in.size(0) == B && v_in.size(0) == B && v_in.size(1) == Tk, "[MultiheadAttention] query ",
                str(query.shape()), ", key ", str(key.shape()), " and value ", str(value.shape()),
                " disagree on batch, or key and value on length");

  // --- masks, exactly as nn::MultiheadAttention::forward ---------------------------------------------------
  std::vector<MaskPart> parts;
  if (o.key_padding_mask.defined()) {
    QKV_CHECK_ARG(o.key_padding_mask_kind != MaskKind::kNone,
                  "[MultiheadAttention] key_padding_mask is given but key_padding_mask_kind is kNone");
    const Shape want = unbatched ? Shape{Tk} : Shape{B, Tk};
    QKV_CHECK_ARG(o.key_padding_mask.shape() == want, "[MultiheadAttention] key_padding_mask ",
                  str(o.key_padding_mask.shape()), " must be ", str(want), " for key ", str(key.shape()));
    Tensor kpm = unbatched ? o.key_padding_mask.unsqueeze(0) : o.key_padding_mask;
    parts.push_back({kpm.unsqueeze(1).unsqueeze(1), o.key_padding_mask_kind});
  }
  if (o.attn_mask.defined()) {
    QKV_CHECK_ARG(o.attn_mask_kind != MaskKind::kNone,
                  "[MultiheadAttention] attn_mask is given but attn_mask_kind is kNone");
    const Tensor& am = o.attn_mask;
    if (am.dim() == 2) {
      QKV_CHECK_ARG(am.size(0) == Tq && am.size(1) == Tk, "[MultiheadAttention] 2-D attn_mask ", str(am.shape()),
                    " must be (Tq, Tk) = ", str(Shape{Tq, Tk}));
      parts.push_back({am.unsqueeze(0).unsqueeze(0), o.attn_mask_kind});
    } else {
      QKV_CHECK_ARG(am.dim() == 3 && am.size(0) == B * H && am.size(1) == Tq && am.size(2) == Tk,
                    "[MultiheadAttention] attn_mask ", str(am.shape()), " must be (Tq, Tk) = ", str(Shape{Tq, Tk}),
                    " or (B*H, Tq, Tk) = ", str(Shape{B * H, Tq, Tk}));
      parts.push_back({am.reshape({B, H, Tq, Tk}), o.attn_mask_kind});
    }
  }
  for (const Tensor* bias : {&o.attn_bias, &attn_bias.value}) {
    if (!bias->defined()) continue;
    QKV_CHECK_ARG(bias->dim() <= 4 && broadcastable_to(bias->shape(), {B, H, Tq, Tk}), "[MultiheadAttention] attn_bias ",
                  str(bias->shape()), " must broadcast to (B, H, Tq, Tk) = ", str(Shape{B, H, Tq, Tk}));
  }
  if (o.attn_bias.defined()) parts.push_back({o.attn_bias, MaskKind::kAdditive});
  AttentionOptions ao;
  if (parts.size() == 1) {
    ao.mask = parts[0].t;
    ao.mask_kind = parts[0].kind;
  } else if (parts.size() > 1) {
    Tensor combined = to_additive(parts[0].t, parts[0].kind);
    for (size_t i = 1; i < parts.size(); ++i) combined = qkv::add(combined, to_additive(parts[i].t, parts[i].kind));
    ao.mask = combined;
    ao.mask_kind = MaskKind::kAdditive;
  }
  ao.causal = o.is_causal ? Causal::kTopLeft : Causal::kNone;

  // --- projections; heads as views (B, T, E) -> (B, T, H, D) -> (B, H, T, D) --------------------------------
  const Var W = param(m.in_proj_weight);
  const Var bias = param(m.in_proj_bias);
  const bool has_bias = m.in_proj_bias.defined();
  auto wrows = [&](int64_t i, int64_t n) { return slice(W, 0, i * E, (i + n) * E); };
  auto brows = [&](int64_t i, int64_t n) { return has_bias ? slice(bias, 0, i * E, (i + n) * E) : Var(); };
  auto heads = [&](const Var& p, int64_t T) { return transpose(reshape(p, {B, T, H, D}), 1, 2); };
  // (B, T, n·E) packed projections -> n head views (B, H, T, D) through one split node (its backward writes each
  // piece into the packed gradient without a zero-fill).
  auto packed_heads = [&](const Var& p, int64_t T, int64_t n) {
    std::vector<Var> pieces = split(reshape(p, {B, T, n, H, D}), std::vector<int64_t>(static_cast<size_t>(n), 1), 2);
    for (Var& piece : pieces) piece = transpose(squeeze(piece, 2), 1, 2);
    return pieces;
  };
  Var qh, kh, vh;
  if (m.packed() && self) {
    std::vector<Var> qkv = packed_heads(train::linear(q_in, W, bias), Tq, 3);
    qh = qkv[0];
    kh = qkv[1];
    vh = qkv[2];
  } else if (m.packed()) {
    qh = heads(train::linear(q_in, wrows(0, 1), brows(0, 1)), Tq);
    if (kv_same) {
      std::vector<Var> kv = packed_heads(train::linear(k_in, wrows(1, 2), brows(1, 2)), Tk, 2);
      kh = kv[0];
      vh = kv[1];
    } else {
      kh = heads(train::linear(k_in, wrows(1, 1), brows(1, 1)), Tk);
      vh = heads(train::linear(v_in, wrows(2, 1), brows(2, 1)), Tk);
    }
  } else {
    qh = heads(train::linear(q_in, param(m.q_proj_weight), brows(0, 1)), Tq);
    kh = heads(train::linear(k_in, param(m.k_proj_weight), brows(1, 1)), Tk);
    vh = heads(train::linear(v_in, param(m.v_proj_weight), brows(2, 1)), Tk);
  }

  // --- attention, merge heads, out_proj ----------------------------------------------------------------------
  Var attn;
  if (B * Tq == 0 || Tk == 0) {
    attn = Var(Tensor::zeros({B, H, Tq, D}));
  } else {
    AttentionExtras ex;
    ex.bias = attn_bias;
    if (m.training() && m.dropout() > 0.0f) {
      QKV_CHECK_ARG(rng_ != nullptr, "[MultiheadAttention] dropout ", m.dropout(),
                    " in training mode needs the Graph's dropout Rng");
      ex.dropout = m.dropout();
      ex.dropout_rng = rng_;
    }
    attn = attention(qh, kh, vh, ao, ex);
  }
  Var out = linear(m.out_proj, reshape(transpose(attn, 1, 2), {B, Tq, E}));
  return unbatched ? squeeze(out, 0) : out;
}

Var Graph::encoder_layer(const nn::TransformerEncoderLayer& m, const Var& src, const nn::AttentionMasks& masks) {
  check_sequence(src, m.config().d_model, "TransformerEncoderLayer", "src");
  const nn::MhaForwardOptions mo = nn::to_mha_options(masks);
  auto sa_block = [&](const Var& x) { return dropout(m.dropout1, multihead_attention(m.self_attn, x, x, x, mo)); };
  auto ff_block = [&](const Var& x) { return dropout(m.dropout2, feed_forward(m.ff, x)); };
  Var x = src;
  if (m.config().norm_first) {
    x = add(x, sa_block(layer_norm(m.norm1, x)));
    x = add(x, ff_block(layer_norm(m.norm2, x)));
  } else {
    x = layer_norm(m.norm1, add(x, sa_block(x)));
    x = layer_norm(m.norm2, add(x, ff_block(x)));
  }
  return x;
}

Var Graph::decoder_layer(const nn::TransformerDecoderLayer& m, const Var& tgt, const Var& memory,
                         const nn::AttentionMasks& tgt_masks, const nn::AttentionMasks& memory_masks) {
  check_sequence(tgt, m.config().d_model, "TransformerDecoderLayer", "tgt");
  check_sequence(memory, m.config().d_model, "TransformerDecoderLayer", "memory");
  QKV_CHECK_ARG(tgt.size(0) == memory.size(0), "[TransformerDecoderLayer] tgt ", str(tgt.shape()), " and memory ",
                str(memory.shape()), " must have the same batch size");
  const nn::MhaForwardOptions self_opts = nn::to_mha_options(tgt_masks);
  const nn::MhaForwardOptions cross_opts = nn::to_mha_options(memory_masks);
  auto sa_block = [&](const Var& x) {
    return dropout(m.dropout1, multihead_attention(m.self_attn, x, x, x, self_opts));
  };
  auto mha_block = [&](const Var& x) {
    return dropout(m.dropout2, multihead_attention(m.multihead_attn, x, memory, memory, cross_opts));
  };
  auto ff_block = [&](const Var& x) { return dropout(m.dropout3, feed_forward(m.ff, x)); };
  Var x = tgt;
  if (m.config().norm_first) {
    x = add(x, sa_block(layer_norm(m.norm1, x)));
    x = add(x, mha_block(layer_norm(m.norm2, x)));
    x = add(x, ff_block(layer_norm(m.norm3, x)));
  } else {
    x = layer_norm(m.norm1, add(x, sa_block(x)));
    x = layer_norm(m.norm2, add(x, mha_block(x)));
    x = layer_norm(m.norm3, add(x, ff_block(x)));
  }
  return x;
}

Var Graph::encoder(const nn::TransformerEncoder& m, const Var& src, const nn::AttentionMasks& masks) {
  Var x = src;
  for (const auto& layer : m.layers) x = encoder_layer(*layer, x, masks);
  if (m.norm) x = layer_norm(*m.norm, x);
  return x;
}

Var Graph::decoder(const nn::TransformerDecoder& m, const Var& tgt, const Var& memory,
                   const nn::AttentionMasks& tgt_masks, const nn::AttentionMasks& memory_masks) {
  Var x = tgt;
  for (const auto& layer : m.layers) x = decoder_layer(*layer, x, memory, tgt_masks, memory_masks);
  if (m.norm) x = layer_norm(*m.norm, x);
  return x;
}

Var Graph::transformer(const nn::Transformer& m, const Var& src, const Var& tgt, const nn::AttentionMasks& src_masks,
                       const nn::AttentionMasks& tgt_masks, const nn::AttentionMasks& memory_masks) {
  return decoder(m.decoder, tgt, encoder(m.encoder, src, src_masks), tgt_masks, memory_masks);
}

}  // namespace qkv::train
