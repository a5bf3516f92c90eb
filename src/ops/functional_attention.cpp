// Differentiable attention (one node over the op, or composed on the tape when the weights need dropout or a bias
// needs a gradient), Shaw relative attention, and the positional encodings with parameters or a backward (RoPE, T5).
#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <span>
#include <vector>

#include "attention_internal.h"
#include "functional_internal.h"
#include "qkv/kernels/grad.h"
#include "qkv/core/error.h"
#include "qkv/kernels/attention_reference.h"
#include "qkv/ops/positional/relative.h"
#include "qkv/ops/positional/sinusoidal.h"
#include "qkv/ops/positional/t5_bias.h"
#include "qkv/ops/functional.h"

namespace qkv::ad {

using detail::record;
using Douts = std::span<const Tensor>;

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// options' mask, causal flag and sliding window as one additive tensor broadcastable to (batch..., Tq, Tk);
// undefined when none.
Tensor additive_mask(const AttentionOptions& o, int64_t tq, int64_t tk) {
  Tensor m;
  if (o.mask_kind != MaskKind::kNone && o.mask.defined()) m = mask_to_additive(o.mask, o.mask_kind);
  if (o.causal != Causal::kNone || o.window_left >= 0 || o.window_right >= 0) {
    Tensor c = Tensor::empty({tq, tk});
    float* p = c.data();
    for (int64_t i = 0; i < tq; ++i) {
      const kernels::KeyRange r = kernels::visible_keys(o, i, tq, tk);
      for (int64_t j = 0; j < tk; ++j) p[i * tk + j] = j >= r.begin && j < r.end ? 0.0f : kNegInf;
    }
    m = m.defined() ? qkv::add(m, c) : c;
  }
  return m;
}

// Relative-position index table (Tq, Tk): idx[i][j] = clamp(j - (i + offset), -clip, clip) + clip.
std::shared_ptr<const std::vector<int32_t>> relative_index(int64_t tq, int64_t tk, int64_t clip, int64_t offset) {
  auto idx = std::make_shared<std::vector<int32_t>>(static_cast<size_t>(tq * tk));
  for (int64_t i = 0; i < tq; ++i)
    for (int64_t j = 0; j < tk; ++j)
      (*idx)[static_cast<size_t>(i * tk + j)] =
          static_cast<int32_t>(std::clamp<int64_t>(j - (i + offset), -clip, clip) + clip);
  return idx;
}

// y[..., i, j] = x[..., i, idx[i][j]]:  x (..., Tq, R) -> (..., Tq, Tk)
Tensor gather_rel(const Tensor& x_in, const std::vector<int32_t>& idx, int64_t tk) {
  const Tensor x = x_in.contiguous();
  const int64_t R = x.size(-1), tq = x.size(-2), outer = x.numel() / std::max<int64_t>(tq * R, 1);
  Shape shape = x.shape();
  shape.back() = tk;
  Tensor y = Tensor::empty(shape);
  const float* px = x.data();
  float* py = y.data();
#pragma omp parallel for schedule(static) if (outer * tq * tk >= (int64_t{1} << 18))
  for (int64_t b = 0; b < outer; ++b)
    for (int64_t i = 0; i < tq; ++i) {
      const float* xr = px + (b * tq + i) * R;
      float* yr = py + (b * tq + i) * tk;
      const int32_t* ir = idx.data() + i * tk;
      for (int64_t j = 0; j < tk; ++j) yr[j] = xr[ir[j]];
    }
  return y;
}

// y[..., i, r] = Σ_{j : idx[i][j] = r} a[..., i, j]:  a (..., Tq, Tk) -> (..., Tq, R)
Tensor scatter_rel(const Tensor& a_in, const std::vector<int32_t>& idx, int64_t R) {
  const Tensor a = a_in.contiguous();
  const int64_t tk = a.size(-1), tq = a.size(-2), outer = a.numel() / std::max<int64_t>(tq * tk, 1);
  Shape shape = a.shape();
  shape.back() = R;
  Tensor y = Tensor::zeros(shape);
  const float* pa = a.data();
  float* py = y.data();
#pragma omp parallel for schedule(static) if (outer * tq * tk >= (int64_t{1} << 18))
  for (int64_t b = 0; b < outer; ++b)
    for (int64_t i = 0; i < tq; ++i) {
      const float* ar = pa + (b * tq + i) * tk;
      float* yr = py + (b * tq + i) * R;
      const int32_t* ir = idx.data() + i * tk;
      for (int64_t j = 0; j < tk; ++j) yr[ir[j]] += ar[j];
    }
  return y;
}

Var gather_rel_var(const Var& x, std::shared_ptr<const std::vector<int32_t>> idx, int64_t tk) {
  const int64_t R = x.size(-1);
  return record(gather_rel(x.value, *idx, tk), {&x}, [&] { return [x, idx, R](Tape& t, Douts d) {
    t.accumulate_owned(x, scatter_rel(d[0], *idx, R));
  }; });
}

Var scatter_rel_var(const Var& a, std::shared_ptr<const std::vector<int32_t>> idx, int64_t R) {
  const int64_t tk = a.size(-1);
  return record(scatter_rel(a.value, *idx, R), {&a}, [&] { return [a, idx, tk](Tape& t, Douts d) {
    t.accumulate_owned(a, gather_rel(d[0], *idx, tk));
  }; });
}

// Negates the second member of every RoPE pair in place: R⁻¹ = P·R·P with P this negation.
void negate_pair_members(Tensor& x, RopeVariant variant) {
  const int64_t D = x.size(-1), half = D / 2, rows = x.numel() / std::max<int64_t>(D, 1);
  float* p = x.data();
  for (int64_t r = 0; r < rows; ++r) {
    float* row = p + r * D;
    if (variant == RopeVariant::kInterleaved) {
      for (int64_t i = 0; i < half; ++i) row[2 * i + 1] = -row[2 * i + 1];
    } else {
      for (int64_t i = half; i < D; ++i) row[i] = -row[i];
    }
  }
}

}  // namespace

