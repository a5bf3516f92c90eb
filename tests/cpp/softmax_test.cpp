// softmax / log_softmax along every axis against float64, plus the edges: -inf entries, all -inf rows,
// huge logits (max subtraction), strided inputs and bad axes.
#include "qkv/ops/softmax.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "ops_testing.h"

namespace qkv {
namespace {

using testing::AllClose;
using testing::kFloatVsDouble;
using testing::randn;
using testing::ThrowsArg;

constexpr float kInf = std::numeric_limits<float>::infinity();

// Softmax of contiguous-copied x along `axis` in double; log form when `log`.
std::vector<double> softmax_ref(const Tensor& x, int64_t axis, bool log) {
  std::vector<double> v = testing::to_double(x);
  axis = axis < 0 ? axis + x.dim() : axis;
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < axis; ++d) outer *= x.size(d);
  for (int64_t d = axis + 1; d < x.dim(); ++d) inner *= x.size(d);
  const int64_t n = x.size(axis);
  std::vector<double> r(v.size());
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t i = 0; i < inner; ++i) {
      auto at = [&](int64_t j) { return static_cast<size_t>((o * n + j) * inner + i); };
      double mx = -INFINITY;
      for (int64_t j = 0; j < n; ++j) mx = std::max(mx, v[at(j)]);
      double s = 0;
      for (int64_t j = 0; j < n; ++j) s += std::exp(v[at(j)] - mx);
      for (int64_t j = 0; j < n; ++j)
        r[at(j)] = log ? v[at(j)] - mx - std::log(s) : std::exp(v[at(j)] - mx) / s;
    }
  return r;
}

TEST(Softmax, EveryAxisOddSizesMatchFloat64) {
  const Tensor x = randn({3, 7, 17}, 1, 3.0f);
  for (int64_t axis : {0, 1, 2, -1, -3}) {
    EXPECT_TRUE(AllClose(softmax(x, axis), softmax_ref(x, axis, false), kFloatVsDouble)) << axis;
    EXPECT_TRUE(AllClose(log_softmax(x, axis), softmax_ref(x, axis, true), kFloatVsDouble)) << axis;
  }
  for (int64_t n : {1, 3, 33}) {
    const Tensor y = randn({2, n}, 2 + n);
    EXPECT_TRUE(AllClose(softmax(y), softmax_ref(y, -1, false), kFloatVsDouble)) << n;
  }
}

TEST(Softmax, RowsSumToOne) {
  const Tensor y = softmax(randn({33, 17}, 3, 5.0f));
  const std::vector<float> v = y.to_vector();
  for (int64_t r = 0; r < 33; ++r) {
    double s = 0;
    for (int64_t j = 0; j < 17; ++j) s += v[r * 17 + j];
    EXPECT_NEAR(s, 1.0, 1e-6) << r;
  }
}

TEST(Softmax, HugeLogitsDoNotOverflow) {
  const Tensor x = Tensor::from_vector({1, 3}, {1000.0f, 999.0f, -1000.0f});
  EXPECT_TRUE(AllClose(softmax(x), softmax_ref(x, -1, false), kFloatVsDouble));
  EXPECT_TRUE(AllClose(log_softmax(x), softmax_ref(x, -1, true), kFloatVsDouble));
}

TEST(Softmax, MinusInfEntriesGetZeroWeight) {
  const Tensor x = Tensor::from_vector({1, 3}, {0.5f, -kInf, 0.5f});
  const std::vector<float> y = softmax(x).to_vector();
  EXPECT_FLOAT_EQ(y[0], 0.5f);
  EXPECT_EQ(y[1], 0.0f);
  EXPECT_FLOAT_EQ(y[2], 0.5f);
  EXPECT_EQ(log_softmax(x).at({0, 1}), -kInf);
}

TEST(Softmax, FullyMaskedRowIsZeroNotNaN) {
  const Tensor x = Tensor::from_vector({2, 3}, {-kInf, -kInf, -kInf, 1.0f, 2.0f, 3.0f});
  const Tensor y = softmax(x);
  for (int64_t j = 0; j < 3; ++j) EXPECT_EQ(y.at({0, j}), 0.0f);
  EXPECT_TRUE(AllClose(y.select(0, 1), softmax_ref(x.select(0, 1), -1, false), kFloatVsDouble));
  // Along a non-last axis too.
  const Tensor yt = softmax(x.transpose(0, 1), 1);
  for (int64_t j = 0; j < 3; ++j) EXPECT_EQ(yt.at({j, 0}), 0.0f);
  // log_softmax of a fully masked row is log 0 = -inf, still not NaN.
  const Tensor l = log_softmax(x);
  for (int64_t j = 0; j < 3; ++j) EXPECT_EQ(l.at({0, j}), -kInf);
}

TEST(Softmax, NonContiguousInput) {
  const Tensor x = randn({17, 7}, 4).transpose(0, 1);  // (7, 17)
  EXPECT_TRUE(AllClose(softmax(x), softmax_ref(x.contiguous(), -1, false), kFloatVsDouble));
  const Tensor s = randn({5, 20}, 5).slice(1, 1, 20, 3);
  EXPECT_TRUE(AllClose(log_softmax(s), softmax_ref(s.contiguous(), -1, true), kFloatVsDouble));
}

