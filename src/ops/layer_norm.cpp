// LayerNorm over the last dimension, double-accumulated, biased variance as PyTorch; the forward returns mean and
// rstd for the backward (llm.c's formula). add_layer_norm_: the fused in-place inference step, beside its twin.
#include "qkv/ops/layer_norm.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "layer_norm_rows.h"
#include "qkv/core/error.h"
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
  float* py = r.y.data();
  float* pm = r.mean.data();
  float* ps = r.rstd.data();
#pragma omp parallel for schedule(static) if (rows * e >= (int64_t{1} << 15) && rows > 1)
  for (int64_t i = 0; i < rows; ++i) {
    const float* xr = px + i * e;
    double sum = 0.0;
    for (int64_t j = 0; j < e; ++j) sum += xr[j];
    const double mean = sum / static_cast<double>(e);
    double var = 0.0;
    for (int64_t j = 0; j < e; ++j) {
      const double d = xr[j] - mean;
      var += d * d;
    }
    var /= static_cast<double>(e);
    const double rsd = 1.0 / std::sqrt(var + static_cast<double>(eps));
    pm[i] = static_cast<float>(mean);
    ps[i] = static_cast<float>(rsd);
    float* yr = py + i * e;
    // Centre in double: a float mean would cost |mean| * 2^-24 absolute on every element.
    for (int64_t j = 0; j < e; ++j) {
      float v = static_cast<float>((xr[j] - mean) * rsd);
      if (pw) v *= pw[j];
      if (pb) v += pb[j];
      yr[j] = v;
    }
  }
  return r;
}

namespace layer_norm_rows {

void portable(float* y, const float* x, int64_t x_stride, const float* c, const float* w, const float* b,
              int64_t rows, int64_t e, float eps) {
  for (int64_t r = 0; r < rows; ++r) {
    float* yr = y + r * e;
    const float* xr = x ? x + r * x_stride : nullptr;
    double sum = 0.0;
    for (int64_t j = 0; j < e; ++j) {
      float v = yr[j];
      if (c) v += c[j];
      if (xr) v = xr[j] + v;
      yr[j] = v;
      sum += v;
    }
    const double mean = sum / static_cast<double>(e);
    double var = 0.0;
    for (int64_t j = 0; j < e; ++j) {
      const double d = yr[j] - mean;
      var += d * d;
    }
    var /= static_cast<double>(e);
    const double rsd = 1.0 / std::sqrt(var + static_cast<double>(eps));
    for (int64_t j = 0; j < e; ++j) {
      float v = static_cast<float>((yr[j] - mean) * rsd);
      if (w) v *= w[j];
      if (b) v += b[j];
      yr[j] = v;
    }
  }
}

}  // namespace layer_norm_rows

namespace {

bool cpu_has_avx2() {
  static const bool on = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return on;
}

}  // namespace

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
  const auto kernel = cpu_has_avx2() ? layer_norm_rows::avx2 : layer_norm_rows::portable;
  // Blocks of rows (about 16K elements each) spread over the threads.
  const int64_t block = std::max<int64_t>(1, (int64_t{1} << 14) / e);
  const int64_t blocks = (rows + block - 1) / block;
#pragma omp parallel for schedule(static) if (blocks > 1)
  for (int64_t k = 0; k < blocks; ++k) {
    const int64_t r0 = k * block, n = std::min(block, rows - r0);
    kernel(py + r0 * e, px ? px + r0 * x_stride : nullptr, x_stride, pc, pw, pb, n, e, eps);
  }
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
  float* pdx = g.dx.data();
  // dx = rstd * (dnorm - mean(dnorm) - xhat * mean(dnorm * xhat)),  dnorm = dy * weight.
#pragma omp parallel for schedule(static) if (rows * e >= (int64_t{1} << 15) && rows > 1)
  for (int64_t i = 0; i < rows; ++i) {
    const float* xr = px + i * e;
    const float* gr = pg + i * e;
    const double m = pm[i], rs = ps[i];
    double sum_dn = 0.0, sum_dn_xhat = 0.0;
    for (int64_t j = 0; j < e; ++j) {
      const double dn = pw ? static_cast<double>(gr[j]) * pw[j] : gr[j];
      sum_dn += dn;
      sum_dn_xhat += dn * (xr[j] - m) * rs;
    }
    const double mean_dn = sum_dn / static_cast<double>(e), mean_dn_xhat = sum_dn_xhat / static_cast<double>(e);
    float* dr = pdx + i * e;
    for (int64_t j = 0; j < e; ++j) {
      const double dn = pw ? static_cast<double>(gr[j]) * pw[j] : gr[j];
      dr[j] = static_cast<float>(rs * (dn - mean_dn - (xr[j] - m) * rs * mean_dn_xhat));
    }
  }
  // Parameter gradients: column sums over rows, in double.
  std::vector<double> dw(static_cast<size_t>(e), 0.0), db(static_cast<size_t>(e), 0.0);
  for (int64_t i = 0; i < rows; ++i) {
    const float* xr = px + i * e;
    const float* gr = pg + i * e;
    const double m = pm[i], rs = ps[i];
    for (int64_t j = 0; j < e; ++j) {
      db[static_cast<size_t>(j)] += gr[j];
      dw[static_cast<size_t>(j)] += static_cast<double>(gr[j]) * (xr[j] - m) * rs;
    }
  }
  float* pdb = g.dbias.data();
  for (int64_t j = 0; j < e; ++j) pdb[j] = static_cast<float>(db[static_cast<size_t>(j)]);
  if (g.dweight.defined()) {
    float* pdw = g.dweight.data();
    for (int64_t j = 0; j < e; ++j) pdw[j] = static_cast<float>(dw[static_cast<size_t>(j)]);
  }
  return g;
}

}  // namespace qkv