// --- attention -------------------------------------------------------------------------------------------------

Var attention(const Var& q, const Var& k, const Var& v, const AttentionOptions& options,
              const AttentionExtras& extras) {
  detail::check_defined(q, "attention", "q");
  detail::check_defined(k, "attention", "k");
  detail::check_defined(v, "attention", "v");
  // The one check of this attention: the node's forward and backward below run unchecked.
  const Shape batch = attention_check(q.value, k.value, v.value, options, "attention");
  const int64_t tq = q.size(-2), tk = k.size(-2);
  if (extras.bias.defined()) {
    Shape full = batch;
    full.push_back(tq);
    full.push_back(tk);
    QKV_CHECK_ARG(extras.bias.dim() <= static_cast<int64_t>(full.size()) &&
                      broadcastable_to(extras.bias.shape(), full),
                  "[attention] bias ", str(extras.bias.shape()), " must broadcast to (batch..., Tq, Tk) = ",
                  str(full));
  }
  // Empty sequences take the op's rule (zeros, zero gradients) whatever the dropout or bias.
  const bool empty = q.value.numel() == 0 || k.value.numel() == 0 || v.value.numel() == 0;
  const bool composed = !empty && (options.dropout_p > 0.0f || extras.bias.requires_grad());
  if (!composed) {
    AttentionOptions o = options;
    o.return_weights = false;
    o.dropout_p = 0.0f;
    o.return_lse = detail::tape_of({&q, &k, &v}) != nullptr;  // the backward needs it; inference does not
    o = with_additive_bias(o, extras.bias.value);  // a constant bias joins the mask
    AttentionResult r = qkv::detail::attention_checked(q.value, k.value, v.value, o, batch);
    o.return_lse = false;
    return record(r.out, {&q, &k, &v}, [&] { return [q, k, v, o, batch, out = r.out, lse = r.lse](Tape& t, Douts d) {
      AttentionGrads g =
          qkv::detail::attention_backward_checked(q.value, k.value, v.value, out, lse, d[0], o, batch);
      t.accumulate_owned(q, g.dq);
      t.accumulate_owned(k, g.dk);
      t.accumulate_owned(v, g.dv);
    }; });
  }
  // Composed: scores -> soft cap -> bias -> mask -> softmax -> dropout -> weights·v. At bf16 q, k, v and the
  // weights are rounded to bf16 (gradients pass through the rounding); the products accumulate in float32.
  const bool bf16 = options.precision == Precision::kBFloat16;
  const auto at_precision = [bf16](const Var& x) { return bf16 ? round_to_bf16(x) : x; };
  const float sc = attention_scale(options, q.size(-1));
  Var kk = at_precision(k), vv = at_precision(v);
  if (options.enable_gqa && k.size(-3) != q.size(-3)) {
    // GQA on the tape: each kv head repeated over its group (a broadcast view; the backward sums the group).
    const auto grouped = [&](const Var& x) {
      const int64_t hkv = x.size(-3), group = q.size(-3) / hkv;
      Shape wide = x.shape();
      wide.insert(wide.end() - 2, group);
      Shape merged = x.shape();
      merged[merged.size() - 3] = hkv * group;
      return reshape(expand(unsqueeze(x, x.dim() - 2), wide), merged);
    };
    kk = grouped(kk);
    vv = grouped(vv);
  }
  Var s = scale(matmul(at_precision(q), transpose(kk, -1, -2)), sc);
  if (options.softcap > 0.0f) s = scale(tanh(scale(s, 1.0f / options.softcap)), options.softcap);
  if (extras.bias.defined()) s = add(s, extras.bias);
  const Tensor m = additive_mask(options, tq, tk);
  if (m.defined()) s = add(s, Var(m));
  Var w = softmax(s, -1);
  if (options.dropout_p > 0.0f) w = dropout(w, options.dropout_p, true, *options.dropout_rng);
  return matmul(at_precision(w), vv);
}

