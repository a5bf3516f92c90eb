// attention(): validation shared by every attention path (run once per call), the effective scale, and the one
// dispatch point: empty inputs, dropout, the fused kernel or the reference. The math lives in
// kernels/attention_reference.cpp and kernels/attention_flash.cpp; the plain float64 one in attention_plain.cpp.
#include "qkv/ops/attention.h"

#include <limits>

#include <algorithm>
#include <cmath>

#include "attention_internal.h"
#include "qkv/core/error.h"
#include "qkv/core/rng.h"
#include "qkv/kernels/attention_flash.h"
#include "qkv/kernels/attention_reference.h"
#include "qkv/ops/dropout.h"
#include "qkv/ops/elementwise.h"
#include "qkv/ops/lowp.h"
#include "qkv/ops/matmul.h"

namespace qkv {
namespace {

const char* kind_name(MaskKind kind) {
  switch (kind) {
    case MaskKind::kNone: return "kNone";
    case MaskKind::kKeep: return "kKeep";
    case MaskKind::kBlock: return "kBlock";
    case MaskKind::kAdditive: return "kAdditive";
  }
  return "unknown";
}

Shape leading(const Tensor& t) { return Shape(t.shape().begin(), t.shape().end() - 2); }

// NumPy broadcast of a and b; false when they do not broadcast.
bool broadcast_into(Shape& out, const Shape& a, const Shape& b) {
  const size_t n = std::max(a.size(), b.size());
  out.assign(n, 1);
  for (size_t i = 0; i < n; ++i) {
    const int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    const int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    if (da != db && da != 1 && db != 1) return false;
    out[i] = da == 1 ? db : da;
  }
  return true;
}

}  // namespace

Shape attention_check(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& options,
                      const char* op) {
  QKV_CHECK_ARG(q.defined() && k.defined() && v.defined(), "[", op, "] q, k and v must be defined tensors");
  QKV_CHECK_ARG(q.dim() >= 2, "[", op, "] q ", str(q.shape()), " must have rank >= 2: (..., Tq, Dk)");
  QKV_CHECK_ARG(k.dim() >= 2, "[", op, "] k ", str(k.shape()), " must have rank >= 2: (..., Tk, Dk)");
  QKV_CHECK_ARG(v.dim() >= 2, "[", op, "] v ", str(v.shape()), " must have rank >= 2: (..., Tk, Dv)");
  QKV_CHECK_ARG(q.size(-1) == k.size(-1), "[", op, "] q ", str(q.shape()), " and k ", str(k.shape()),
                " must have the same last dimension (Dk)");
  QKV_CHECK_ARG(k.size(-2) == v.size(-2), "[", op, "] k ", str(k.shape()), " and v ", str(v.shape()),
                " must have the same sequence length (Tk, dim -2)");
  QKV_CHECK_ARG(options.allow_empty || (q.size(-2) > 0 && k.size(-2) > 0 && q.size(-1) > 0 && v.size(-1) > 0),
                "[", op, "] q ", str(q.shape()), ", k ", str(k.shape()), " and v ", str(v.shape()),
                ": Tq, Tk, Dk and Dv must be nonzero");
  Shape qk, batch;
  if (options.enable_gqa) {
    // GQA: the head dims (-3) pair up by groups; only the dims before them broadcast.
    QKV_CHECK_ARG(q.dim() >= 3 && k.dim() >= 3 && v.dim() >= 3, "[", op, "] enable_gqa needs q ", str(q.shape()),
                  ", k ", str(k.shape()), " and v ", str(v.shape()), " of rank >= 3: (..., H, T, D)");
    const int64_t hq = q.size(-3), hkv = k.size(-3);
    QKV_CHECK_ARG(v.size(-3) == hkv, "[", op, "] enable_gqa: k ", str(k.shape()), " and v ", str(v.shape()),
                  " must have the same number of heads (dim -3)");
    QKV_CHECK_ARG(hkv > 0 && hq % hkv == 0, "[", op, "] enable_gqa: the query heads of q ", str(q.shape()),
                  " (", hq, ") must be a multiple of the kv heads of k ", str(k.shape()), " (", hkv, ")");
    const auto outer = [](const Tensor& t) { return Shape(t.shape().begin(), t.shape().end() - 3); };
    QKV_CHECK_ARG(broadcast_into(qk, outer(q), outer(k)) && broadcast_into(batch, qk, outer(v)), "[", op,
                  "] the dims before the heads of q ", str(q.shape()), ", k ", str(k.shape()), " and v ",
                  str(v.shape()), " do not broadcast");
    batch.push_back(hq);
  } else {
    QKV_CHECK_ARG(broadcast_into(qk, leading(q), leading(k)) && broadcast_into(batch, qk, leading(v)), "[", op,
                  "] the leading (batch) dims of q ", str(q.shape()), ", k ", str(k.shape()), " and v ",
                  str(v.shape()), " do not broadcast");
  }
  QKV_CHECK_ARG(options.window_left >= -1 && options.window_right >= -1, "[", op, "] window_size (",
                options.window_left, ", ", options.window_right, ") must be >= -1 on each side (-1 = unbounded); q ",
                str(q.shape()), ", k ", str(k.shape()));
  QKV_CHECK_ARG(options.precision != Precision::kInt8, "[", op, "] precision int8 is for linear layers only; "
                "attention runs in fp32 or bf16 (q ", str(q.shape()), ", k ", str(k.shape()), ")");
  QKV_CHECK_ARG(std::isfinite(options.softcap) && options.softcap >= 0.0f, "[", op, "] softcap ",
                options.softcap, " must be finite and >= 0 (0 = off); q ", str(q.shape()), ", k ", str(k.shape()));

  const bool has_mask = options.mask.defined();
  QKV_CHECK_ARG(!(has_mask && options.mask_kind == MaskKind::kNone), "[", op, "] mask ",
                str(options.mask.shape()), " given with mask_kind kNone; choose kKeep, kBlock or kAdditive");
  QKV_CHECK_ARG(has_mask || options.mask_kind == MaskKind::kNone, "[", op, "] mask_kind ",
                kind_name(options.mask_kind), " needs a mask tensor");
  if (has_mask) {
    Shape full = batch;
    full.push_back(q.size(-2));
    full.push_back(k.size(-2));
    QKV_CHECK_ARG(broadcastable_to(options.mask.shape(), full), "[", op, "] mask ", str(options.mask.shape()),
                  " does not broadcast to (batch..., Tq, Tk) = ", str(full), " of q ", str(q.shape()), ", k ",
                  str(k.shape()), " and v ", str(v.shape()));
  }
  QKV_CHECK_ARG(!options.scale || std::isfinite(*options.scale), "[", op, "] scale ",
                options.scale.value_or(0.0f), " must be finite (q ", str(q.shape()), ")");
  QKV_CHECK_ARG(options.dropout_p >= 0.0f && options.dropout_p < 1.0f, "[", op, "] dropout_p must be in [0, 1), got ",
                options.dropout_p);
  QKV_CHECK_ARG(options.dropout_p == 0.0f || options.dropout_rng != nullptr, "[", op, "] dropout_p ",
                options.dropout_p, " needs a dropout_rng");
  return batch;
}

Tensor mask_to_additive(const Tensor& m, MaskKind kind) {
  if (kind == MaskKind::kAdditive) return m;
  Tensor out = Tensor::empty(m.shape());
  float* po = out.data();
  const float* pm = m.data();
  const bool block = kind == MaskKind::kBlock;
  const float ninf = -std::numeric_limits<float>::infinity();
  for_each_offset(m.shape(), m.strides(), [&](int64_t i, int64_t off) { po[i] = ((pm[off] != 0.0f) == block) ? ninf : 0.0f; });
  return out;
}

AttentionOptions with_additive_bias(AttentionOptions o, const Tensor& bias) {
  if (!bias.defined()) return o;
  const Tensor m = o.mask_kind != MaskKind::kNone && o.mask.defined() ? mask_to_additive(o.mask, o.mask_kind) : Tensor();
  o.mask = m.defined() ? add(m, bias) : bias;
  o.mask_kind = MaskKind::kAdditive;
  return o;
}

AttentionOptions at_fp32(AttentionOptions o) {
  o.precision = Precision::kFloat32;
  return o;
}

float attention_scale(const AttentionOptions& options, int64_t dk) {
  if (options.scale) {
    QKV_CHECK_ARG(std::isfinite(*options.scale), "[attention] scale ", *options.scale, " must be finite");
    return *options.scale;
  }
  QKV_CHECK_ARG(dk > 0, "[attention] Dk ", dk, " must be positive");
  return static_cast<float>(1.0 / std::sqrt(static_cast<double>(dk)));
}

namespace {

bool is_empty(const Tensor& q, const Tensor& k, const Tensor& v) {
  return q.numel() == 0 || k.numel() == 0 || v.numel() == 0;
}

// PyTorch's rule for empty sequences (options.allow_empty): zeros of the result's shapes; lse -inf (no key).
AttentionResult empty_result(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& o,
                             const Shape& batch) {
  Shape out = batch, weights = batch, lse = batch;
  out.insert(out.end(), {q.size(-2), v.size(-1)});
  weights.insert(weights.end(), {q.size(-2), k.size(-2)});
  lse.push_back(q.size(-2));
  AttentionResult r;
  r.out = Tensor::zeros(out);
  if (o.return_weights) r.weights = Tensor::zeros(weights);
  if (o.return_lse) r.lse = Tensor::full(lse, -std::numeric_limits<float>::infinity());
  return r;
}

// The composed path: the weights (bf16: of the rounded q, k and v), then out = weights · v.
AttentionResult reference_checked(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& o,
                                  const Shape& batch) {
  const float scale = attention_scale(o, q.size(-1));
  if (o.precision == Precision::kBFloat16)
    return kernels::attention_reference_forward(round_to_bf16(q), round_to_bf16(k), round_to_bf16(v), at_fp32(o),
                                                batch, scale);
  return kernels::attention_reference_forward(q, k, v, o, batch, scale);
}

// Dropout on the weights: the reference's weights, dropped with the caller's Rng, times v (bf16: the rounded v).
// With GQA the weights' query heads are grouped over their kv head: (..., Hkv, G, Tq, Tk) · (..., Hkv, 1, Tk, Dv).
AttentionResult reference_dropped(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& o,
                                  const Shape& batch) {
  AttentionOptions w = o;
  w.return_weights = true;
  AttentionResult r = reference_checked(q, k, v, w, batch);
  r.weights = dropout(r.weights, o.dropout_p, true, *o.dropout_rng).y;
  const Tensor vr = o.precision == Precision::kBFloat16 ? round_to_bf16(v) : v;
  const int64_t group = kernels::gqa_group(o, k, batch);
  if (group == 1) {
    r.out = matmul(r.weights, vr);
  } else {
    Shape grouped(r.weights.shape().begin(), r.weights.shape().end() - 3);
    grouped.insert(grouped.end(), {r.weights.size(-3) / group, group, q.size(-2), k.size(-2)});
    const Tensor out = matmul(r.weights.view(grouped), vr.unsqueeze(-3));
    Shape merged = batch;
    merged.insert(merged.end(), {q.size(-2), v.size(-1)});
    r.out = out.reshape(merged);
  }
  if (!o.return_weights) r.weights = Tensor();
  return r;
}

// config.kv_bf16: k and v are bf16 pairs, whose values are bf16 already.
AttentionResult fused_checked(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& o,
                              const Shape& batch, const kernels::FlashConfig& config = {}) {
  // bf16: the inputs rounded once here; the kernel keeps the precision, and where the CPU has AVX512-BF16 it runs
  // both products on vdpbf16ps with P rounded to bf16 (softmax, LSE and sums in float32), else float32 products.
  const bool bf16 = o.precision == Precision::kBFloat16, kv = bf16 && !config.kv_bf16;
  AttentionResult r = kernels::attention_flash_forward(bf16 ? round_to_bf16(q) : q, kv ? round_to_bf16(k) : k,
                                                       kv ? round_to_bf16(v) : v, o, batch,
                                                       attention_scale(o, q.size(-1)), config);
  if (!o.return_lse) r.lse = Tensor();
  return r;
}

AttentionGrads zero_grads(const Tensor& q, const Tensor& k, const Tensor& v) {
  return {Tensor::zeros(q.shape()), Tensor::zeros(k.shape()), Tensor::zeros(v.shape())};
}

}  // namespace

namespace detail {

AttentionResult attention_checked(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& o,
                                  const Shape& batch) {
  if (is_empty(q, k, v)) return empty_result(q, k, v, o, batch);
  if (o.dropout_p > 0.0f) return reference_dropped(q, k, v, o, batch);
  if (!o.return_weights) return fused_checked(q, k, v, o, batch);  // bf16 included
  return reference_checked(q, k, v, o, batch);
}

AttentionGrads attention_backward_checked(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                                          const Tensor& lse, const Tensor& d_out, const AttentionOptions& o,
                                          const Shape& batch) {
  if (is_empty(q, k, v)) return zero_grads(q, k, v);
  const float scale = attention_scale(o, q.size(-1));
  // bf16: q, k, v and d_out rounded as the forward rounded q, k and v; the kernel rounds P and dS.
  const bool bf16 = o.precision == Precision::kBFloat16;
  const Tensor qr = bf16 ? round_to_bf16(q) : q, kr = bf16 ? round_to_bf16(k) : k, vr = bf16 ? round_to_bf16(v) : v;
  const Tensor gr = bf16 ? round_to_bf16(d_out) : d_out;
  if (out.defined() && lse.defined())
    return kernels::attention_flash_backward(qr, kr, vr, out, lse, gr, o, batch, scale);
  const AttentionResult f = kernels::attention_flash_forward(qr, kr, vr, o, batch, scale);
  return kernels::attention_flash_backward(qr, kr, vr, f.out, f.lse, gr, o, batch, scale);
}

}  // namespace detail

// The single entry: checks once, then decides (empty, dropout, fused or reference).
AttentionResult attention(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& options) {
  return detail::attention_checked(q, k, v, options, attention_check(q, k, v, options, "attention"));
}

AttentionResult attention_kv_bf16(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& options) {
  QKV_CHECK_ARG(k.defined() && v.defined() && k.dim() >= 2 && v.dim() >= 2, "[attention] k ",
                k.defined() ? str(k.shape()) : "(undefined)", " and v ", v.defined() ? str(v.shape()) : "(undefined)",
                " of bf16 pairs must have rank >= 2");
  // The checks see the widened shapes (a broadcast zero: nothing is widened for them).
  const auto widened = [](const Tensor& x) {
    Shape s = x.shape();
    s.back() *= 2;
    return Tensor::zeros({1}).expand(s);
  };
  const Tensor kw = widened(k), vw = widened(v);
  const Shape batch = attention_check(q, kw, vw, options, "attention");
  if (is_empty(q, kw, vw) || options.dropout_p > 0.0f || options.return_weights)
    return detail::attention_checked(q, from_bf16_pairs(k), from_bf16_pairs(v), options, batch);
  kernels::FlashConfig config;
  config.kv_bf16 = true;
  return fused_checked(q, k, v, options, batch, config);
}

AttentionResult attention_reference(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const AttentionOptions& options) {
  const Shape batch = attention_check(q, k, v, options, "attention");
  if (is_empty(q, k, v)) return empty_result(q, k, v, options, batch);
  if (options.dropout_p > 0.0f) return reference_dropped(q, k, v, options, batch);
  return reference_checked(q, k, v, options, batch);
}

AttentionResult attention_fused(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& options) {
  const Shape batch = attention_check(q, k, v, options, "attention");
  QKV_CHECK_ARG(!options.return_weights && options.dropout_p == 0.0f, "[attention] the fused path never forms the "
                "weights (return_weights, dropout_p); q ", str(q.shape()), " k ", str(k.shape()),
                ": call attention() or attention_reference()");
  if (is_empty(q, k, v)) return empty_result(q, k, v, options, batch);
  return fused_checked(q, k, v, options, batch);
}

AttentionGrads attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                                  const Tensor& lse, const Tensor& d_out, const AttentionOptions& options) {
  const Shape batch = attention_backward_check(q, k, v, out, lse, d_out, options, "attention_backward");
  return detail::attention_backward_checked(q, k, v, out, lse, d_out, options, batch);
}

