// matmul and linear against a float64 oracle: odd sizes, broadcast batches, strided views, error paths.
// Tolerance is scaled by sum |a_ik * b_kj| so that cancellation in a dot product cannot hide an error.
#include "qkv/ops/matmul.h"

#include <gtest/gtest.h>

#include "ops_testing.h"

namespace qkv {
namespace {

using testing::AllClose;
using testing::kFloatVsDouble;
using testing::randn;
using testing::ThrowsArg;

struct Ref {
  std::vector<double> value, scale;
};

// a: (..., M, K)  b: (..., K, N) broadcast in float64.
Ref matmul_ref(const Tensor& a, const Tensor& b) {
  const int64_t m = a.size(-2), k = a.size(-1), n = b.size(-1);
  Shape batch = broadcast_shapes(Shape(a.shape().begin(), a.shape().end() - 2),
                                 Shape(b.shape().begin(), b.shape().end() - 2), "ref");
  Shape sa = batch, sb = batch;
  sa.insert(sa.end(), {m, k});
  sb.insert(sb.end(), {k, n});
  const std::vector<double> A = testing::to_double(a.expand(sa)), B = testing::to_double(b.expand(sb));
  const int64_t nb = shape_numel(batch);
  Ref r{std::vector<double>(nb * m * n), std::vector<double>(nb * m * n)};
  for (int64_t t = 0; t < nb; ++t)
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double s = 0, mag = 0;
        for (int64_t p = 0; p < k; ++p) {
          const double v = A[(t * m + i) * k + p] * B[(t * k + p) * n + j];
          s += v;
          mag += std::fabs(v);
        }
        r.value[(t * m + i) * n + j] = s;
        r.scale[(t * m + i) * n + j] = mag;
      }
  return r;
}

::testing::AssertionResult MatchesRef(const Tensor& a, const Tensor& b) {
  const Tensor c = matmul(a, b);
  const Ref r = matmul_ref(a, b);
  return AllClose(c, r.value, kFloatVsDouble, r.scale);
}

TEST(Matmul, OddSizesMatchFloat64) {
  uint64_t seed = 1;
  for (int64_t m : {1, 3, 7, 17, 33})
    for (int64_t k : {1, 3, 17, 33})
      for (int64_t n : {1, 7, 33}) {
        const Tensor a = randn({m, k}, seed++), b = randn({k, n}, seed++);
        EXPECT_EQ(matmul(a, b).shape(), (Shape{m, n}));
        EXPECT_TRUE(MatchesRef(a, b)) << "m=" << m << " k=" << k << " n=" << n;
      }
}

TEST(Matmul, BatchedLeadingDimsBroadcast) {
  const Tensor a = randn({2, 1, 5, 7}, 11), b = randn({3, 7, 4}, 12);
  EXPECT_EQ(matmul(a, b).shape(), (Shape{2, 3, 5, 4}));
  EXPECT_TRUE(MatchesRef(a, b));
  // Shared 2-D b against a batched a (the single tall sgemm path).
  const Tensor a2 = randn({4, 3, 5, 7}, 13), b2 = randn({7, 6}, 14);
  EXPECT_TRUE(MatchesRef(a2, b2));
  // Batched b against a 2-D a.
  EXPECT_TRUE(MatchesRef(randn({5, 7}, 15), randn({4, 7, 6}, 16)));
}

TEST(Matmul, ManySmallMatricesParallelBatch) {
  const Tensor a = randn({64, 3, 5}, 21), b = randn({64, 5, 2}, 22);
  EXPECT_TRUE(MatchesRef(a, b));
}

TEST(Matmul, TransposedViewsNeedNoCopy) {
  const Tensor at = randn({2, 7, 5}, 31), bt = randn({2, 3, 7}, 32);
  const Tensor a = at.transpose(-1, -2), b = bt.transpose(-1, -2);  // column-major operands
  ASSERT_FALSE(a.is_contiguous());
  EXPECT_TRUE(MatchesRef(a, b));
}

TEST(Matmul, RowSlicedAndSteppedViews) {
  const Tensor big = randn({9, 20}, 41);
  const Tensor a = big.slice(1, 2, 9);                 // rows 20 apart: ld > cols, no copy
  const Tensor b = randn({14, 5}, 42).slice(0, 0, 14, 2);  // rows 10 apart
  EXPECT_TRUE(MatchesRef(a, b));
  const Tensor stepped = big.slice(1, 0, 20, 3).slice(0, 0, 5);  // column stride 3: must copy
  EXPECT_TRUE(MatchesRef(stepped, randn({7, 4}, 43)));
  // An expanded (stride 0) operand.
  const Tensor row = randn({1, 6}, 44).expand({4, 6});
  EXPECT_TRUE(MatchesRef(row, randn({6, 3}, 45)));
}

TEST(Matmul, ExpandedBatchOperand) {
  const Tensor a = randn({1, 4, 6}, 51).expand({3, 4, 6});
  EXPECT_TRUE(MatchesRef(a, randn({3, 6, 2}, 52)));
}

TEST(Matmul, EmptyDims) {
  EXPECT_EQ(matmul(randn({0, 3}, 1), randn({3, 4}, 2)).shape(), (Shape{0, 4}));
  const Tensor z = matmul(Tensor::zeros({2, 0}), Tensor::zeros({0, 3}));
  EXPECT_EQ(z.shape(), (Shape{2, 3}));
  for (float v : z.to_vector()) EXPECT_EQ(v, 0.0f);
}

TEST(Matmul, RejectsBadShapes) {
  EXPECT_TRUE(ThrowsArg([] { matmul(randn({3}, 1), randn({3, 2}, 2)); }, "[matmul]"));
  EXPECT_TRUE(ThrowsArg([] { matmul(randn({2, 3}, 1), randn({4, 2}, 2)); }, "[matmul]"));
  EXPECT_TRUE(ThrowsArg([] { matmul(randn({2, 2, 3}, 1), randn({3, 3, 2}, 2)); }, "[matmul]"));
  EXPECT_TRUE(ThrowsArg([] { matmul(Tensor(), randn({3, 2}, 2)); }, "[matmul]"));
}

// y = x·wᵀ + b in float64.
Ref linear_ref(const Tensor& x, const Tensor& w, const Tensor& b) {
  const int64_t in = x.size(-1), out = w.size(0), rows = x.numel() / std::max<int64_t>(in, 1);
  const std::vector<double> X = testing::to_double(x), W = testing::to_double(w);
  const std::vector<double> B = b.defined() ? testing::to_double(b) : std::vector<double>(out, 0.0);
  Ref r{std::vector<double>(rows * out), std::vector<double>(rows * out)};
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < out; ++j) {
      double s = B[j], mag = std::fabs(B[j]);
      for (int64_t p = 0; p < in; ++p) {
        s += X[i * in + p] * W[j * in + p];
        mag += std::fabs(X[i * in + p] * W[j * in + p]);
      }
      r.value[i * out + j] = s;
      r.scale[i * out + j] = mag;
    }
  return r;
}