Var relative_attention(const Var& q, const Var& k, const Var& v, const Var& rel_k, const Var& rel_v, int64_t clip,
                       const AttentionOptions& options, int64_t query_offset) {
  detail::check_defined(q, "relative_attention", "q");
  detail::check_defined(k, "relative_attention", "k");
  detail::check_defined(v, "relative_attention", "v");
  detail::check_defined(rel_k, "relative_attention", "rel_k");
  // The checks of qkv::relative_attention, restated with this op's name.
  QKV_CHECK_ARG(clip >= 0, "[relative_attention] clip must be >= 0, got ", clip);
  QKV_CHECK_ARG(q.dim() >= 2 && k.dim() == q.dim() && v.dim() == q.dim(), "[relative_attention] q ",
                str(q.shape()), ", k ", str(k.shape()), " and v ", str(v.shape()),
                " must have the same rank >= 2");
  const int64_t r = q.dim();
  const Shape lead(q.shape().begin(), q.shape().end() - 2);
  QKV_CHECK_ARG(Shape(k.shape().begin(), k.shape().end() - 2) == lead &&
                    Shape(v.shape().begin(), v.shape().end() - 2) == lead,
                "[relative_attention] q ", str(q.shape()), ", k ", str(k.shape()), " and v ", str(v.shape()),
                " must share their leading dims");
  const int64_t tq = q.size(r - 2), tk = k.size(r - 2), D = q.size(r - 1), R = 2 * clip + 1;
  QKV_CHECK_ARG(k.size(r - 1) == D && v.size(r - 2) == tk, "[relative_attention] q ", str(q.shape()), ", k ",
                str(k.shape()), " and v ", str(v.shape()), " disagree on D or Tk");
  QKV_CHECK_ARG(rel_k.dim() == 2 && rel_k.size(0) == R && rel_k.size(1) == D, "[relative_attention] rel_k ",
                str(rel_k.shape()), " must be (2·clip+1, D) = ", str(Shape{R, D}));
  QKV_CHECK_ARG(!rel_v.defined() || (rel_v.dim() == 2 && rel_v.size(0) == R && rel_v.size(1) == v.size(r - 1)),
                "[relative_attention] rel_v ", str(rel_v.shape()), " must be (2·clip+1, Dv) = ",
                str(Shape{R, v.size(r - 1)}));
  QKV_CHECK_ARG(options.mask_kind == MaskKind::kNone || options.mask.defined(),
                "[relative_attention] mask_kind is set but the mask is undefined");
  if (options.mask.defined()) {
    Shape full = lead;
    full.push_back(tq);
    full.push_back(tk);
    QKV_CHECK_ARG(options.mask_kind != MaskKind::kNone, "[relative_attention] a mask is given with kind kNone");
    QKV_CHECK_ARG(options.mask.dim() <= r && broadcastable_to(options.mask.shape(), full),
                  "[relative_attention] mask ", str(options.mask.shape()), " must broadcast to ", str(full));
  }
  const float sc = attention_scale(options, D);
  auto idx = relative_index(tq, tk, clip, query_offset);
  Var s = matmul(q, transpose(k, -1, -2));                                 // (..., Tq, Tk)
  s = add(s, gather_rel_var(matmul(q, transpose(rel_k, 0, 1)), idx, tk));  // q·rel_k[r_ij]
  s = scale(s, sc);
  const Tensor m = additive_mask(options, tq, tk);
  if (m.defined()) s = add(s, Var(m));
  const Var w = softmax(s, -1);
  Var z = matmul(w, v);
  if (rel_v.defined()) z = add(z, matmul(scatter_rel_var(w, idx, R), rel_v));
  return z;
}

