// dropout: identity in eval or at p = 0, same seed same mask, keep fraction within binomial bounds,
// kept values scaled by 1/(1-p), strided inputs, and p outside [0, 1) rejected.
#include "qkv/ops/dropout.h"

#include <gtest/gtest.h>

#include <cmath>

#include "ops_testing.h"

namespace qkv {
namespace {

using testing::AllClose;
using testing::kExact;
using testing::kFloatVsDouble;
using testing::randn;
using testing::ThrowsArg;

// Allowed deviation of an observed fraction from p over n Bernoulli draws: 6 standard deviations.
double binomial_bound(double p, int64_t n) { return 6.0 * std::sqrt(p * (1.0 - p) / static_cast<double>(n)); }

TEST(Dropout, EvalAndZeroPReturnInputShared) {
  Rng rng(1);
  const Tensor x = randn({4, 5}, 2);
  const uint64_t before = rng.state();
  DropoutResult r = dropout(x, 0.5f, false, rng);
  EXPECT_TRUE(r.y.shares_storage(x));
  EXPECT_FALSE(r.mask.defined());
  r = dropout(x, 0.0f, true, rng);
  EXPECT_TRUE(r.y.shares_storage(x));
  EXPECT_FALSE(r.mask.defined());
  EXPECT_EQ(rng.state(), before);  // no draws
}

TEST(Dropout, SameSeedSameMask) {
  const Tensor x = randn({33, 17}, 3);
  Rng a(42), b(42), c(43);
  const DropoutResult ra = dropout(x, 0.3f, true, a), rb = dropout(x, 0.3f, true, b),
                      rc = dropout(x, 0.3f, true, c);
  EXPECT_EQ(ra.mask.to_vector(), rb.mask.to_vector());
  EXPECT_EQ(ra.y.to_vector(), rb.y.to_vector());
  EXPECT_NE(ra.mask.to_vector(), rc.mask.to_vector());
}

TEST(Dropout, KeepFractionAndInvertedScaling) {
  const int64_t n = 100000;
  const Tensor x = Tensor::full({n}, 2.0f);
  for (float p : {0.1f, 0.5f, 0.9f}) {
    Rng rng(7);
    const DropoutResult r = dropout(x, p, true, rng);
    const std::vector<float> y = r.y.to_vector(), m = r.mask.to_vector();
    int64_t kept = 0;
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_TRUE(m[i] == 0.0f || m[i] == 1.0f);
      kept += m[i] == 1.0f;
    }
    EXPECT_NEAR(static_cast<double>(kept) / n, 1.0 - p, binomial_bound(p, n)) << p;
    std::vector<double> ref(n);
    for (int64_t i = 0; i < n; ++i) ref[i] = m[i] * 2.0 / (1.0 - static_cast<double>(p));
    EXPECT_TRUE(AllClose(r.y, ref, kFloatVsDouble)) << p;
  }
}

TEST(Dropout, NonContiguousInput) {
  const Tensor x = randn({7, 3}, 5).transpose(0, 1);
  Rng rng(9);
  const DropoutResult r = dropout(x, 0.5f, true, rng);
  EXPECT_EQ(r.y.shape(), (Shape{3, 7}));
  const std::vector<double> xs = testing::to_double(x);
  const std::vector<float> m = r.mask.to_vector();
  std::vector<double> ref(xs.size());
  for (size_t i = 0; i < xs.size(); ++i) ref[i] = xs[i] * m[i] * 2.0;
  EXPECT_TRUE(AllClose(r.y, ref, kFloatVsDouble));
}

TEST(Dropout, RejectsPOutsideZeroOne) {
  Rng rng(1);
  const Tensor x = randn({2}, 1);
  EXPECT_TRUE(ThrowsArg([&] { dropout(x, 1.0f, true, rng); }, "[dropout]"));
  EXPECT_TRUE(ThrowsArg([&] { dropout(x, -0.1f, true, rng); }, "[dropout]"));
  EXPECT_TRUE(ThrowsArg([&] { dropout(x, NAN, true, rng); }, "[dropout]"));
  EXPECT_TRUE(ThrowsArg([&] { dropout(x, 1.5f, false, rng); }, "[dropout]"));  // checked in eval too
  EXPECT_TRUE(ThrowsArg([&] { dropout(Tensor(), 0.5f, true, rng); }, "[dropout]"));
}

// --- backward ----------------------------------------------------------------------------------------------

TEST(DropoutBackward, UsesForwardMaskAndScale) {
  Rng rng(3);
  const Tensor x = randn({7, 5}, 4);
  const float p = 0.4f;
  const DropoutResult f = dropout(x, p, true, rng);
  const Tensor dy = randn({7, 5}, 5);
  const std::vector<double> g = testing::to_double(dy);
  const std::vector<float> m = f.mask.to_vector();
  std::vector<double> want(g.size());
  for (size_t i = 0; i < g.size(); ++i) want[i] = g[i] * m[i] / (1.0 - p);
  EXPECT_TRUE(AllClose(dropout_backward(dy, f.mask, p), want, kFloatVsDouble));
  // Strided dy.
  const Tensor dyt = randn({5, 7}, 6).transpose(0, 1);
  const std::vector<double> gt = testing::to_double(dyt);
  for (size_t i = 0; i < gt.size(); ++i) want[i] = gt[i] * m[i] / (1.0 - p);
  EXPECT_TRUE(AllClose(dropout_backward(dyt, f.mask, p), want, kFloatVsDouble));
}

TEST(DropoutBackward, EvalModeIsIdentity) {
  const Tensor dy = randn({3}, 7);
  EXPECT_TRUE(dropout_backward(dy, Tensor(), 0.5f).shares_storage(dy));
}

TEST(DropoutBackward, RejectsBadInputs) {
  EXPECT_TRUE(ThrowsArg([] { dropout_backward(randn({3}, 1), Tensor::ones({4}), 0.5f); }, "[dropout_backward]"));
  EXPECT_TRUE(ThrowsArg([] { dropout_backward(randn({3}, 1), Tensor::ones({3}), 1.0f); }, "[dropout_backward]"));
  EXPECT_TRUE(ThrowsArg([] { dropout_backward(Tensor(), Tensor(), 0.5f); }, "[dropout_backward]"));
}

}  // namespace
}  // namespace qkv