TEST(Linear, AnyLeadingDimsWithAndWithoutBias) {
  for (int64_t in : {1, 7, 33})
    for (int64_t out : {1, 3, 17}) {
      const Tensor x = randn({2, 3, in}, 100 + in), w = randn({out, in}, 200 + out), b = randn({out}, 7);
      const Tensor y = linear(x, w, b);
      EXPECT_EQ(y.shape(), (Shape{2, 3, out}));
      const Ref r = linear_ref(x, w, b);
      EXPECT_TRUE(AllClose(y, r.value, kFloatVsDouble, r.scale)) << "in=" << in << " out=" << out;
      const Ref r0 = linear_ref(x, w, Tensor());
      EXPECT_TRUE(AllClose(linear(x, w), r0.value, kFloatVsDouble, r0.scale));
    }
}

TEST(Linear, OneDimensionalInput) {
  const Tensor x = randn({5}, 1), w = randn({3, 5}, 2);
  const Tensor y = linear(x, w);
  EXPECT_EQ(y.shape(), (Shape{3}));
  const Ref r = linear_ref(x, w, Tensor());
  EXPECT_TRUE(AllClose(y, r.value, kFloatVsDouble, r.scale));
}

TEST(Linear, NonContiguousInputWeightAndBias) {
  const Tensor x = randn({6, 4, 3}, 3).transpose(0, 1);        // (4, 6, 3), rows do not collapse
  const Tensor w = randn({3, 5}, 4).transpose(0, 1);           // (5, 3) column-major weight
  const Tensor b = randn({10}, 5).slice(0, 0, 10, 2);          // stride-2 bias
  const Ref r = linear_ref(x.contiguous(), w.contiguous(), b.contiguous());
  EXPECT_TRUE(AllClose(linear(x, w, b), r.value, kFloatVsDouble, r.scale));
}

