// LayerNorm rows (tape forward/backward, the fused residual + LayerNorm) and the activations (every vectorised
// activation, SiLU on strided input, the bias + GELU epilogue): each build named explicitly and compared with its
// plain reference against a float64 oracle on odd sizes (split from kernels_isa_test.cpp).
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <iostream>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels_isa_testing.h"
#include "qkv/core/tensor.h"
#include "qkv/kernels/activations.h"
#include "qkv/kernels/cpu.h"
#include "qkv/kernels/layer_norm.h"
#include "qkv/ops/elementwise.h"

namespace qkv {
namespace {

using kernels::Isa;
using namespace testing;  // kernels_isa_testing.h: random_floats, Close and its tolerances, runnable, kWidths

// --- LayerNorm --------------------------------------------------------------------------------------------------

struct LnCase {
  int64_t rows, e;
  bool affine;
};

std::vector<LnCase> ln_cases() {
  std::vector<LnCase> cs;
  for (int64_t e : kWidths)
    for (int64_t rows : {1, 5}) cs.push_back({rows, e, e % 2 == 1});
  cs.push_back({300, 129, true});  // rows·E >= 2^15: the reference's threaded rows; 2^17 is the tape kernels'
  cs.push_back({1100, 127, true});
  return cs;
}

// float64 LayerNorm of one row set: y, mean, rstd.
void ln_oracle(const std::vector<float>& x, const float* w, const float* b, double eps, int64_t rows, int64_t e,
               std::vector<double>& y, std::vector<double>& mean, std::vector<double>& rstd) {
  y.assign(x.size(), 0.0);
  mean.assign(static_cast<size_t>(rows), 0.0);
  rstd.assign(static_cast<size_t>(rows), 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    double s = 0.0, q = 0.0;
    for (int64_t j = 0; j < e; ++j) s += x[r * e + j];
    const double m = s / e;
    for (int64_t j = 0; j < e; ++j) q += (x[r * e + j] - m) * (x[r * e + j] - m);
    const double rs = 1.0 / std::sqrt(q / e + eps);
    mean[r] = m;
    rstd[r] = rs;
    for (int64_t j = 0; j < e; ++j)
      y[r * e + j] = (x[r * e + j] - m) * rs * (w ? w[j] : 1.0) + (b ? b[j] : 0.0);
  }
}

// float64 LayerNorm backward: dx, dw, db.
void ln_backward_oracle(const std::vector<float>& x, const float* w, const std::vector<float>& dy, double eps,
                        int64_t rows, int64_t e, std::vector<double>& dx, std::vector<double>& dw,
                        std::vector<double>& db) {
  std::vector<double> y, mean, rstd;
  ln_oracle(x, nullptr, nullptr, eps, rows, e, y, mean, rstd);  // y = x̂
  dx.assign(x.size(), 0.0);
  dw.assign(static_cast<size_t>(e), 0.0);
  db.assign(static_cast<size_t>(e), 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    double sdn = 0.0, sdnx = 0.0;
    for (int64_t j = 0; j < e; ++j) {
      const double dn = dy[r * e + j] * (w ? w[j] : 1.0);
      sdn += dn;
      sdnx += dn * y[r * e + j];
      dw[j] += dy[r * e + j] * y[r * e + j];
      db[j] += dy[r * e + j];
    }
    for (int64_t j = 0; j < e; ++j) {
      const double dn = dy[r * e + j] * (w ? w[j] : 1.0);
      dx[r * e + j] = rstd[r] * (dn - sdn / e - y[r * e + j] * sdnx / e);
    }
  }
}

TEST(LayerNormKernels, ForwardReferenceAndTapeKernelMatchFloat64Oracle) {
  uint32_t seed = 100;
  for (const LnCase& c : ln_cases()) {
    SCOPED_TRACE("rows " + std::to_string(c.rows) + " e " + std::to_string(c.e));
    const size_t n = static_cast<size_t>(c.rows * c.e);
    std::vector<float> x = random_floats(n, ++seed);
    for (float& v : x) v += 3.0f;  // an offset mean: centring must not lose it
    const std::vector<float> w = random_floats(c.e, ++seed), b = random_floats(c.e, ++seed);
    const float* pw = c.affine ? w.data() : nullptr;
    const float* pb = c.affine ? b.data() : nullptr;
    std::vector<double> y, mean, rstd;
    ln_oracle(x, pw, pb, 1e-5, c.rows, c.e, y, mean, rstd);
    std::vector<float> yr(n), mr(c.rows), sr(c.rows), yt(n), mt(c.rows), st(c.rows);
    kernels::layer_norm_rows_reference(x.data(), pw, pb, 1e-5f, c.rows, c.e, yr.data(), mr.data(), sr.data());
    kernels::layer_norm_rows(x.data(), pw, pb, 1e-5f, c.rows, c.e, yt.data(), mt.data(), st.data());
    EXPECT_TRUE(Close(yr, y, kDoubleStats, "reference y"));
    EXPECT_TRUE(Close(mr, mean, kDoubleStats, "reference mean"));
    EXPECT_TRUE(Close(sr, rstd, kDoubleStats, "reference rstd"));
    EXPECT_TRUE(Close(yt, y, kFloatStats, "tape y"));
    EXPECT_TRUE(Close(mt, mean, kFloatStats, "tape mean"));
    EXPECT_TRUE(Close(st, rstd, kFloatStats, "tape rstd"));
  }
}

TEST(LayerNormKernels, BackwardReferenceAndTapeKernelMatchFloat64Oracle) {
  uint32_t seed = 200;
  for (const LnCase& c : ln_cases()) {
    SCOPED_TRACE("rows " + std::to_string(c.rows) + " e " + std::to_string(c.e));
    const size_t n = static_cast<size_t>(c.rows * c.e);
    const std::vector<float> x = random_floats(n, ++seed), dy = random_floats(n, ++seed);
    const std::vector<float> w = random_floats(c.e, ++seed), base = random_floats(n, ++seed);
    const float* pw = c.affine ? w.data() : nullptr;
    std::vector<double> dx, dw, db;
    ln_backward_oracle(x, pw, dy, 1e-5, c.rows, c.e, dx, dw, db);
    std::vector<float> mean(c.rows), rstd(c.rows), y(n);
    kernels::layer_norm_rows_reference(x.data(), nullptr, nullptr, 1e-5f, c.rows, c.e, y.data(), mean.data(),
                                       rstd.data());
    std::vector<float> rdx(n), rdw(c.e), rdb(c.e);
    kernels::layer_norm_rows_backward_reference(x.data(), pw, mean.data(), rstd.data(), dy.data(), c.rows, c.e,
                                                rdx.data(), rdw.data(), rdb.data());
    EXPECT_TRUE(Close(rdx, dx, kDoubleStats, "reference dx"));
    EXPECT_TRUE(Close(rdw, dw, kDoubleStats, "reference dw"));
    EXPECT_TRUE(Close(rdb, db, kDoubleStats, "reference db"));
    std::vector<float> tdx(n), tdw(c.e), tdb(c.e);
    kernels::layer_norm_rows_backward(x.data(), pw, mean.data(), rstd.data(), dy.data(), c.rows, c.e, tdx.data(),
                                      nullptr, tdw.data(), tdb.data());
    EXPECT_TRUE(Close(tdx, dx, kFloatStats, "tape dx"));
    EXPECT_TRUE(Close(tdw, dw, kFloatStats, "tape dw"));
    EXPECT_TRUE(Close(tdb, db, kFloatStats, "tape db"));
    // Accumulating into a base gradient, in place: dx = base + the same.
    std::vector<float> acc = base;
    kernels::layer_norm_rows_backward(x.data(), pw, mean.data(), rstd.data(), dy.data(), c.rows, c.e, acc.data(),
                                      acc.data(), nullptr, nullptr);
    std::vector<double> want(n);
    for (size_t i = 0; i < n; ++i) want[i] = base[i] + dx[i];
    EXPECT_TRUE(Close(acc, want, kFloatStats, "tape dx accumulated"));
  }
}

TEST(LayerNormKernels, FusedResidualLayerNormEveryPathMatchesFloat64Oracle) {
  using Fn = void (*)(float*, const float*, int64_t, const float*, const float*, const float*, int64_t, int64_t,
                      float);
  const std::vector<Isa> paths = runnable({Isa::kPortable, Isa::kAvx2}, "add_layer_norm_rows");
  uint32_t seed = 300;
  for (Isa isa : paths) {
    const Fn fn = isa == Isa::kAvx2 ? kernels::avx2::add_layer_norm_rows : kernels::portable::add_layer_norm_rows;
    for (const LnCase& c : ln_cases())
      for (int terms = 0; terms < 4; ++terms) {  // bit 0: residual x (strided rows), bit 1: bias c
        SCOPED_TRACE(std::string(kernels::isa_name(isa)) + " rows " + std::to_string(c.rows) + " e " +
                     std::to_string(c.e) + " terms " + std::to_string(terms));
        const int64_t xs = c.e + 3;  // x rows further apart than y's
        const size_t n = static_cast<size_t>(c.rows * c.e);
        const std::vector<float> y0 = random_floats(n, ++seed), xr = random_floats(c.rows * xs, ++seed);
        const std::vector<float> cb = random_floats(c.e, ++seed), w = random_floats(c.e, ++seed),
                                 b = random_floats(c.e, ++seed);
        const float* px = terms & 1 ? xr.data() : nullptr;
        const float* pc = terms & 2 ? cb.data() : nullptr;
        const float* pw = c.affine ? w.data() : nullptr;
        const float* pb = c.affine ? b.data() : nullptr;
        std::vector<float> s(n);
        for (int64_t r = 0; r < c.rows; ++r)
          for (int64_t j = 0; j < c.e; ++j)
            s[r * c.e + j] = (px ? px[r * xs + j] : 0.0f) + (y0[r * c.e + j] + (pc ? pc[j] : 0.0f));
        std::vector<double> want, mean, rstd;
        ln_oracle(s, pw, pb, 1e-5, c.rows, c.e, want, mean, rstd);
        std::vector<float> y = y0;
        fn(y.data(), px, xs, pc, pw, pb, c.rows, c.e, 1e-5f);
        EXPECT_TRUE(Close(y, want, kDoubleStats, "y"));
        // The threaded dispatcher gives the result of the path active_isa() selects.
        if (isa == (kernels::active_isa() >= Isa::kAvx2 ? Isa::kAvx2 : Isa::kPortable)) {
          std::vector<float> yd = y0;
          kernels::add_layer_norm_rows(yd.data(), px, xs, pc, pw, pb, c.rows, c.e, 1e-5f);
          EXPECT_EQ(yd, y);
        }
      }
  }
}

// --- activations ------------------------------------------------------------------------------------------------

TEST(ActivationKernels, EveryPathMatchesFloat64Oracle) {
  struct Path {
    Isa isa;
    void (*gelu)(const float*, float*, int64_t, bool);
    void (*gelu_bwd)(const float*, const float*, float*, int64_t, bool);
    void (*tanh)(const float*, float*, int64_t);
    void (*sigmoid)(const float*, float*, int64_t);
    void (*silu)(const float*, float*, int64_t);
  };
  const std::vector<Path> all{
      {Isa::kPortable, kernels::portable::gelu_forward, kernels::portable::gelu_backward,
       kernels::portable::tanh_forward, kernels::portable::sigmoid_forward, kernels::portable::silu_forward},
      {Isa::kAvx2, kernels::avx2::gelu_forward, kernels::avx2::gelu_backward, kernels::avx2::tanh_forward,
       kernels::avx2::sigmoid_forward, kernels::avx2::silu_forward}};
  const std::vector<Isa> paths = runnable({Isa::kPortable, Isa::kAvx2}, "activations");
  const double k = 0.7978845608028654, c = 0.044715;  // sqrt(2/pi), the tanh form's cubic coefficient
  uint32_t seed = 350;
  for (const Path& p : all) {
    if (std::find(paths.begin(), paths.end(), p.isa) == paths.end()) continue;
    for (int64_t n : kWidths) {
      SCOPED_TRACE(std::string(kernels::isa_name(p.isa)) + " n " + std::to_string(n));
      const std::vector<float> x = random_floats(n, ++seed, -8.0f, 8.0f), dy = random_floats(n, ++seed);
      std::vector<double> ge(n), gt(n), dge(n), dgt(n), th(n), sg(n), sl(n);
      for (int64_t i = 0; i < n; ++i) {
        const double v = x[i], t = std::tanh(k * (v + c * v * v * v));
        ge[i] = 0.5 * v * (1.0 + std::erf(v / std::sqrt(2.0)));
        gt[i] = 0.5 * v * (1.0 + t);
        const double pdf = std::exp(-0.5 * v * v) / std::sqrt(2.0 * M_PI);
        dge[i] = dy[i] * (0.5 * (1.0 + std::erf(v / std::sqrt(2.0))) + v * pdf);
        dgt[i] = dy[i] * (0.5 * (1.0 + t) + 0.5 * v * (1.0 - t * t) * k * (1.0 + 3.0 * c * v * v));
        th[i] = std::tanh(v);
        sg[i] = 1.0 / (1.0 + std::exp(-v));
        sl[i] = v * sg[i];
      }
      std::vector<float> y(n);
      p.gelu(x.data(), y.data(), n, false);
      EXPECT_TRUE(Close(y, ge, kPolynomial, "gelu"));
      p.gelu(x.data(), y.data(), n, true);
      EXPECT_TRUE(Close(y, gt, kPolynomial, "gelu tanh"));
      p.gelu_bwd(x.data(), dy.data(), y.data(), n, false);
      EXPECT_TRUE(Close(y, dge, kPolynomial, "gelu backward"));
      p.gelu_bwd(x.data(), dy.data(), y.data(), n, true);
      EXPECT_TRUE(Close(y, dgt, kPolynomial, "gelu tanh backward"));
      p.tanh(x.data(), y.data(), n);
      EXPECT_TRUE(Close(y, th, kPolynomial, "tanh"));
      p.sigmoid(x.data(), y.data(), n);
      EXPECT_TRUE(Close(y, sg, kPolynomial, "sigmoid"));
      p.silu(x.data(), y.data(), n);
      EXPECT_TRUE(Close(y, sl, kPolynomial, "silu"));
    }
    // Far tails and infinities: as the libm reference (ops silu_reference) and PyTorch: -inf gives NaN, +inf inf,
    // and below -88 the product underflows to (minus) zero instead of keeping the clamped exp's ~5e-39.
    const float inf = std::numeric_limits<float>::infinity();
    const std::vector<float> x{-inf, -1000.0f, -100.0f, -88.5f, -87.0f, 0.0f, 90.0f, inf, 3.0f};
    std::vector<float> y(x.size());
    p.silu(x.data(), y.data(), static_cast<int64_t>(x.size()));
    EXPECT_TRUE(std::isnan(y[0])) << kernels::isa_name(p.isa);
    for (size_t i = 1; i < 5; ++i) EXPECT_LE(std::abs(y[i]), 1e-30f) << x[i];
    EXPECT_EQ(y[5], 0.0f);
    EXPECT_FLOAT_EQ(y[6], 90.0f);
    EXPECT_EQ(y[7], inf);
  }
}

TEST(ActivationKernels, SiluOpMatchesItsReferenceOnContiguousAndStridedInput) {
  const Tensor x = Tensor::from_vector({6, 37}, random_floats(6 * 37, 77, -12.0f, 12.0f));
  const Tensor fast = silu(x), ref = silu_reference(x);
  const Tensor strided = silu(x.transpose(0, 1)).contiguous();  // a view: the reference loop
  for (int64_t i = 0; i < x.numel(); ++i)
    EXPECT_NEAR(fast.data()[i], ref.data()[i], 1e-6f + 1e-6f * std::abs(ref.data()[i]));
  for (int64_t r = 0; r < 6; ++r)
    for (int64_t c = 0; c < 37; ++c) EXPECT_EQ(strided.data()[c * 6 + r], ref.data()[r * 37 + c]);
}

// A large tensor runs in threaded chunks: the bits of one kernel call over the whole of it, for 1 and 2 threads.
TEST(ActivationKernels, SiluOpInThreadedChunksGivesTheBitsOfOneCall) {
  const int64_t n = 5 * (int64_t{1} << 14) + 13;
  const Tensor x = Tensor::from_vector({n}, random_floats(static_cast<size_t>(n), 91, -12.0f, 12.0f));
  std::vector<float> whole(static_cast<size_t>(n));
  kernels::silu_forward(x.data(), whole.data(), n);
  const int saved = omp_get_max_threads();
  for (int threads : {1, 2}) {
    omp_set_num_threads(threads);
    const Tensor y = silu(x);
    EXPECT_EQ(std::memcmp(y.data(), whole.data(), whole.size() * sizeof(float)), 0) << threads << " threads";
  }
  omp_set_num_threads(saved);
}

// --- bias + GELU ------------------------------------------------------------------------------------------------

TEST(ActivationKernels, AddBiasGeluMatchesFloat64Oracle) {
  uint32_t seed = 400;
  for (bool tanh_approx : {false, true})
    for (int64_t f : {1, 7, 9, 33, 2049})
      for (int64_t rows : {1, 3, 40}) {  // 40 x 2049: several blocks over the threads
        SCOPED_TRACE("f " + std::to_string(f) + " rows " + std::to_string(rows) + " tanh " +
                     std::to_string(tanh_approx));
        const size_t n = static_cast<size_t>(rows * f);
        const std::vector<float> x0 = random_floats(n, ++seed, -5.0f, 5.0f), bias = random_floats(f, ++seed);
        for (bool with_bias : {false, true}) {
          std::vector<double> want(n);
          for (size_t i = 0; i < n; ++i) {
            const double v = static_cast<double>(x0[i] + (with_bias ? bias[i % f] : 0.0f));
            want[i] = tanh_approx ? 0.5 * v * (1.0 + std::tanh(0.7978845608028654 * (v + 0.044715 * v * v * v)))
                                  : 0.5 * v * (1.0 + std::erf(v / std::sqrt(2.0)));
          }
          std::vector<float> x = x0;
          kernels::add_bias_gelu_rows(x.data(), with_bias ? bias.data() : nullptr, rows, f, tanh_approx);
          EXPECT_TRUE(Close(x, want, kPolynomial, with_bias ? "gelu(x + b)" : "gelu(x)"));
        }
      }
}
}  // namespace
}  // namespace qkv