// --- positional encodings --------------------------------------------------------------------------------------

Var add_learned_positions(const Var& x, const Var& table, int64_t offset) {
  detail::check_defined(x, "add_learned_positions", "x");
  detail::check_defined(table, "add_learned_positions", "table");
  QKV_CHECK_ARG(x.dim() >= 2 && table.dim() == 2 && table.size(1) == x.size(-1), "[add_learned_positions] x ",
                str(x.shape()), " must be (..., T, E) and table ", str(table.shape()), " (max_len, E)");
  const int64_t T = x.size(-2);
  QKV_CHECK_ARG(offset >= 0 && offset + T <= table.size(0), "[add_learned_positions] positions ", offset, "..",
                offset + T - 1, " exceed the table ", str(table.shape()));
  return add(x, slice(table, 0, offset, offset + T));
}

Var add_sinusoidal(const Var& x, int64_t offset, float base) {
  detail::check_defined(x, "add_sinusoidal", "x");
  QKV_CHECK_ARG(x.dim() >= 2, "[add_sinusoidal] x ", str(x.shape()), " must be (..., T, E)");
  return add(x, Var(sinusoidal_table(x.size(-2), x.size(-1), offset, base)));
}

// The backward of a rotation is the inverse rotation: the same angles with the pair members negated around it.
Var rope(const Var& x, std::shared_ptr<const RopeTable> table, RopeVariant variant) {
  detail::check_defined(x, "rope", "x");
  QKV_CHECK_ARG(table != nullptr, "[rope] the table is null");
  const Tensor y = rope_apply(x.value, *table, variant);
  return record(y, {&x}, [&] { return [x, table, variant](Tape& t, Douts d) {
    Tensor g = d[0].clone();
    negate_pair_members(g, variant);
    g = rope_apply(g, *table, variant);
    negate_pair_members(g, variant);
    t.accumulate_owned(x, g);
  }; });
}

Var rope(const Var& x, int64_t offset, float base, RopeVariant variant) {
  detail::check_defined(x, "rope", "x");
  return rope(x, std::make_shared<const RopeTable>(rope_table_for(x.value, offset, base)), variant);
}

Var rope(const Var& x, const std::vector<int64_t>& positions, float base, RopeVariant variant) {
  detail::check_defined(x, "rope", "x");
  return rope(x, std::make_shared<const RopeTable>(rope_table_for(x.value, positions, base)), variant);
}

Var t5_bias(const Var& table, int64_t Tq, int64_t Tk, bool bidirectional, int64_t max_distance,
            int64_t query_offset) {
  detail::check_defined(table, "t5_bias", "table");
  const Tensor y = t5_relative_bias(table.value, Tq, Tk, bidirectional, max_distance, query_offset);
  const int64_t nb = table.size(0), H = table.size(1);
  auto bucket = std::make_shared<std::vector<int32_t>>(static_cast<size_t>(Tq * Tk));
  for (int64_t i = 0; i < Tq; ++i)
    for (int64_t j = 0; j < Tk; ++j)
      (*bucket)[static_cast<size_t>(i * Tk + j)] =
          static_cast<int32_t>(t5_relative_bucket(j - (i + query_offset), bidirectional, nb, max_distance));
  return record(y, {&table}, [&] { return [table, bucket, H, Tq, Tk](Tape& t, Douts d) {
    const Tensor dy = d[0].contiguous();
    Tensor g = t.accumulator_zeroed(table).contiguous();
    const float* pd = dy.data();
    float* pg = g.data();
    for (int64_t h = 0; h < H; ++h)
      for (int64_t ij = 0; ij < Tq * Tk; ++ij) pg[(*bucket)[static_cast<size_t>(ij)] * H + h] += pd[h * Tq * Tk + ij];
  }; });
}

}  // namespace qkv::ad