Shape attention_backward_check(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                                const Tensor& lse, const Tensor& d_out, const AttentionOptions& options,
                                const char* op) {
  const Shape batch = attention_check(q, k, v, options, op);
  Shape out_shape = batch, lse_shape = batch;
  out_shape.push_back(q.size(-2));
  out_shape.push_back(v.size(-1));
  lse_shape.push_back(q.size(-2));
  QKV_CHECK_ARG(d_out.defined() && d_out.shape() == out_shape, "[", op, "] d_out ",
                d_out.defined() ? str(d_out.shape()) : "(undefined)", " must have the shape of out ",
                str(out_shape), " (q ", str(q.shape()), ", v ", str(v.shape()), ")");
  QKV_CHECK_ARG(!out.defined() || out.shape() == out_shape, "[", op, "] out ", str(out.shape()),
                " must have shape (batch..., Tq, Dv) = ", str(out_shape));
  QKV_CHECK_ARG(!lse.defined() || lse.shape() == lse_shape, "[", op, "] lse ", str(lse.shape()),
                " must have shape (batch..., Tq) = ", str(lse_shape));
  return batch;
}

AttentionGrads attention_backward_reference(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                                            const Tensor& lse, const Tensor& d_out,
                                            const AttentionOptions& options) {
  const Shape batch = attention_backward_check(q, k, v, out, lse, d_out, options, "attention_backward");
  if (is_empty(q, k, v)) return zero_grads(q, k, v);
  return kernels::attention_reference_backward(q, k, v, out, lse, d_out, options, batch,
                                               attention_scale(options, q.size(-1)));
}

}  // namespace qkv
