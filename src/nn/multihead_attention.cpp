// nn::MultiheadAttention: in-projection (packed or separate), heads split as strided views, one qkv::attention call,
// heads merged and out_proj. Masks of any kind are combined into one mask broadcast over (B, H, Tq, Tk).
#include "qkv/nn/multihead_attention.h"

#include <cmath>
#include <limits>
#include <vector>

#include "qkv/core/error.h"
#include "qkv/ops/dropout.h"
#include "qkv/ops/elementwise.h"
#include "qkv/ops/matmul.h"

namespace qkv::nn {
namespace {

// Validates the constructor's sizes before any member (out_proj) is built, so errors name this module.
int64_t checked_embed_dim(int64_t embed_dim, int64_t num_heads, float dropout, int64_t kdim, int64_t vdim) {
  QKV_CHECK_ARG(embed_dim > 0 && num_heads > 0, "[MultiheadAttention] embed_dim ", embed_dim, " and num_heads ",
                num_heads, " must be > 0");
  QKV_CHECK_ARG(embed_dim % num_heads == 0, "[MultiheadAttention] embed_dim ", embed_dim,
                " must be divisible by num_heads ", num_heads);
  QKV_CHECK_ARG(dropout >= 0.0f && dropout < 1.0f, "[MultiheadAttention] dropout must be in [0, 1), got ",
                dropout);
  QKV_CHECK_ARG(kdim >= 0 && vdim >= 0, "[MultiheadAttention] kdim ", kdim, " and vdim ", vdim,
                " must be >= 0 (0 means embed_dim)");
  return embed_dim;
}

// torch.nn.init.xavier_uniform_ on an (out, in) matrix: U(-a, a), a = sqrt(6 / (in + out)).
Tensor xavier_uniform(Rng& rng, int64_t out, int64_t in) {
  const float a = std::sqrt(6.0f / static_cast<float>(in + out));
  return rng.uniform({out, in}, -a, a);
}

bool same_tensor(const Tensor& a, const Tensor& b) {
  return a.shares_storage(b) && a.offset() == b.offset() && a.shape() == b.shape() && a.strides() == b.strides();
}

// A mask of any kind as an additive float tensor of the same shape (0 = allowed, -inf = blocked).
Tensor to_additive(const Tensor& m, MaskKind kind) {
  if (kind == MaskKind::kAdditive) return m;
  const float ninf = -std::numeric_limits<float>::infinity();
  Tensor out = Tensor::empty(m.shape());
  float* po = out.data();
  const float* pm = m.data();
  const bool block = kind == MaskKind::kBlock;
  for_each_offset(m.shape(), m.strides(), [&](int64_t i, int64_t off) {
    const bool nonzero = pm[off] != 0.0f;
    po[i] = (nonzero == block) ? ninf : 0.0f;
  });
  return out;
}

// weights (B, H, Tq, Tk) -> mean over H: (B, Tq, Tk).
Tensor mean_over_heads(const Tensor& w) {
  const Tensor c = w.contiguous();
  const int64_t B = c.size(0), H = c.size(1), inner = c.size(2) * c.size(3);
  Tensor out = Tensor::zeros({c.size(0), c.size(2), c.size(3)});
  const float* pw = c.data();
  float* po = out.data();
  const float inv = 1.0f / static_cast<float>(H);
  for (int64_t b = 0; b < B; ++b) {
    float* dst = po + b * inner;
    for (int64_t h = 0; h < H; ++h) {
      const float* src = pw + (b * H + h) * inner;
      for (int64_t i = 0; i < inner; ++i) dst[i] += src[i];
    }
    for (int64_t i = 0; i < inner; ++i) dst[i] *= inv;
  }
  return out;
}

struct MaskPart {
  Tensor t;  // broadcastable to (B, H, Tq, Tk)
  MaskKind kind;
};

}  // namespace

MultiheadAttention::MultiheadAttention(int64_t embed_dim, int64_t num_heads, Rng& rng, float dropout, bool bias,
                                       int64_t kdim, int64_t vdim)
    : out_proj(checked_embed_dim(embed_dim, num_heads, dropout, kdim, vdim), embed_dim, bias, rng),
      embed_dim_(embed_dim),
      num_heads_(num_heads),
      head_dim_(embed_dim / num_heads),
      kdim_(kdim == 0 ? embed_dim : kdim),
      vdim_(vdim == 0 ? embed_dim : vdim),
      dropout_(dropout),
      packed_(kdim_ == embed_dim && vdim_ == embed_dim),
      dropout_rng_((static_cast<uint64_t>(rng.next_u32()) << 32) | rng.next_u32()) {
  const int64_t E = embed_dim;
  if (packed_) {
    in_proj_weight = xavier_uniform(rng, 3 * E, E);
    register_parameter("in_proj_weight", &in_proj_weight);
  } else {
    q_proj_weight = xavier_uniform(rng, E, E);
    k_proj_weight = xavier_uniform(rng, E, kdim_);
    v_proj_weight = xavier_uniform(rng, E, vdim_);
    register_parameter("q_proj_weight", &q_proj_weight);
    register_parameter("k_proj_weight", &k_proj_weight);
    register_parameter("v_proj_weight", &v_proj_weight);
  }
  if (bias) {
    in_proj_bias = Tensor::zeros({3 * E});
    register_parameter("in_proj_bias", &in_proj_bias);
    out_proj.bias.fill(0.0f);  // PyTorch: constant_(out_proj.bias, 0)
  }
  register_module("out_proj", &out_proj);
}

MhaOutput MultiheadAttention::forward(const Tensor& query, const Tensor& key, const Tensor& value,
                                      const MhaForwardOptions& o) {
  QKV_CHECK_ARG(query.defined() && key.defined() && value.defined(),
                "[MultiheadAttention] query, key and value must be defined");
  QKV_CHECK_ARG((query.dim() == 3 || query.dim() == 2) && key.dim() == query.dim() && value.dim() == query.dim(),
                "[MultiheadAttention] query ", str(query.shape()), ", key ", str(key.shape()), " and value ",
                str(value.shape()), " must all be (B, T, dim) or all unbatched (T, dim)");
  const bool unbatched = query.dim() == 2;
  const Tensor q_in = unbatched ? query.unsqueeze(0) : query;
  const Tensor k_in = unbatched ? key.unsqueeze(0) : key;
  const Tensor v_in = unbatched ? value.unsqueeze(0) : value;
  const int64_t B = q_in.size(0), Tq = q_in.size(1), Tk = k_in.size(1);
  const int64_t E = embed_dim_, H = num_heads_, D = head_dim_;
  QKV_CHECK_ARG(q_in.size(2) == E, "[MultiheadAttention] query ", str(query.shape()),
                " must have last dim embed_dim = ", E);
  QKV_CHECK_ARG(k_in.size(2) == kdim_ && v_in.size(2) == vdim_, "[MultiheadAttention] key ", str(key.shape()),
                " and value ", str(value.shape()), " must have last dims kdim = ", kdim_, " and vdim = ", vdim_);
  QKV_CHECK_ARG(k_in.size(0) == B && v_in.size(0) == B && v_in.size(1) == Tk, "[MultiheadAttention] query ",
                str(query.shape()), ", key ", str(key.shape()), " and value ", str(value.shape()),
                " disagree on batch, or key and value on length");

  // --- masks: validate, then reduce to at most one mask broadcastable to (B, H, Tq, Tk) ---------------------
  std::vector<MaskPart> parts;
  if (o.key_padding_mask.defined()) {
    QKV_CHECK_ARG(o.key_padding_mask_kind != MaskKind::kNone,
                  "[MultiheadAttention] key_padding_mask is given but key_padding_mask_kind is kNone");
    const Shape want = unbatched ? Shape{Tk} : Shape{B, Tk};
    QKV_CHECK_ARG(o.key_padding_mask.shape() == want, "[MultiheadAttention] key_padding_mask ",
                  str(o.key_padding_mask.shape()), " must be ", str(want), " for key ", str(key.shape()));
    Tensor kpm = unbatched ? o.key_padding_mask.unsqueeze(0) : o.key_padding_mask;
    parts.push_back({kpm.unsqueeze(1).unsqueeze(1), o.key_padding_mask_kind});  // (B, 1, 1, Tk)
  }
  if (o.attn_mask.defined()) {
    QKV_CHECK_ARG(o.attn_mask_kind != MaskKind::kNone,
                  "[MultiheadAttention] attn_mask is given but attn_mask_kind is kNone");
    const Tensor& m = o.attn_mask;
    if (m.dim() == 2) {
      QKV_CHECK_ARG(m.size(0) == Tq && m.size(1) == Tk, "[MultiheadAttention] 2-D attn_mask ", str(m.shape()),
                    " must be (Tq, Tk) = ", str(Shape{Tq, Tk}));
      parts.push_back({m.unsqueeze(0).unsqueeze(0), o.attn_mask_kind});
    } else {
      QKV_CHECK_ARG(m.dim() == 3 && m.size(0) == B * H && m.size(1) == Tq && m.size(2) == Tk,
                    "[MultiheadAttention] attn_mask ", str(m.shape()), " must be (Tq, Tk) = ", str(Shape{Tq, Tk}),
                    " or (B*H, Tq, Tk) = ", str(Shape{B * H, Tq, Tk}));
      parts.push_back({m.reshape({B, H, Tq, Tk}), o.attn_mask_kind});
    }
  }
  if (o.attn_bias.defined()) {
    QKV_CHECK_ARG(o.attn_bias.dim() <= 4 && broadcastable_to(o.attn_bias.shape(), {B, H, Tq, Tk}),
                  "[MultiheadAttention] attn_bias ", str(o.attn_bias.shape()), " must broadcast to (B, H, Tq, Tk) = ",
                  str(Shape{B, H, Tq, Tk}));
    parts.push_back({o.attn_bias, MaskKind::kAdditive});
  }

  // --- projections, heads as views (B, T, E) -> (B, T, H, D) -> (B, H, T, D) -------------------------------
  const bool has_bias = in_proj_bias.defined();
  auto wslice = [&](int64_t i) { return in_proj_weight.slice(0, i * E, (i + 1) * E); };
  auto bslice = [&](int64_t i, int64_t n = 1) {
    return has_bias ? in_proj_bias.slice(0, i * E, (i + n) * E) : Tensor();
  };
  auto heads = [&](const Tensor& p, int64_t T) { return p.view({B, T, H, D}).transpose(1, 2); };
  Tensor qh, kh, vh;
  if (packed_ && same_tensor(q_in, k_in) && same_tensor(k_in, v_in)) {
    // Self-attention: one (3E, E) projection, then q/k/v are strided views of its output.
    const Tensor qkv = linear(q_in, in_proj_weight, in_proj_bias).view({B, Tq, 3, H, D});
    qh = qkv.select(2, 0).transpose(1, 2);
    kh = qkv.select(2, 1).transpose(1, 2);
    vh = qkv.select(2, 2).transpose(1, 2);
  } else if (packed_) {
    qh = heads(linear(q_in, wslice(0), bslice(0)), Tq);
    if (same_tensor(k_in, v_in)) {  // key is value (cross-attention on memory): one (2E, E) projection
      const Tensor kv = linear(k_in, in_proj_weight.slice(0, E, 3 * E), bslice(1, 2)).view({B, Tk, 2, H, D});
      kh = kv.select(2, 0).transpose(1, 2);
      vh = kv.select(2, 1).transpose(1, 2);
    } else {
      kh = heads(linear(k_in, wslice(1), bslice(1)), Tk);
      vh = heads(linear(v_in, wslice(2), bslice(2)), Tk);
    }
  } else {
    qh = heads(linear(q_in, q_proj_weight, bslice(0)), Tq);
    kh = heads(linear(k_in, k_proj_weight, bslice(1)), Tk);
    vh = heads(linear(v_in, v_proj_weight, bslice(2)), Tk);
  }

  AttentionOptions ao;
  if (parts.size() == 1) {
    ao.mask = parts[0].t;
    ao.mask_kind = parts[0].kind;
  } else if (parts.size() > 1) {
    Tensor combined = to_additive(parts[0].t, parts[0].kind);
    for (size_t i = 1; i < parts.size(); ++i) combined = add(combined, to_additive(parts[i].t, parts[i].kind));
    ao.mask = combined;
    ao.mask_kind = MaskKind::kAdditive;
  }
  ao.causal = o.is_causal ? Causal::kTopLeft : Causal::kNone;

  // --- attention -------------------------------------------------------------------------------------------
  Tensor attn, weights;  // (B, H, Tq, D), (B, H, Tq, Tk)
  const bool drop = training() && dropout_ > 0.0f;
  if (B * Tq == 0 || Tk == 0) {
    // Nothing to attend to: every row is fully masked, so the output is 0 (and so are the weights).
    attn = Tensor::zeros({B, H, Tq, D});
    if (o.need_weights) weights = Tensor::zeros({B, H, Tq, Tk});
  } else if (drop) {
    // Dropout acts on the weights (as PyTorch), so they are materialised; the returned weights are the dropped ones.
    ao.return_weights = true;
    AttentionResult r = attention(qh, kh, vh, ao);
    weights = qkv::dropout(r.weights, dropout_, true, dropout_rng_).y;
    attn = matmul(weights, vh);
  } else {
    ao.return_weights = o.need_weights;
    AttentionResult r = attention(qh, kh, vh, ao);
    attn = r.out;
    weights = r.weights;
  }

  // --- merge heads (B, H, Tq, D) -> (B, Tq, H, D) -> (B, Tq, E), out_proj ----------------------------------
  MhaOutput result;
  result.out = out_proj.forward(attn.transpose(1, 2).reshape({B, Tq, E}));
  if (o.need_weights) result.weights = o.average_attn_weights ? mean_over_heads(weights) : weights;
  if (unbatched) {
    result.out = result.out.squeeze(0);
    if (result.weights.defined()) result.weights = result.weights.squeeze(0);
  }
  return result;
}

}  // namespace qkv::nn
