// LayerNorm over the last dimension, double-accumulated, biased variance as PyTorch; the forward returns mean and
// rstd for the backward (llm.c's formula). add_layer_norm_: the fused in-place inference step, beside its twin.
// Validation and layout here; the row loops are qkv/kernels/layer_norm.h.
#include "qkv/ops/layer_norm.h"

#include <cmath>
#include <vector>

#include "qkv/core/error.h"
#include "qkv/core/parallel_for.h"
#include "qkv/kernels/layer_norm.h"
#include "qkv/ops/elementwise.h"

namespace qkv {

LayerNormResult layer_norm(const Tensor& x_in, const Tensor& weight_in, const Tensor& bias_in, float eps) {
  QKV_CHECK_ARG(x_in.defined(), "[layer_norm] undefined input");
  QKV_CHECK_ARG(x_in.dim() >= 1, "[layer_norm] x must have rank >= 1, got ", str(x_in.shape()));
  const int64_t e = x_in.size(-1);
  QKV_CHECK_ARG(e > 0, "[layer_norm] normalised dim of x ", str(x_in.shape()), " must be > 0");
  QKV_CHECK_ARG(eps >= 0.0f && std::isfinite(eps), "[layer_norm] eps must be finite and >= 0, got ", eps);
  const Shape ew{e};
  if (weight_in.defined())
    QKV_CHECK_ARG(weight_in.shape() == ew, "[layer_norm] weight ", str(weight_in.shape()), " must be ",
                  str(ew), " for x ", str(x_in.shape()));
  if (bias_in.defined())
    QKV_CHECK_ARG(bias_in.shape() == ew, "[layer_norm] bias ", str(bias_in.shape()), " must be ",
                  str(ew), " for x ", str(x_in.shape()));
  const Tensor x = x_in.contiguous();
  const Tensor w = weight_in.defined() ? weight_in.contiguous() : Tensor();
  const Tensor b = bias_in.defined() ? bias_in.contiguous() : Tensor();
  const Shape lead(x.shape().begin(), x.shape().end() - 1);
  LayerNormResult r{Tensor::empty(x.shape()), Tensor::empty(lead), Tensor::empty(lead)};
  const int64_t rows = shape_numel(lead);
  const float* px = x.data();
  const float* pw = w.defined() ? w.data() : nullptr;
  const float* pb = b.defined() ? b.data() : nullptr;
  kernels::layer_norm_rows_reference(px, pw, pb, eps, rows, e, r.y.data(), r.mean.data(), r.rstd.data());
  return r;
}

void add_layer_norm_(Tensor& y, const Tensor& x_in, const Tensor& y_bias, const Tensor& weight_in,
                     const Tensor& bias_in, float eps) {
  const char* op = "[add_layer_norm]";
  QKV_CHECK_ARG(y.defined() && y.dim() >= 1, op, " y must be defined with rank >= 1, got ",
                y.defined() ? str(y.shape()) : std::string("(undefined)"));
  QKV_CHECK_ARG(y.is_contiguous(), op, " y ", str(y.shape()), " must be contiguous (it is written in place)");
  const int64_t e = y.size(-1);
  QKV_CHECK_ARG(e > 0, op, " normalised dim of y ", str(y.shape()), " must be > 0");
  QKV_CHECK_ARG(eps >= 0.0f && std::isfinite(eps), op, " eps must be finite and >= 0, got ", eps);
  if (x_in.defined())
    QKV_CHECK_ARG(x_in.shape() == y.shape(), op, " x ", str(x_in.shape()), " must have y's shape ", str(y.shape()));
  const Shape ew{e};
  for (const Tensor* t : {&y_bias, &weight_in, &bias_in})
    if (t->defined())
      QKV_CHECK_ARG(t->shape() == ew, op, " y_bias, weight and bias must be ", str(ew), " for y ", str(y.shape()),
                    ", got ", str(t->shape()));
  const int64_t rows = y.numel() / e;
  if (rows == 0) return;
  // x as rows of stride x_stride: a view when its leading dims collapse with a contiguous last dim, else a copy.
  Tensor x;
  int64_t x_stride = e;
  if (x_in.defined()) {
    x = x_in;
    bool rows_ok = x.stride(-1) == 1 || e == 1;
    if (rows_ok && x.dim() >= 2) {
      x_stride = x.stride(-2);
      for (int64_t a = x.dim() - 2; a > 0 && rows_ok; --a)
        rows_ok = x.size(a - 1) == 1 || x.stride(a - 1) == x.stride(a) * x.size(a);
      rows_ok = rows_ok && (rows == 1 || x_stride >= e);
    }
    // Rows of x that overlap other rows of y would be overwritten before they are read: copy them first.
    const bool same_rows = x.data() == y.data() && x_stride == e;
    if (!rows_ok || (x.shares_storage(y) && !same_rows)) {
      x = x.clone();
      x_stride = e;
    }
  }
  const Tensor c = y_bias.defined() ? y_bias.contiguous() : Tensor();
  const Tensor w = weight_in.defined() ? weight_in.contiguous() : Tensor();
  const Tensor b = bias_in.defined() ? bias_in.contiguous() : Tensor();
  float* py = y.data();
  const float* px = x.defined() ? x.data() : nullptr;
  const float* pc = c.defined() ? c.data() : nullptr;
  const float* pw = w.defined() ? w.data() : nullptr;
  const float* pb = b.defined() ? b.data() : nullptr;
  kernels::add_layer_norm_rows(py, px, x_stride, pc, pw, pb, rows, e, eps);
}

Tensor add_layer_norm_reference(const Tensor& y, const Tensor& x, const Tensor& y_bias, const Tensor& weight,
                                const Tensor& bias, float eps) {
  QKV_CHECK_ARG(y.defined(), "[add_layer_norm] y must be defined");
  Tensor s = y_bias.defined() ? add(y, y_bias) : y;
  if (x.defined()) s = add(x, s);
  return layer_norm(s, weight, bias, eps).y;
}

LayerNormGrads layer_norm_backward(const Tensor& x_in, const Tensor& weight_in, const Tensor& mean_in,
                                   const Tensor& rstd_in, const Tensor& dy_in) {
  QKV_CHECK_ARG(x_in.defined() && mean_in.defined() && rstd_in.defined() && dy_in.defined(),
                "[layer_norm_backward] undefined input");
  QKV_CHECK_ARG(x_in.dim() >= 1 && x_in.size(-1) > 0, "[layer_norm_backward] x must have rank >= 1 and E > 0, got ",
                str(x_in.shape()));
  const int64_t e = x_in.size(-1);
  const Shape lead(x_in.shape().begin(), x_in.shape().end() - 1);
  QKV_CHECK_ARG(dy_in.shape() == x_in.shape(), "[layer_norm_backward] dy ", str(dy_in.shape()), " must match x ",
                str(x_in.shape()));
  QKV_CHECK_ARG(mean_in.shape() == lead && rstd_in.shape() == lead, "[layer_norm_backward] mean ",
                str(mean_in.shape()), " and rstd ", str(rstd_in.shape()), " must be ", str(lead), " for x ",
                str(x_in.shape()));
  if (weight_in.defined())
    QKV_CHECK_ARG(weight_in.shape() == Shape{e}, "[layer_norm_backward] weight ", str(weight_in.shape()),
                  " must be (", e, ",) for x ", str(x_in.shape()));
  const Tensor x = x_in.contiguous(), dy = dy_in.contiguous(), mean = mean_in.contiguous(),
               rstd = rstd_in.contiguous();
  const Tensor w = weight_in.defined() ? weight_in.contiguous() : Tensor();
  const int64_t rows = shape_numel(lead);
  LayerNormGrads g{Tensor::empty(x.shape()), w.defined() ? Tensor::empty({e}) : Tensor(), Tensor::empty({e})};
  const float* px = x.data();
  const float* pg = dy.data();
  const float* pm = mean.data();
  const float* ps = rstd.data();
  const float* pw = w.defined() ? w.data() : nullptr;
  kernels::layer_norm_rows_backward_reference(px, pw, pm, ps, pg, rows, e, g.dx.data(),
                                              g.dweight.defined() ? g.dweight.data() : nullptr, g.dbias.data());
  return g;
}

// --- RMSNorm ----------------------------------------------------------------------------------------------------

namespace {

// Validates an RMSNorm's operands; returns E.
int64_t rms_check(const Tensor& x, const Tensor& weight, float eps, const char* op) {
  QKV_CHECK_ARG(x.defined(), "[", op, "] undefined input");
  QKV_CHECK_ARG(x.dim() >= 1 && x.size(-1) > 0, "[", op, "] x ", str(x.shape()),
                " must have rank >= 1 and a non-empty last dim");
  QKV_CHECK_ARG(eps >= 0.0f && std::isfinite(eps), "[", op, "] eps must be finite and >= 0, got ", eps);
  const int64_t e = x.size(-1);
  QKV_CHECK_ARG(!weight.defined() || weight.shape() == Shape{e}, "[", op, "] weight ", str(weight.shape()),
                " must be (", e, ",) for x ", str(x.shape()));
  return e;
}

// The per-feature gain g_j: weight (+ 1 with unit_offset), or the constant 1 (+ 1) without a weight.
std::vector<float> rms_gain(const Tensor& weight, int64_t e, bool unit_offset) {
  std::vector<float> g(static_cast<size_t>(e), unit_offset ? 2.0f : 1.0f);
  if (weight.defined()) {
    const Tensor w = weight.contiguous();
    const float* pw = w.data();
    const float offset = unit_offset ? 1.0f : 0.0f;
    for (int64_t j = 0; j < e; ++j) g[static_cast<size_t>(j)] = pw[j] + offset;
  }
  return g;
}

}  // namespace

RmsNormResult rms_norm(const Tensor& x_in, const Tensor& weight, float eps, bool unit_offset) {
  const int64_t e = rms_check(x_in, weight, eps, "rms_norm");
  const Tensor x = x_in.contiguous();
  const std::vector<float> g = rms_gain(weight, e, unit_offset);
  const int64_t rows = x.numel() / e;
  const Shape lead(x.shape().begin(), x.shape().end() - 1);
  RmsNormResult r{Tensor::empty(x.shape()), Tensor::empty(lead)};
  const float* px = x.data();
  float* py = r.y.data();
  float* pr = r.rstd.data();
  parallel_for(rows * e >= (int64_t{1} << 16), rows, [&](int64_t i) {
    const float* xi = px + i * e;
    // Eight partial sums, added in a fixed order (the same bits on every CPU): eight independent chains instead of
    // one, so the row costs its loads, not e times an add's latency.
    double part[8] = {};
    int64_t j = 0;
    for (; j + 8 <= e; j += 8)
      for (int u = 0; u < 8; ++u) part[u] += static_cast<double>(xi[j + u]) * xi[j + u];
    for (int u = 0; j < e; ++j, ++u) part[u] += static_cast<double>(xi[j]) * xi[j];
    const double ss = ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
    const auto rstd = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(e) + eps));
    pr[i] = rstd;
    float* yi = py + i * e;
    for (int64_t j = 0; j < e; ++j) yi[j] = xi[j] * rstd * g[static_cast<size_t>(j)];
  });
  return r;
}

