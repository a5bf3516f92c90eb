// Differentiable fused steps of a transformer layer: the post-LN epilogue (residual + bias + LayerNorm), the bias +
// GELU after a bias-less linear, and packed variable-length attention. Without a tape each runs the inference op
// (in place for the epilogues); on a tape each is one node whose backward calls the ops' backward halves.
#include <cmath>
#include <span>
#include <utility>
#include <vector>

#include "functional_internal.h"
#include "qkv/core/error.h"
#include "qkv/kernels/activations.h"
#include "qkv/kernels/grad.h"
#include "qkv/kernels/layer_norm.h"
#include "qkv/ops/attention_varlen.h"
#include "qkv/ops/functional.h"
#include "qkv/ops/layer_norm.h"

namespace qkv::ad {

using detail::record;
using Douts = std::span<const Tensor>;

namespace {

// Adds a row gradient g (rows, n) contiguous, summed over rows, into v (n) when v takes one.
void accumulate_column_sums(Tape& t, const Var& v, const Tensor& g, int64_t rows, int64_t n) {
  if (!t.needs(v)) return;
  bool fresh = false;
  Tensor acc = t.accumulator(v, fresh);
  kernels::column_sums(g.data(), rows, n, acc.data(), fresh);
}

}  // namespace

Var add_layer_norm(Var&& y, const Var& x, const Var& y_bias, const Var& weight, const Var& bias, float eps) {
  detail::check_defined(y, "add_layer_norm", "y");
  if (!detail::tape_of({&y, &x, &y_bias, &weight, &bias})) {
    // Inference: the fused in-place kernel on y's own buffer (validates every operand).
    Tensor out = y.value.is_contiguous() ? std::move(y.value) : y.value.clone();
    y = Var();
    add_layer_norm_(out, x.value, y_bias.value, weight.value, bias.value, eps);
    return Var(out);
  }
  // The checks and messages of the in-place op.
  QKV_CHECK_ARG(y.dim() >= 1 && y.size(-1) > 0, "[add_layer_norm] y ", str(y.shape()),
                " must have rank >= 1 and a non-empty last dim");
  const int64_t e = y.size(-1);
  QKV_CHECK_ARG(eps >= 0.0f && std::isfinite(eps), "[add_layer_norm] eps must be finite and >= 0, got ", eps);
  QKV_CHECK_ARG(!x.defined() || x.shape() == y.shape(), "[add_layer_norm] x ", str(x.shape()),
                " must have y's shape ", str(y.shape()));
  for (const Var* p : {&y_bias, &weight, &bias})
    QKV_CHECK_ARG(!p->defined() || p->shape() == Shape{e}, "[add_layer_norm] y_bias, weight and bias must be (", e,
                  ",) for y ", str(y.shape()), ", got ", str(p->shape()));
  // s = x + (y + y_bias), the order of the inference kernel; then the tape's LayerNorm kernel.
  Tensor s = y_bias.defined() ? qkv::add(y.value, y_bias.value) : y.value.contiguous();
  if (x.defined()) s = qkv::add(x.value, s);
  s = s.contiguous();
  const Tensor w = weight.defined() ? weight.value.contiguous() : Tensor();
  const Tensor b = bias.defined() ? bias.value.contiguous() : Tensor();
  const int64_t rows = s.numel() / e;
  Tensor out = Tensor::empty(s.shape());
  Tensor mean = Tensor::empty({rows}), rstd = Tensor::empty({rows});
  kernels::layer_norm_rows(s.data(), w.defined() ? w.data() : nullptr, b.defined() ? b.data() : nullptr, eps, rows,
                           e, out.data(), mean.data(), rstd.data());
  const Var yv = std::move(y);
  y = Var();
  return record(out, {&yv, &x, &y_bias, &weight, &bias},
                [yv, x, y_bias, weight, w, bias, s, mean, rstd, rows, e](Tape& t, Douts d) {
                  const Tensor dy = d[0].contiguous();
                  Tensor ds = Tensor::empty(s.shape());
                  Tensor dw = t.needs(weight) ? Tensor::empty({e}) : Tensor();
                  Tensor db = t.needs(bias) ? Tensor::empty({e}) : Tensor();
                  kernels::layer_norm_rows_backward(s.data(), w.defined() ? w.data() : nullptr, mean.data(),
                                                    rstd.data(), dy.data(), rows, e, ds.data(), nullptr,
                                                    dw.defined() ? dw.data() : nullptr,
                                                    db.defined() ? db.data() : nullptr);
                  if (dw.defined()) t.accumulate(weight, dw);
                  if (db.defined()) t.accumulate(bias, db);
                  accumulate_column_sums(t, y_bias, ds, rows, e);
                  if (t.needs(x)) t.accumulate(x, ds);  // shared: copy-on-write if y takes it too
                  if (t.needs(yv)) t.accumulate(yv, ds);
                });
}

Var add_bias_gelu(Var&& x, const Var& bias, GeluApprox approx) {
  detail::check_defined(x, "add_bias_gelu", "x");
  if (!detail::tape_of({&x, &bias})) {
    Tensor out = x.value.is_contiguous() ? std::move(x.value) : x.value.clone();
    x = Var();
    add_bias_gelu_(out, bias.value, approx);
    return Var(out);
  }
  QKV_CHECK_ARG(x.dim() >= 1, "[add_bias_gelu] x must have rank >= 1, got ", str(x.shape()));
  const int64_t f = x.size(-1);
  QKV_CHECK_ARG(!bias.defined() || bias.shape() == Shape{f}, "[add_bias_gelu] bias ", str(bias.shape()),
                " must be (", f, ") for x ", str(x.shape()));
  const bool th = approx == GeluApprox::kTanh;
  const Tensor u = (bias.defined() ? qkv::add(x.value, bias.value) : x.value).contiguous();  // the pre-activation
  Tensor out = Tensor::empty(u.shape());
  kernels::gelu_forward(u.data(), out.data(), u.numel(), th);
  const Var xv = std::move(x);
  x = Var();
  return record(out, {&xv, &bias}, [&] { return [xv, bias, u, th, f](Tape& t, Douts d) {
    const Tensor dy = d[0].contiguous();
    Tensor du = Tensor::empty(u.shape());
    kernels::gelu_backward(u.data(), dy.data(), du.data(), u.numel(), th);
    accumulate_column_sums(t, bias, du, f ? u.numel() / f : 0, f);
    if (t.needs(xv)) t.accumulate_owned(xv, du);
  }; });
}

Var attention_varlen(const Var& q, const Var& k, const Var& v, std::span<const int32_t> cu_q,
                     std::span<const int32_t> cu_k, int64_t max_q, int64_t max_k, const AttentionOptions& options) {
  detail::check_defined(q, "attention_varlen", "q");
  detail::check_defined(k, "attention_varlen", "k");
  detail::check_defined(v, "attention_varlen", "v");
  const bool taped = detail::tape_of({&q, &k, &v}) != nullptr;
  AttentionOptions o = options;
  o.return_lse = taped;
  AttentionResult r = qkv::attention_varlen(q.value, k.value, v.value, cu_q, cu_k, max_q, max_k, o);
  if (!taped) return Var(r.out);
  std::vector<int32_t> cq(cu_q.begin(), cu_q.end()), ck(cu_k.begin(), cu_k.end());
  return record(r.out, {&q, &k, &v},
                [q, k, v, out = r.out, lse = r.lse, cq = std::move(cq), ck = std::move(ck), max_q, max_k, o](
                    Tape& t, Douts d) {
                  AttentionGrads g = attention_varlen_backward(q.value, k.value, v.value, out, lse, d[0], cq, ck,
                                                               max_q, max_k, o);
                  if (t.needs(q)) t.accumulate_owned(q, g.dq);
                  if (t.needs(k)) t.accumulate_owned(k, g.dk);
                  if (t.needs(v)) t.accumulate_owned(v, g.dv);
                });
}

}  // namespace qkv::ad