TEST(Linear, ZeroInFeaturesGivesBias) {
  const Tensor b = randn({3}, 9);
  const Tensor y = linear(Tensor::zeros({2, 0}), Tensor::zeros({3, 0}), b);
  EXPECT_TRUE(AllClose(y, testing::to_double(b.unsqueeze(0).expand({2, 3})), testing::kExact));
}

TEST(Linear, RejectsBadShapes) {
  EXPECT_TRUE(ThrowsArg([] { linear(randn({2, 4}, 1), randn({3, 5}, 2)); }, "[linear]"));
  EXPECT_TRUE(ThrowsArg([] { linear(randn({2, 4}, 1), randn({4}, 2)); }, "[linear]"));
  EXPECT_TRUE(ThrowsArg([] { linear(randn({2, 4}, 1), randn({3, 4}, 2), randn({4}, 3)); }, "[linear]"));
  EXPECT_TRUE(ThrowsArg([] { linear(Tensor::scalar(1.0f), randn({3, 1}, 2)); }, "[linear]"));
}

// --- backward halves ----------------------------------------------------------------------------------------

using testing::GradMatches;

// Double twin of matmul on row-major values with the given shapes (leading dims broadcast).
std::vector<double> matmul_d(const std::vector<double>& A, const Shape& sa, const std::vector<double>& B,
                             const Shape& sb) {
  const int64_t m = sa[sa.size() - 2], k = sa.back(), n = sb.back();
  const Shape batch = broadcast_shapes(Shape(sa.begin(), sa.end() - 2), Shape(sb.begin(), sb.end() - 2), "ref");
  Shape fa = batch, fb = batch;
  fa.insert(fa.end(), {m, k});
  fb.insert(fb.end(), {k, n});
  const std::vector<double> X = testing::expand_d(A, sa, fa), Y = testing::expand_d(B, sb, fb);
  const int64_t nb = shape_numel(batch);
  std::vector<double> C(static_cast<size_t>(nb * m * n), 0.0);
  for (int64_t t = 0; t < nb; ++t)
    for (int64_t i = 0; i < m; ++i)
      for (int64_t p = 0; p < k; ++p)
        for (int64_t j = 0; j < n; ++j) C[(t * m + i) * n + j] += X[(t * m + i) * k + p] * Y[(t * k + p) * n + j];
  return C;
}

::testing::AssertionResult MatmulGradsMatch(const Tensor& a, const Tensor& b, uint64_t seed) {
  const Tensor c = matmul(a, b);
  const Tensor r = randn(c.shape(), seed);
  const std::vector<double> rd = testing::to_double(r), A = testing::to_double(a), B = testing::to_double(b);
  const MatmulGrads g = matmul_backward(a, b, r);
  auto ra = GradMatches(g.da, [&](const std::vector<double>& v) { return matmul_d(v, a.shape(), B, b.shape()); }, a, rd);
  if (!ra) return ra << " (da)";
  auto rb = GradMatches(g.db, [&](const std::vector<double>& v) { return matmul_d(A, a.shape(), v, b.shape()); }, b, rd);
  if (!rb) return rb << " (db)";
  return ::testing::AssertionSuccess();
}

TEST(MatmulBackward, OddSizesMatchFiniteDifferences) {
  EXPECT_TRUE(MatmulGradsMatch(randn({3, 7}, 1), randn({7, 5}, 2), 3));
  EXPECT_TRUE(MatmulGradsMatch(randn({1, 1}, 4), randn({1, 3}, 5), 6));
}

