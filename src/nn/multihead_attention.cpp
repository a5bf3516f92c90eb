// nn::MultiheadAttention: in-projection (packed or separate), heads split as strided views, the attention core
// (nn::attend), heads merged and out_proj. Masks of any kind are combined into one mask broadcast over (B, H, Tq, Tk).
#include "qkv/nn/multihead_attention.h"

#include "qkv/nn/attention_core.h"
#include "qkv/nn/init.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "qkv/core/error.h"
#include "qkv/ops/elementwise.h"
#include "qkv/ops/functional.h"
#include "qkv/ops/matmul.h"

namespace qkv::nn {
namespace {

// Validates the constructor's sizes before any member (out_proj) is built, so errors name this module.
int64_t checked_embed_dim(int64_t embed_dim, int64_t num_heads, float dropout, int64_t kdim, int64_t vdim,
                          std::optional<int64_t> num_kv_heads) {
  QKV_CHECK_ARG(embed_dim > 0 && num_heads > 0, "[MultiheadAttention] embed_dim ", embed_dim, " and num_heads ",
                num_heads, " must be > 0");
  QKV_CHECK_ARG(embed_dim % num_heads == 0, "[MultiheadAttention] embed_dim ", embed_dim,
                " must be divisible by num_heads ", num_heads);
  if (num_kv_heads) {
    QKV_CHECK_ARG(*num_kv_heads >= 1 && num_heads % *num_kv_heads == 0, "[MultiheadAttention] num_kv_heads ",
                  *num_kv_heads, " must be >= 1 and divide num_heads ", num_heads);
  }
  QKV_CHECK_ARG(dropout >= 0.0f && dropout < 1.0f, "[MultiheadAttention] dropout must be in [0, 1), got ",
                dropout);
  QKV_CHECK_ARG(kdim >= 0 && vdim >= 0, "[MultiheadAttention] kdim ", kdim, " and vdim ", vdim,
                " must be >= 0 (0 means embed_dim)");
  return embed_dim;
}

// torch.nn.init.xavier_uniform_ on an (out, in) matrix: U(-a, a), a = sqrt(6 / (in + out)).
Tensor xavier_uniform(Rng& rng, int64_t out, int64_t in) {
  const float a = std::sqrt(6.0f / static_cast<float>(in + out));
  return init_uniform(rng, {out, in}, -a, a);
}

bool same_tensor(const Tensor& a, const Tensor& b) {
  return a.shares_storage(b) && a.offset() == b.offset() && a.shape() == b.shape() && a.strides() == b.strides();
}

// The same value (and, on a tape, the same node): one projection may serve both.
bool same_var(const ad::Var& a, const ad::Var& b) {
  return a.tape == b.tape && a.slot == b.slot && same_tensor(a.value, b.value);
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

// The op's window and soft-cap rules, checked here so that the error names this module and the caller's query.
void check_window_and_softcap(const MhaForwardOptions& o, const std::string& query) {
  QKV_CHECK_ARG(o.window_left >= -1 && o.window_right >= -1, "[MultiheadAttention] window_size (", o.window_left,
                ", ", o.window_right, ") must be >= -1 on each side (-1 = unbounded); query ", query);
  QKV_CHECK_ARG(std::isfinite(o.softcap) && o.softcap >= 0.0f, "[MultiheadAttention] softcap ", o.softcap,
                " must be finite and >= 0 (0 = off); query ", query);
}

struct MaskPart {
  Tensor t;  // broadcastable to (B, H, Tq, Tk)
  MaskKind kind;
};

}  // namespace

MultiheadAttention::MultiheadAttention(int64_t embed_dim, int64_t num_heads, Rng& rng, float dropout, bool bias,
                                       int64_t kdim, int64_t vdim, std::optional<int64_t> num_kv_heads)
    : out_proj(checked_embed_dim(embed_dim, num_heads, dropout, kdim, vdim, num_kv_heads), embed_dim, bias, rng),
      embed_dim_(embed_dim),
      num_heads_(num_heads),
      num_kv_heads_(num_kv_heads.value_or(num_heads)),
      head_dim_(embed_dim / num_heads),
      kdim_(kdim == 0 ? embed_dim : kdim),
      vdim_(vdim == 0 ? embed_dim : vdim),
      dropout_(dropout),
      packed_(kdim_ == embed_dim && vdim_ == embed_dim),
      dropout_rng_((static_cast<uint64_t>(rng.next_u32()) << 32) | rng.next_u32()) {
  const int64_t E = embed_dim, Ekv = num_kv_heads_ * head_dim_;
  if (packed_) {
    in_proj_weight = xavier_uniform(rng, row_of(3), E);
    register_parameter("in_proj_weight", &in_proj_weight);
    register_linear_weight(&in_proj_weight);
  } else {
    q_proj_weight = xavier_uniform(rng, E, E);
    k_proj_weight = xavier_uniform(rng, Ekv, kdim_);
    v_proj_weight = xavier_uniform(rng, Ekv, vdim_);
    register_parameter("q_proj_weight", &q_proj_weight);
    register_parameter("k_proj_weight", &k_proj_weight);
    register_parameter("v_proj_weight", &v_proj_weight);
    for (Tensor* w : {&q_proj_weight, &k_proj_weight, &v_proj_weight}) register_linear_weight(w);
  }
  if (bias) {
    in_proj_bias = Tensor::zeros({row_of(3)});
    register_parameter("in_proj_bias", &in_proj_bias);
    out_proj.bias.fill(0.0f);  // PyTorch: constant_(out_proj.bias, 0)
  }
  register_module("out_proj", &out_proj);
}

// q rows [0, E), k rows [E, E + Ekv), v rows [E + Ekv, E + 2·Ekv) of in_proj_weight and in_proj_bias.
int64_t MultiheadAttention::row_of(int64_t which) const {
  return which == 0 ? 0 : embed_dim_ + (which - 1) * num_kv_heads_ * head_dim_;
}

// x: (B, T, dim) -> x · W[rows row_of(which) .. row_of(which + n))ᵀ + b. Packed weights serve any n; separate
// ones serve n = 1 (which 0, 1, 2 = q, k, v).
ad::Var MultiheadAttention::project(const Context& c, const ad::Var& x, int64_t which, int64_t n) const {
  const int64_t r0 = row_of(which), r1 = row_of(which + n);
  if (uses_prepared_weights(c.tape() != nullptr, "MultiheadAttention", x.shape())) {
    const Tensor& w = packed_ ? in_proj_weight : which == 0 ? q_proj_weight : which == 1 ? k_proj_weight : v_proj_weight;
    const LinearWeight lw = packed_ ? linear_weight(w).rows(r0, r1) : linear_weight(w);
    const Tensor b = in_proj_bias.defined() ? in_proj_bias.slice(0, r0, r1) : Tensor();
    return ad::Var(linear(x.value, lw, b));
  }
  // fp32, or bf16 on the live weights (see Module::set_precision)
  const Precision p = precision();
  if (packed_ && which == 0 && n == 3) return ad::linear(x, c.param(in_proj_weight), c.param(in_proj_bias), p);
  const ad::Var bias = in_proj_bias.defined() ? ad::slice(c.param(in_proj_bias), 0, r0, r1) : ad::Var();
  if (packed_) return ad::linear(x, ad::slice(c.param(in_proj_weight), 0, r0, r1), bias, p);
  QKV_ASSERT(n == 1);
  const Tensor& w = which == 0 ? q_proj_weight : which == 1 ? k_proj_weight : v_proj_weight;
  return ad::linear(x, c.param(w), bias, p);
}

// The projections of q, k, v (which 0, 1, 2) .. which + n - 1, (B, T, features) -> n head views (B, H, T, D)
// for q, (B, Hkv, T, D) for k and v. Several pieces come from one split node (its backward writes each piece into
// the packed gradient without a zero-fill).
std::vector<ad::Var> MultiheadAttention::split_heads(const ad::Var& p, int64_t which, int64_t n) const {
  const int64_t B = p.size(0), T = p.size(1), D = head_dim_;
  std::vector<int64_t> heads;
  for (int64_t i = which; i < which + n; ++i) heads.push_back(i == 0 ? num_heads_ : num_kv_heads_);
  if (n == 1) return {ad::transpose(ad::reshape(p, {B, T, heads[0], D}), 1, 2)};
  std::vector<ad::Var> pieces = ad::split(ad::reshape(p, {B, T, (row_of(which + n) - row_of(which)) / D, D}), heads, 2);
  for (ad::Var& piece : pieces) piece = ad::transpose(piece, 1, 2);
  return pieces;
}

std::pair<Tensor, Tensor> MultiheadAttention::project_kv(const Tensor& key, const Tensor& value) const {
  QKV_CHECK_ARG(key.defined() && value.defined() && key.dim() == 3 && value.dim() == 3 && key.size(2) == kdim_ &&
                    value.size(2) == vdim_ && key.size(0) == value.size(0) && key.size(1) == value.size(1),
                "[MultiheadAttention] project_kv: key ", key.defined() ? str(key.shape()) : "()", " and value ",
                value.defined() ? str(value.shape()) : "()", " must be (B, Tk, kdim = ", kdim_, ") and (B, Tk, vdim = ",
                vdim_, ")");
  const Context c;
  if (packed_ && same_tensor(key, value)) {
    const std::vector<ad::Var> kv = split_heads(project(c, key, 1, 2), 1, 2);
    return {kv[0].value, kv[1].value};
  }
  return {split_heads(project(c, key, 1, 1), 1, 1)[0].value, split_heads(project(c, value, 2, 1), 2, 1)[0].value};
}

MhaResult MultiheadAttention::forward(const Context& c, const ad::Var& query, const ad::Var& key,
                                      const ad::Var& value, const MhaForwardOptions& o,
                                      const ad::Var& attn_bias) const {
  KvCache* cache = o.kv_cache;
  // Shapes in messages as the caller passed them (T, B, E under batch_first=False).
  auto shown = [&](const ad::Var& x) {
    Shape s = x.shape();
    if (!o.batch_first && s.size() == 3) std::swap(s[0], s[1]);
    return str(s);
  };
  const bool fixed = cache != nullptr && o.kv_cache_fixed;
  QKV_CHECK_ARG(query.defined() && (fixed || (key.defined() && value.defined())),
                "[MultiheadAttention] query, key and value must be defined");
  if (fixed) {
    QKV_CHECK_ARG(query.dim() == 3 && cache->ready() && cache->rows() == query.size(0) &&
                      cache->keys().size(1) == num_kv_heads_ && cache->keys().size(3) == head_dim_,
                  "[MultiheadAttention] query ", shown(query), " and a fixed kv_cache of ",
                  cache->ready() ? str(cache->keys().shape()) : std::string("(never filled)"),
                  " must be (B, Tq, E) and (B, num_kv_heads = ", num_kv_heads_, ", Tk, head_dim = ", head_dim_, ")");
  } else {
    QKV_CHECK_ARG((query.dim() == 3 || query.dim() == 2) && key.dim() == query.dim() && value.dim() == query.dim(),
                  "[MultiheadAttention] query ", shown(query), ", key ", shown(key), " and value ", shown(value),
                  " must all be ", o.batch_first ? "(B, T, dim)" : "(T, B, dim)", " or all unbatched (T, dim)");
  }
  QKV_CHECK_ARG(cache == nullptr || query.dim() == 3, "[MultiheadAttention] kv_cache needs batched (B, T, E) input, got ",
                shown(query));
  check_window_and_softcap(o, shown(query));
  const bool self = !fixed && same_var(query, key) && same_var(key, value);
  const bool kv_same = !fixed && same_var(key, value);
  if (!o.cu_seqlens.empty()) {
    QKV_CHECK_ARG(!attn_bias.defined(), "[MultiheadAttention] packed input (cu_seqlens) takes no trained attn_bias");
    return forward_packed(c, query, key, value, o, self);
  }
  const bool unbatched = query.dim() == 2;
  const ad::Var q_in = unbatched ? ad::unsqueeze(query, 0) : query;
  const ad::Var k_in = fixed ? ad::Var() : unbatched ? ad::unsqueeze(key, 0) : key;
  const ad::Var v_in = fixed ? ad::Var() : unbatched ? ad::unsqueeze(value, 0) : value;
  const int64_t E = embed_dim_, H = num_heads_;
  const int64_t B = q_in.size(0), Tq = q_in.size(1);
  const int64_t Tn = fixed ? 0 : k_in.size(1);  // new keys of this call
  const int64_t Tk = (cache && cache->ready() ? cache->length() : 0) + Tn;
  QKV_CHECK_ARG(q_in.size(2) == E, "[MultiheadAttention] query ", shown(query),
                " must have last dim embed_dim = ", E);
  if (!fixed) {
    QKV_CHECK_ARG(k_in.size(2) == kdim_ && v_in.size(2) == vdim_, "[MultiheadAttention] key ", shown(key),
                  " and value ", shown(value), " must have last dims kdim = ", kdim_, " and vdim = ", vdim_);
    QKV_CHECK_ARG(k_in.size(0) == B && v_in.size(0) == B && v_in.size(1) == Tn, "[MultiheadAttention] query ",
                  shown(query), ", key ", shown(key), " and value ", shown(value),
                  " disagree on batch, or key and value on length");
  }

  // --- masks: validate, then reduce to at most one mask broadcastable to (B, H, Tq, Tk) ---------------------
  std::vector<MaskPart> parts;
  if (o.key_padding_mask.defined()) {
    QKV_CHECK_ARG(o.key_padding_mask_kind != MaskKind::kNone,
                  "[MultiheadAttention] key_padding_mask is given but key_padding_mask_kind is kNone");
    const Shape want = unbatched ? Shape{Tk} : Shape{B, Tk};
    QKV_CHECK_ARG(o.key_padding_mask.shape() == want, "[MultiheadAttention] key_padding_mask ",
                  str(o.key_padding_mask.shape()), " must be ", str(want), " for key ", shown(key));
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
  for (const Tensor* bias : {&o.attn_bias, &attn_bias.value}) {
    if (!bias->defined()) continue;
    QKV_CHECK_ARG(bias->dim() <= 4 && broadcastable_to(bias->shape(), {B, H, Tq, Tk}),
                  "[MultiheadAttention] attn_bias ", str(bias->shape()), " must broadcast to (B, H, Tq, Tk) = ",
                  str(Shape{B, H, Tq, Tk}));
  }
  if (o.attn_bias.defined()) parts.push_back({o.attn_bias, MaskKind::kAdditive});
  AttentionOptions ao;
  ao.precision = attention_precision();
  if (parts.size() == 1) {
    ao.mask = parts[0].t;
    ao.mask_kind = parts[0].kind;
  } else if (parts.size() > 1) {
    Tensor combined = mask_to_additive(parts[0].t, parts[0].kind);
    for (size_t i = 1; i < parts.size(); ++i) combined = add(combined, mask_to_additive(parts[i].t, parts[i].kind));
    ao.mask = combined;
    ao.mask_kind = MaskKind::kAdditive;
  }
  // With a cache the new queries are the last Tq positions: causal aligns bottom-right.
  ao.causal = !o.is_causal ? Causal::kNone : cache ? Causal::kBottomRight : Causal::kTopLeft;
  ao.scale = o.scale;
  ao.window_left = o.window_left;
  ao.window_right = o.window_right;
  ao.softcap = o.softcap;
  ao.allow_empty = true;  // no query or no key: the op's zeros, as PyTorch

  // --- projections; heads as views (B, T, E) -> (B, T, H, D) -> (B, H, T, D) --------------------------------
  ad::Var qh, kh, vh;
  if (packed_ && self) {  // self-attention: one (3E, E) projection
    const std::vector<ad::Var> qkv = split_heads(project(c, q_in, 0, 3), 0, 3);
    qh = qkv[0];
    kh = qkv[1];
    vh = qkv[2];
  } else {
    qh = split_heads(project(c, q_in, 0, 1), 0, 1)[0];
    if (packed_ && kv_same) {  // key is value (cross-attention on memory): one (2·Ekv, E) projection
      const std::vector<ad::Var> kv = split_heads(project(c, k_in, 1, 2), 1, 2);
      kh = kv[0];
      vh = kv[1];
    } else if (!fixed) {  // (a fixed cache's keys and values are read by attend)
      kh = split_heads(project(c, k_in, 1, 1), 1, 1)[0];
      vh = split_heads(project(c, v_in, 2, 1), 2, 1)[0];
    }
  }
  // --- the core: rotary, the cache, the shard, the op, the weights (B, H, Tq, D) ------------------------------
  AttendOptions core;
  core.op = "MultiheadAttention";
  core.attention = ao;
  core.bias = attn_bias;
  core.dropout = training() ? dropout_ : 0.0f;
  core.rotary.enabled = o.rotary;
  core.rotary.base = o.rotary_base;
  core.cache = cache;
  core.cache_fixed = fixed;
  core.rel_k = o.rel_k;
  core.rel_v = o.rel_v;
  core.head_mask = o.head_mask;
  core.weights = !o.need_weights       ? AttendWeights::kNone
                 : o.recompute_weights ? AttendWeights::kRecomputed
                                       : AttendWeights::kWithOutput;
  const AttendResult attended = attend(c, qh, kh, vh, core);

  // --- merge heads (B, H, Tq, D) -> (B, Tq, H, D) -> (B, Tq, E), out_proj ----------------------------------
  MhaResult result;
  result.out = out_proj.forward(c, ad::reshape(ad::transpose(attended.out, 1, 2), {B, Tq, E}), o.out_proj_bias);
  if (o.need_weights)
    result.weights = o.average_attn_weights ? mean_over_heads(attended.weights) : attended.weights;
  if (unbatched) {
    result.out = ad::squeeze(result.out, 0);
    if (result.weights.defined()) result.weights = result.weights.squeeze(0);
  }
  return result;
}

// Packed sequences (N, dim): the projections as (N, H, D) views, attention_varlen per sequence, out_proj.
MhaResult MultiheadAttention::forward_packed(const Context& c, const ad::Var& query, const ad::Var& key,
                                             const ad::Var& value, const MhaForwardOptions& o, bool self) const {
  QKV_CHECK_ARG(query.dim() == 2 && key.dim() == 2 && value.dim() == 2 && query.size(1) == embed_dim_ &&
                    key.size(1) == kdim_ && value.size(1) == vdim_ && key.size(0) == query.size(0) &&
                    value.size(0) == query.size(0),
                "[MultiheadAttention] packed input (cu_seqlens): query ", str(query.shape()), ", key ",
                str(key.shape()), " and value ", str(value.shape()), " must be (N, embed_dim = ", embed_dim_,
                "), (N, kdim = ", kdim_, ") and (N, vdim = ", vdim_, ")");
  QKV_CHECK_ARG(!o.key_padding_mask.defined() && !o.attn_mask.defined() && !o.attn_bias.defined() &&
                    o.kv_cache == nullptr && !o.need_weights && !o.rotary && !o.rel_k.defined() &&
                    !o.head_mask.defined(),
                "[MultiheadAttention] packed input (cu_seqlens) takes no key_padding_mask, attn_mask, attn_bias, "
                "kv_cache, need_weights, rotary, rel_k or head_mask (query ", str(query.shape()), ")");
  check_window_and_softcap(o, str(query.shape()));
  QKV_CHECK_ARG(!(training() && dropout_ > 0.0f), "[MultiheadAttention] packed input (cu_seqlens) takes no "
                "attention-weight dropout in training mode (dropout ", dropout_, ")");
  const int64_t N = query.size(0), E = embed_dim_, H = num_heads_, Hkv = num_kv_heads_, D = head_dim_;
  ad::Var qh, kh, vh;  // (N, H, D) and (N, Hkv, D) views of the projections
  if (packed_ && self) {
    std::vector<ad::Var> qkv = ad::split(ad::reshape(project(c, query, 0, 3), {N, H + 2 * Hkv, D}), {H, Hkv, Hkv}, 1);
    qh = qkv[0];
    kh = qkv[1];
    vh = qkv[2];
  } else {
    qh = ad::reshape(project(c, query, 0, 1), {N, H, D});
    kh = ad::reshape(project(c, key, 1, 1), {N, Hkv, D});
    vh = ad::reshape(project(c, value, 2, 1), {N, Hkv, D});
  }
  AttendOptions core;
  core.op = "MultiheadAttention";
  core.attention.precision = attention_precision();  // bf16: q, k and v rounded once for every sequence
  core.attention.causal = o.is_causal ? Causal::kTopLeft : Causal::kNone;
  core.attention.scale = o.scale;
  core.attention.window_left = o.window_left;
  core.attention.window_right = o.window_right;
  core.attention.softcap = o.softcap;
  core.cu_seqlens = o.cu_seqlens;
  const ad::Var attn = attend(c, qh, kh, vh, core).out;
  MhaResult result;
  result.out = out_proj.forward(c, ad::reshape(attn, {N, E}), o.out_proj_bias);  // (N, H, D) contiguous: a view
  return result;
}

MhaResult MultiheadAttention::forward(const Tensor& query, const Tensor& key, const Tensor& value,
                                      const MhaForwardOptions& options) {
  return forward(Context(&dropout_rng_), query, key, value, options);
}

}  // namespace qkv::nn