TEST(Softmax, LargeInputUsesThreadsAndStillMatches) {
  const Tensor x = randn({300, 129}, 6);
  EXPECT_TRUE(AllClose(softmax(x), softmax_ref(x, -1, false), kFloatVsDouble));
}

TEST(Softmax, RejectsBadAxisAndScalar) {
  EXPECT_TRUE(ThrowsArg([] { softmax(randn({2, 3}, 1), 2); }, "[softmax]"));
  EXPECT_TRUE(ThrowsArg([] { log_softmax(randn({2, 3}, 1), -3); }, "[log_softmax]"));
  EXPECT_TRUE(ThrowsArg([] { softmax(Tensor::scalar(1.0f)); }, "[softmax]"));
  EXPECT_TRUE(ThrowsArg([] { softmax(Tensor()); }, "[softmax]"));
}

// --- backward halves ----------------------------------------------------------------------------------------

using testing::GradMatches;

TEST(SoftmaxBackward, EveryAxisMatchesFiniteDifferences) {
  const Tensor x = randn({3, 4, 5}, 60, 2.0f);
  const Tensor r = randn({3, 4, 5}, 61);
  const std::vector<double> rd = testing::to_double(r);
  for (int64_t axis : {0, 1, -1}) {
    for (bool log : {false, true}) {
      auto fwd = [&](const std::vector<double>& xv) {
        // Double twin: same slicing as softmax_ref, on the perturbed values.
        std::vector<double> out(xv.size());
        const int64_t ax = axis < 0 ? axis + 3 : axis;
        int64_t outer = 1, inner = 1;
        for (int64_t d = 0; d < ax; ++d) outer *= x.size(d);
        for (int64_t d = ax + 1; d < 3; ++d) inner *= x.size(d);
        const int64_t n = x.size(ax);
        for (int64_t o = 0; o < outer; ++o)
          for (int64_t i = 0; i < inner; ++i) {
            auto at = [&](int64_t j) { return static_cast<size_t>((o * n + j) * inner + i); };
            double mx = -INFINITY, sum = 0;
            for (int64_t j = 0; j < n; ++j) mx = std::max(mx, xv[at(j)]);
            for (int64_t j = 0; j < n; ++j) sum += std::exp(xv[at(j)] - mx);
            for (int64_t j = 0; j < n; ++j)
              out[at(j)] = log ? xv[at(j)] - mx - std::log(sum) : std::exp(xv[at(j)] - mx) / sum;
          }
        return out;
      };
      const Tensor dx = log ? log_softmax_backward(log_softmax(x, axis), r, axis)
                            : softmax_backward(softmax(x, axis), r, axis);
      EXPECT_TRUE(GradMatches(dx, fwd, x, rd)) << "axis " << axis << " log " << log;
    }
  }
}

TEST(SoftmaxBackward, StridedInputsMatchContiguous) {
  const Tensor x = randn({7, 5}, 62).transpose(0, 1);
  const Tensor y = softmax(x);
  const Tensor r = randn({5, 14}, 63).slice(1, 0, 14, 2);
  EXPECT_TRUE(AllClose(softmax_backward(y, r), testing::to_double(softmax_backward(y.contiguous(), r.contiguous())),
                       testing::kExact));
}

TEST(SoftmaxBackward, FullyMaskedRowGetsZeroGradientNotNaN) {
  const Tensor x = Tensor::from_vector({2, 3}, {-kInf, -kInf, -kInf, 1.0f, -kInf, 2.0f});
  const Tensor dy = Tensor::from_vector({2, 3}, {1.0f, kInf, -2.0f, 0.5f, kInf, -1.0f});
  const Tensor dx = softmax_backward(softmax(x), dy);
  for (int64_t j = 0; j < 3; ++j) EXPECT_EQ(dx.at({0, j}), 0.0f) << j;
  EXPECT_EQ(dx.at({1, 1}), 0.0f);  // masked entry, even with an infinite upstream gradient
  for (float v : dx.to_vector()) EXPECT_TRUE(std::isfinite(v));
  // The live entries of row 1 are the two-element softmax backward.
  const Tensor live = softmax_backward(softmax(Tensor::from_vector({1, 2}, {1.0f, 2.0f})),
                                       Tensor::from_vector({1, 2}, {0.5f, -1.0f}));
  EXPECT_FLOAT_EQ(dx.at({1, 0}), live.at({0, 0}));
  EXPECT_FLOAT_EQ(dx.at({1, 2}), live.at({0, 1}));
}

TEST(SoftmaxBackward, RejectsMismatchedShapes) {
  EXPECT_TRUE(ThrowsArg([] { softmax_backward(randn({2, 3}, 1), randn({3, 2}, 2)); }, "[softmax_backward]"));
  EXPECT_TRUE(ThrowsArg([] { log_softmax_backward(randn({2, 3}, 1), randn({2, 3}, 2), 2); },
                        "[log_softmax_backward]"));
  EXPECT_TRUE(ThrowsArg([] { softmax_backward(Tensor(), randn({2}, 2)); }, "[softmax_backward]"));
}

}  // namespace
}  // namespace qkv