TEST(MatmulBackward, BroadcastBatchesAreSummed) {
  EXPECT_TRUE(MatmulGradsMatch(randn({2, 1, 3, 4}, 7), randn({3, 4, 2}, 8), 9));   // both broadcast
  EXPECT_TRUE(MatmulGradsMatch(randn({2, 3, 3, 4}, 10), randn({4, 2}, 11), 12));  // shared 2-D b (folded path)
  EXPECT_TRUE(MatmulGradsMatch(randn({3, 4}, 13), randn({2, 4, 5}, 14), 15));     // shared 2-D a
}

TEST(MatmulBackward, StridedOperands) {
  EXPECT_TRUE(MatmulGradsMatch(randn({2, 5, 3}, 16).transpose(-1, -2), randn({5, 12}, 17).slice(1, 0, 12, 3), 18));
  EXPECT_TRUE(MatmulGradsMatch(randn({4, 6}, 19).transpose(0, 1).unsqueeze(0).expand({2, 6, 4}), randn({4, 3}, 20), 21));
}

TEST(MatmulBackward, RejectsWrongDcShape) {
  EXPECT_TRUE(ThrowsArg([] { matmul_backward(randn({2, 3}, 1), randn({3, 4}, 2), randn({4, 2}, 3)); },
                        "[matmul_backward]"));
  EXPECT_TRUE(ThrowsArg([] { matmul_backward(randn({2, 3}, 1), randn({2, 4}, 2), randn({2, 4}, 3)); },
                        "[matmul_backward]"));
}

std::vector<double> linear_d(const std::vector<double>& X, const std::vector<double>& W, const std::vector<double>& B,
                             int64_t in, int64_t out) {
  const int64_t rows = static_cast<int64_t>(X.size()) / in;
  std::vector<double> y(static_cast<size_t>(rows * out));
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < out; ++j) {
      double s = B[j];
      for (int64_t p = 0; p < in; ++p) s += X[i * in + p] * W[j * in + p];
      y[i * out + j] = s;
    }
  return y;
}

TEST(LinearBackward, AllThreeGradsMatchFiniteDifferences) {
  for (const auto& [x, w] : {std::pair{randn({2, 3, 5}, 30), randn({4, 5}, 31)},
                             std::pair{randn({5, 3, 2}, 32).transpose(0, 2), randn({5, 7}, 33).transpose(0, 1)},
                             std::pair{randn({3}, 34), randn({1, 3}, 35)}}) {
    const int64_t in = w.size(1), out = w.size(0);
    const Tensor b = randn({out}, 36);
    Shape ys(x.shape().begin(), x.shape().end() - 1);
    ys.push_back(out);
    const Tensor r = randn(ys, 37);
    const std::vector<double> X = testing::to_double(x), W = testing::to_double(w), B = testing::to_double(b),
                              rd = testing::to_double(r);
    const LinearGrads g = linear_backward(x, w, r);
    EXPECT_TRUE(GradMatches(g.dx, [&](const std::vector<double>& v) { return linear_d(v, W, B, in, out); }, x, rd));
    EXPECT_TRUE(GradMatches(g.dweight, [&](const std::vector<double>& v) { return linear_d(X, v, B, in, out); }, w, rd));
    EXPECT_TRUE(GradMatches(g.dbias, [&](const std::vector<double>& v) { return linear_d(X, W, v, in, out); }, b, rd));
  }
}

TEST(LinearBackward, EmptyBatchGivesZeroParamGrads) {
  const LinearGrads g = linear_backward(Tensor::zeros({0, 3}), randn({2, 3}, 1), Tensor::zeros({0, 2}));
  EXPECT_EQ(g.dx.shape(), (Shape{0, 3}));
  EXPECT_TRUE(AllClose(g.dweight, std::vector<double>(6, 0.0), testing::kExact));
  EXPECT_TRUE(AllClose(g.dbias, std::vector<double>(2, 0.0), testing::kExact));
}

TEST(LinearBackward, RejectsWrongShapes) {
  EXPECT_TRUE(ThrowsArg([] { linear_backward(randn({2, 3}, 1), randn({4, 3}, 2), randn({2, 3}, 3)); },
                        "[linear_backward]"));
  EXPECT_TRUE(ThrowsArg([] { linear_backward(randn({2, 3}, 1), randn({4, 2}, 2), randn({2, 4}, 3)); },
                        "[linear_backward]"));
}

}  // namespace
}  // namespace qkv