RmsNormGrads rms_norm_backward(const Tensor& x_in, const Tensor& weight, const Tensor& rstd_in, const Tensor& dy_in,
                               bool unit_offset) {
  const char* op = "rms_norm_backward";
  const int64_t e = rms_check(x_in, weight, 0.0f, op);
  const Shape lead(x_in.shape().begin(), x_in.shape().end() - 1);
  QKV_CHECK_ARG(dy_in.defined() && dy_in.shape() == x_in.shape(), "[", op, "] dy ",
                dy_in.defined() ? str(dy_in.shape()) : "(undefined)", " must have x's shape ", str(x_in.shape()));
  QKV_CHECK_ARG(rstd_in.defined() && rstd_in.shape() == lead, "[", op, "] rstd ",
                rstd_in.defined() ? str(rstd_in.shape()) : "(undefined)", " must be ", str(lead), " for x ",
                str(x_in.shape()));
  const Tensor x = x_in.contiguous(), dy = dy_in.contiguous(), rstd = rstd_in.contiguous();
  const std::vector<float> g = rms_gain(weight, e, unit_offset);
  const int64_t rows = x.numel() / e;
  RmsNormGrads out{Tensor::empty(x.shape()), weight.defined() ? Tensor::zeros({e}) : Tensor()};
  const float *px = x.data(), *pg = dy.data(), *pr = rstd.data();
  float* pdx = out.dx.data();
  // dx = r·(g∘dy) − x·r³·mean(g∘dy∘x);  dweight = Σ_rows dy∘x·r
#pragma omp parallel for schedule(static) if (rows * e >= (int64_t{1} << 16))
  for (int64_t i = 0; i < rows; ++i) {
    const float *xi = px + i * e, *gi = pg + i * e;
    const double r = pr[i];
    double dot = 0.0;
    for (int64_t j = 0; j < e; ++j) dot += static_cast<double>(gi[j]) * g[static_cast<size_t>(j)] * xi[j];
    const double c = r * r * r * dot / static_cast<double>(e);
    float* dxi = pdx + i * e;
    for (int64_t j = 0; j < e; ++j)
      dxi[j] = static_cast<float>(r * gi[j] * g[static_cast<size_t>(j)] - c * xi[j]);
  }
  if (out.dweight.defined()) {
    std::vector<double> acc(static_cast<size_t>(e), 0.0);
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < e; ++j)
        acc[static_cast<size_t>(j)] += static_cast<double>(pg[i * e + j]) * px[i * e + j] * pr[i];
    for (int64_t j = 0; j < e; ++j) out.dweight.data()[j] = static_cast<float>(acc[static_cast<size_t>(j)]);
  }
  return out;
}

}  // namespace qkv
