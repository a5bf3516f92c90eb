// layer_norm against a float64 oracle: y, mean and rstd (biased variance), optional affine, strided x, errors.
// A constant row must give y = bias and rstd = 1/sqrt(eps), as in PyTorch.
#include "qkv/ops/layer_norm.h"

#include <gtest/gtest.h>

#include <cmath>

#include "ops_testing.h"
#include "qkv/ops/elementwise.h"

namespace qkv {
namespace {

using testing::AllClose;
using testing::kFloatVsDouble;
using testing::randn;
using testing::ThrowsArg;

struct LnRef {
  std::vector<double> y, mean, rstd, mean_scale;  // mean_scale: mean |x| of the row
};

LnRef layer_norm_ref(const Tensor& x, const Tensor& w, const Tensor& b, double eps) {
  const int64_t e = x.size(-1), rows = x.numel() / e;
  const std::vector<double> X = testing::to_double(x);
  const std::vector<double> W = w.defined() ? testing::to_double(w) : std::vector<double>(e, 1.0);
  const std::vector<double> B = b.defined() ? testing::to_double(b) : std::vector<double>(e, 0.0);
  LnRef r{std::vector<double>(X.size()), std::vector<double>(rows), std::vector<double>(rows),
          std::vector<double>(rows)};
  for (int64_t i = 0; i < rows; ++i) {
    double m = 0, v = 0;
    for (int64_t j = 0; j < e; ++j) m += X[i * e + j];
    m /= e;
    for (int64_t j = 0; j < e; ++j) r.mean_scale[i] += std::fabs(X[i * e + j]) / e;
    for (int64_t j = 0; j < e; ++j) v += (X[i * e + j] - m) * (X[i * e + j] - m);
    v /= e;
    const double rs = 1.0 / std::sqrt(v + eps);
    r.mean[i] = m;
    r.rstd[i] = rs;
    for (int64_t j = 0; j < e; ++j) r.y[i * e + j] = (X[i * e + j] - m) * rs * W[j] + B[j];
  }
  return r;
}

::testing::AssertionResult MatchesRef(const Tensor& x, const Tensor& w, const Tensor& b, float eps = 1e-5f) {
  const LayerNormResult r = layer_norm(x, w, b, eps);
  const LnRef ref = layer_norm_ref(x, w, b, eps);
  Shape lead(x.shape().begin(), x.shape().end() - 1);
  if (r.mean.shape() != lead || r.rstd.shape() != lead || r.y.shape() != x.shape())
    return ::testing::AssertionFailure() << "wrong result shapes";
  auto a = AllClose(r.y, ref.y, kFloatVsDouble);
  if (!a) return a << " (y)";
  // mean is compared against the row's magnitude: it is a cancelling sum.
  a = AllClose(r.mean, ref.mean, kFloatVsDouble, ref.mean_scale);
  if (!a) return a << " (mean)";
  a = AllClose(r.rstd, ref.rstd, kFloatVsDouble);
  if (!a) return a << " (rstd)";
  return ::testing::AssertionSuccess();
}

TEST(LayerNorm, OddWidthsMatchFloat64) {
  for (int64_t e : {1, 3, 7, 17, 33}) {
    const Tensor x = randn({2, 3, e}, e, 2.0f), w = randn({e}, 100 + e), b = randn({e}, 200 + e);
    EXPECT_TRUE(MatchesRef(x, w, b)) << "E=" << e;
    EXPECT_TRUE(MatchesRef(x, Tensor(), Tensor())) << "E=" << e;
    EXPECT_TRUE(MatchesRef(x, w, Tensor())) << "E=" << e;
    EXPECT_TRUE(MatchesRef(x, Tensor(), b)) << "E=" << e;
  }
}

TEST(LayerNorm, OffsetRowsKeepPrecision) {
  // A large common offset: a one-pass E[x^2]-E[x]^2 variance in float would lose it.
  const Tensor x = add_scalar(randn({4, 64}, 7), 1000.0f);
  EXPECT_TRUE(MatchesRef(x, Tensor(), Tensor()));
}

TEST(LayerNorm, ConstantRowGivesBiasAndRstdOfEps) {
  const Tensor x = Tensor::full({2, 5}, 3.0f), b = randn({5}, 1);
  const LayerNormResult r = layer_norm(x, Tensor(), b, 1e-5f);
  EXPECT_TRUE(AllClose(r.y.select(0, 0), testing::to_double(b), kFloatVsDouble));
  EXPECT_TRUE(AllClose(r.rstd, {1.0 / std::sqrt(1e-5), 1.0 / std::sqrt(1e-5)}, kFloatVsDouble));
}

TEST(LayerNorm, NonContiguousInputs) {
  const Tensor x = randn({17, 3, 7}, 2).permute({1, 0, 2}).slice(2, 0, 7, 2);  // (3, 17, 4) strided
  const Tensor w = randn({8}, 3).slice(0, 0, 8, 2), b = randn({4, 2}, 4).select(1, 1);
  EXPECT_TRUE(MatchesRef(x, w, b));
}

TEST(LayerNorm, OneDimensionalInputAndLargeBatch) {
  EXPECT_TRUE(MatchesRef(randn({9}, 5), Tensor(), Tensor()));
  EXPECT_TRUE(MatchesRef(randn({512, 65}, 6), randn({65}, 7), randn({65}, 8)));  // threaded path
}

TEST(LayerNorm, RejectsBadShapes) {
  EXPECT_TRUE(ThrowsArg([] { layer_norm(randn({2, 4}, 1), randn({3}, 2), Tensor()); }, "[layer_norm]"));
  EXPECT_TRUE(ThrowsArg([] { layer_norm(randn({2, 4}, 1), Tensor(), randn({4, 1}, 2)); }, "[layer_norm]"));
  EXPECT_TRUE(ThrowsArg([] { layer_norm(Tensor::scalar(1.0f), Tensor(), Tensor()); }, "[layer_norm]"));
  EXPECT_TRUE(ThrowsArg([] { layer_norm(Tensor::zeros({2, 0}), Tensor(), Tensor()); }, "[layer_norm]"));
  EXPECT_TRUE(ThrowsArg([] { layer_norm(randn({2, 4}, 1), Tensor(), Tensor(), -1.0f); }, "[layer_norm]"));
  EXPECT_TRUE(ThrowsArg([] { layer_norm(Tensor(), Tensor(), Tensor()); }, "[layer_norm]"));
}

// --- backward halves ----------------------------------------------------------------------------------------

using testing::GradMatches;

// Double twin of layer_norm's y with any of x, w, b replaced by perturbed values.
std::vector<double> ln_y(const std::vector<double>& X, const std::vector<double>& W, const std::vector<double>& B,
                         int64_t e, double eps) {
  const int64_t rows = static_cast<int64_t>(X.size()) / e;
  std::vector<double> y(X.size());
  for (int64_t i = 0; i < rows; ++i) {
    double m = 0, v = 0;
    for (int64_t j = 0; j < e; ++j) m += X[i * e + j];
    m /= e;
    for (int64_t j = 0; j < e; ++j) v += (X[i * e + j] - m) * (X[i * e + j] - m);
    const double rs = 1.0 / std::sqrt(v / e + eps);
    for (int64_t j = 0; j < e; ++j) y[i * e + j] = (X[i * e + j] - m) * rs * (W.empty() ? 1.0 : W[j]) + (B.empty() ? 0.0 : B[j]);
  }
  return y;
}

TEST(LayerNormBackward, AllThreeGradsMatchFiniteDifferences) {
  for (int64_t e : {1, 3, 17}) {
    const Tensor x = randn({2, 3, e}, 70 + e, 2.0f), w = randn({e}, 80 + e), b = randn({e}, 90 + e);
    const Tensor r = randn({2, 3, e}, 95 + e);
    const std::vector<double> X = testing::to_double(x), W = testing::to_double(w), B = testing::to_double(b),
                              rd = testing::to_double(r);
    const float eps = 1e-5f;
    const LayerNormResult f = layer_norm(x, w, b, eps);
    const LayerNormGrads g = layer_norm_backward(x, w, f.mean, f.rstd, r);
    EXPECT_TRUE(GradMatches(g.dx, [&](const std::vector<double>& v) { return ln_y(v, W, B, e, eps); }, x, rd)) << e;
    EXPECT_TRUE(GradMatches(g.dweight, [&](const std::vector<double>& v) { return ln_y(X, v, B, e, eps); }, w, rd)) << e;
    EXPECT_TRUE(GradMatches(g.dbias, [&](const std::vector<double>& v) { return ln_y(X, W, v, e, eps); }, b, rd)) << e;
  }
}

TEST(LayerNormBackward, WithoutWeightAndStridedInputs) {
  const int64_t e = 7;
  const Tensor x = randn({e, 5}, 71).transpose(0, 1);  // (5, 7) strided
  const Tensor r = randn({5, 2 * e}, 72).slice(1, 0, 2 * e, 2);
  const LayerNormResult f = layer_norm(x, Tensor(), Tensor());
  const LayerNormGrads g = layer_norm_backward(x, Tensor(), f.mean, f.rstd, r);
  EXPECT_FALSE(g.dweight.defined());
  EXPECT_TRUE(GradMatches(g.dx, [&](const std::vector<double>& v) { return ln_y(v, {}, {}, e, 1e-5f); }, x,
                          testing::to_double(r)));
}

TEST(LayerNormBackward, RejectsMismatchedShapes) {
  const Tensor x = randn({2, 4}, 1);
  const LayerNormResult f = layer_norm(x, Tensor(), Tensor());
  EXPECT_TRUE(ThrowsArg([&] { layer_norm_backward(x, Tensor(), f.mean, f.rstd, randn({2, 3}, 2)); },
                        "[layer_norm_backward]"));
  EXPECT_TRUE(ThrowsArg([&] { layer_norm_backward(x, randn({3}, 3), f.mean, f.rstd, x); }, "[layer_norm_backward]"));
  EXPECT_TRUE(ThrowsArg([&] { layer_norm_backward(x, Tensor(), f.rstd.unsqueeze(0), f.rstd, x); },
                        "[layer_norm_backward]"));
  EXPECT_TRUE(ThrowsArg([&] { layer_norm_backward(x, Tensor(), Tensor(), f.rstd, x); }, "[layer_norm_backward]"));
}

}  // namespace
}  // namespace qkv
