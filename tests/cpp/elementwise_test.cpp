// Broadcast arithmetic and activations against float64 formulas, known values and strided inputs.
// Activation references are the PyTorch formulas evaluated in double.
#include "qkv/ops/elementwise.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>

#include "ops_testing.h"

namespace qkv {
namespace {

using testing::AllClose;
using testing::kExact;
using testing::kFloatVsDouble;
using testing::randn;
using testing::ThrowsArg;

// Reference for a broadcast binary op: both sides expanded to the broadcast shape, combined in double.
std::vector<double> binary_ref(const Tensor& a, const Tensor& b, const std::function<double(double, double)>& f) {
  const Shape s = broadcast_shapes(a.shape(), b.shape(), "ref");
  const std::vector<double> A = testing::to_double(a.expand(s)), B = testing::to_double(b.expand(s));
  std::vector<double> r(A.size());
  for (size_t i = 0; i < r.size(); ++i) r[i] = f(A[i], B[i]);
  return r;
}

std::vector<double> unary_ref(const Tensor& x, const std::function<double(double)>& f) {
  std::vector<double> r = testing::to_double(x);
  for (double& v : r) v = f(v);
  return r;
}

const auto kAdd = [](double x, double y) { return x + y; };
const auto kSub = [](double x, double y) { return x - y; };
const auto kMul = [](double x, double y) { return x * y; };

TEST(Elementwise, SameShapeContiguous) {
  for (int64_t n : {1, 3, 7, 17, 33, 70000}) {  // 70000 crosses the OpenMP threshold
    const Tensor a = randn({n}, 1), b = randn({n}, 2);
    EXPECT_TRUE(AllClose(add(a, b), binary_ref(a, b, kAdd), kFloatVsDouble)) << n;
    EXPECT_TRUE(AllClose(sub(a, b), binary_ref(a, b, kSub), kFloatVsDouble)) << n;
    EXPECT_TRUE(AllClose(mul(a, b), binary_ref(a, b, kMul), kFloatVsDouble)) << n;
  }
}

TEST(Elementwise, NumpyBroadcasting) {
  const Tensor a = randn({2, 1, 5}, 3), b = randn({3, 1}, 4);
  EXPECT_EQ(add(a, b).shape(), (Shape{2, 3, 5}));
  EXPECT_TRUE(AllClose(add(a, b), binary_ref(a, b, kAdd), kFloatVsDouble));
  EXPECT_TRUE(AllClose(sub(b, a), binary_ref(b, a, kSub), kFloatVsDouble));
  // Bias-style (…, N) + (N).
  const Tensor x = randn({4, 7, 17}, 5), bias = randn({17}, 6);
  EXPECT_TRUE(AllClose(add(x, bias), binary_ref(x, bias, kAdd), kFloatVsDouble));
  // Scalar tensors on either side.
  const Tensor s = Tensor::scalar(2.5f);
  EXPECT_TRUE(AllClose(mul(x, s), binary_ref(x, s, kMul), kFloatVsDouble));
  EXPECT_TRUE(AllClose(sub(s, x), binary_ref(s, x, kSub), kFloatVsDouble));
  EXPECT_EQ(mul(s, s).shape(), Shape{});
}

TEST(Elementwise, NonContiguousInputs) {
  const Tensor a = randn({5, 7}, 7).transpose(0, 1);       // (7, 5)
  const Tensor b = randn({7, 10}, 8).slice(1, 0, 10, 2);   // (7, 5) stride 2
  EXPECT_TRUE(AllClose(mul(a, b), binary_ref(a, b, kMul), kFloatVsDouble));
  const Tensor e = randn({1, 5}, 9).expand({7, 5});
  EXPECT_TRUE(AllClose(add(a, e), binary_ref(a, e, kAdd), kFloatVsDouble));
  EXPECT_TRUE(AllClose(scale(a, -3.0f), unary_ref(a, [](double v) { return -3.0 * v; }), kFloatVsDouble));
  EXPECT_TRUE(AllClose(add_scalar(b, 0.5f), unary_ref(b, [](double v) { return v + 0.5; }), kFloatVsDouble));
}

TEST(Elementwise, EmptyShapes) {
  EXPECT_EQ(add(Tensor::zeros({0, 3}), Tensor::zeros({3})).shape(), (Shape{0, 3}));
  EXPECT_EQ(relu(Tensor::zeros({2, 0})).shape(), (Shape{2, 0}));
}

TEST(Elementwise, RejectsNonBroadcastingShapes) {
  EXPECT_TRUE(ThrowsArg([] { add(randn({2, 3}, 1), randn({4}, 2)); }, "[add]"));
  EXPECT_TRUE(ThrowsArg([] { sub(randn({2, 3}, 1), randn({3, 3}, 2)); }, "[sub]"));
  EXPECT_TRUE(ThrowsArg([] { mul(randn({5}, 1), randn({2, 4}, 2)); }, "[mul]"));
  EXPECT_TRUE(ThrowsArg([] { mul(Tensor(), randn({2}, 2)); }, "[mul]"));
  EXPECT_TRUE(ThrowsArg([] { scale(Tensor(), 2.0f); }, "[scale]"));
  EXPECT_TRUE(ThrowsArg([] { add_scalar(Tensor(), 2.0f); }, "[add_scalar]"));
  EXPECT_TRUE(ThrowsArg([] { relu(Tensor()); }, "[relu]"));
  EXPECT_TRUE(ThrowsArg([] { gelu(Tensor()); }, "[gelu]"));
  EXPECT_TRUE(ThrowsArg([] { qkv::tanh(Tensor()); }, "[tanh]"));
  EXPECT_TRUE(ThrowsArg([] { sigmoid(Tensor()); }, "[sigmoid]"));
}

double gelu_exact(double v) { return 0.5 * v * (1.0 + std::erf(v / std::sqrt(2.0))); }
double gelu_tanh(double v) {
  return 0.5 * v * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (v + 0.044715 * v * v * v)));
}
double sigmoid_ref(double v) { return 1.0 / (1.0 + std::exp(-v)); }

TEST(Activations, GeluKnownValues) {
  const Tensor x = Tensor::from_vector({4}, {1.0f, -1.0f, 0.0f, 3.0f});
  // torch.nn.functional.gelu(torch.tensor([1., -1., 0., 3.], dtype=torch.float64))
  const std::vector<double> exact{0.841344746068543, -0.15865525393145702, 0.0, 2.99595030590511};
  EXPECT_TRUE(AllClose(gelu(x), exact, kFloatVsDouble));
  // approximate="tanh"
  const std::vector<double> approx{0.8411919906082768, -0.15880800939172324, 0.0, 2.996362607918227};
  EXPECT_TRUE(AllClose(gelu(x, GeluApprox::kTanh), approx, kFloatVsDouble));
}

TEST(Activations, MatchFloat64Formulas) {
  const Tensor x = randn({3, 17}, 10, 3.0f);
  const Tensor xt = x.transpose(0, 1);
  for (const Tensor& t : {x, xt}) {
    EXPECT_TRUE(AllClose(relu(t), unary_ref(t, [](double v) { return v > 0 ? v : 0.0; }), kExact));
    EXPECT_TRUE(AllClose(gelu(t), unary_ref(t, gelu_exact), kFloatVsDouble));
    EXPECT_TRUE(AllClose(gelu(t, GeluApprox::kTanh), unary_ref(t, gelu_tanh), kFloatVsDouble));
    EXPECT_TRUE(AllClose(qkv::tanh(t), unary_ref(t, [](double v) { return std::tanh(v); }), kFloatVsDouble));
    EXPECT_TRUE(AllClose(sigmoid(t), unary_ref(t, sigmoid_ref), kFloatVsDouble));
  }
}

// The vectorised GELU kernels (contiguous input) against the libm reference (strided views take it) and float64,
// over lengths that leave every vector tail size, wide inputs, and large magnitudes.
TEST(Activations, VectorisedGeluMatchesReferenceOnEveryTail) {
  for (int64_t n : {1, 3, 7, 8, 9, 15, 16, 17, 31, 33, 1000, 70001}) {
    const Tensor x = randn({n}, static_cast<uint64_t>(n), 4.0f);
    const Tensor dy = randn({n}, static_cast<uint64_t>(n) + 1);
    for (GeluApprox a : {GeluApprox::kNone, GeluApprox::kTanh}) {
      EXPECT_TRUE(AllClose(gelu(x, a), gelu_reference(x, a), {2e-6, 2e-6})) << n;
      EXPECT_TRUE(AllClose(gelu_backward(x, dy, a), gelu_backward_reference(x, dy, a), {2e-6, 2e-6})) << n;
    }
    EXPECT_TRUE(AllClose(gelu(x), unary_ref(x, gelu_exact), kFloatVsDouble)) << n;
  }
  const Tensor big = Tensor::from_vector({8}, {-1e4f, -30.0f, -9.0f, -5.5f, 5.5f, 9.0f, 30.0f, 1e4f});
  EXPECT_TRUE(AllClose(gelu(big), unary_ref(big, gelu_exact), kFloatVsDouble));
  for (float v : gelu_backward(big, Tensor::ones({8})).to_vector()) EXPECT_TRUE(std::isfinite(v));
}

TEST(Activations, SigmoidStableForLargeMagnitude) {
  const Tensor x = Tensor::from_vector({6}, {-1000.0f, -100.0f, -88.0f, 88.0f, 100.0f, 1000.0f});
  const Tensor y = sigmoid(x);
  for (float v : y.to_vector()) EXPECT_TRUE(std::isfinite(v));
  EXPECT_EQ(y.at({0}), 0.0f);
  EXPECT_EQ(y.at({5}), 1.0f);
  EXPECT_TRUE(AllClose(y, unary_ref(x, sigmoid_ref), {1e-30, 1e-5}));
}

TEST(Activations, NaNPropagates) {
  const Tensor x = Tensor::from_vector({1}, {NAN});
  EXPECT_TRUE(std::isnan(relu(x).item()));
  EXPECT_TRUE(std::isnan(gelu(x).item()));
  EXPECT_TRUE(std::isnan(sigmoid(x).item()));
}

// --- backward halves ----------------------------------------------------------------------------------------

using testing::GradMatches;

// Random x kept away from relu's kink at 0, where a finite difference is meaningless.
Tensor away_from_zero(const Tensor& x) {
  std::vector<float> v = x.to_vector();
  for (float& e : v)
    if (std::fabs(e) < 0.05f) e += 0.1f;
  return Tensor::from_vector(x.shape(), v);
}

std::function<std::vector<double>(const std::vector<double>&)> map_d(double (*f)(double)) {
  return [f](const std::vector<double>& x) {
    std::vector<double> y(x);
    for (double& v : y) v = f(v);
    return y;
  };
}

TEST(ActivationsBackward, MatchFiniteDifferences) {
  const Tensor x = away_from_zero(randn({3, 17}, 31, 2.0f));
  const Tensor r = randn({3, 17}, 32);
  const std::vector<double> rd = testing::to_double(r);
  EXPECT_TRUE(GradMatches(relu_backward(x, r), map_d([](double v) { return v > 0 ? v : 0.0; }), x, rd));
  EXPECT_TRUE(GradMatches(gelu_backward(x, r), map_d(gelu_exact), x, rd));
  EXPECT_TRUE(GradMatches(gelu_backward(x, r, GeluApprox::kTanh), map_d(gelu_tanh), x, rd));
  EXPECT_TRUE(GradMatches(tanh_backward(qkv::tanh(x), r), map_d([](double v) { return std::tanh(v); }), x, rd));
  EXPECT_TRUE(GradMatches(sigmoid_backward(sigmoid(x), r), map_d(sigmoid_ref), x, rd));
}

TEST(ActivationsBackward, StridedInputs) {
  const Tensor x = away_from_zero(randn({17, 3}, 33)).transpose(0, 1);
  const Tensor r = randn({3, 34}, 34).slice(1, 0, 34, 2);
  EXPECT_TRUE(GradMatches(gelu_backward(x, r), map_d(gelu_exact), x, testing::to_double(r)));
}

TEST(ActivationsBackward, RejectMismatchedDy) {
  EXPECT_TRUE(ThrowsArg([] { relu_backward(randn({3}, 1), randn({4}, 2)); }, "[relu_backward]"));
  EXPECT_TRUE(ThrowsArg([] { gelu_backward(randn({3}, 1), randn({1}, 2)); }, "[gelu_backward]"));
  EXPECT_TRUE(ThrowsArg([] { tanh_backward(randn({3}, 1), Tensor()); }, "[tanh_backward]"));
  EXPECT_TRUE(ThrowsArg([] { sigmoid_backward(randn({2, 3}, 1), randn({3, 2}, 2)); }, "[sigmoid_backward]"));
}

TEST(SumTo, ReducesBroadcastDims) {
  const Tensor g = randn({2, 3, 4}, 40);
  const std::vector<double> G = testing::to_double(g);
  std::vector<double> want(3, 0.0);  // to (3, 1)
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 3; ++j)
      for (int k = 0; k < 4; ++k) want[j] += G[(i * 3 + j) * 4 + k];
  const Tensor s = sum_to(g, {3, 1});
  EXPECT_EQ(s.shape(), (Shape{3, 1}));
  EXPECT_TRUE(AllClose(s, want, kFloatVsDouble));
  double total = 0;
  for (double v : G) total += v;
  EXPECT_TRUE(AllClose(sum_to(g, {}), {total}, kFloatVsDouble, {24.0}));
  EXPECT_TRUE(sum_to(g, g.shape()).shares_storage(g));
  // Strided gradient.
  const Tensor gt = g.transpose(0, 2);  // (4, 3, 2)
  EXPECT_TRUE(AllClose(sum_to(gt, {3, 1}), want, kFloatVsDouble));
  EXPECT_TRUE(ThrowsArg([&] { sum_to(g, {2, 4}); }, "[sum_to]"));
}

TEST(BinaryBackward, BroadcastGradsMatchFiniteDifferences) {
  const Tensor a = randn({2, 1, 5}, 41), b = randn({3, 1}, 42), r = randn({2, 3, 5}, 43);
  const std::vector<double> rd = testing::to_double(r), A = testing::to_double(a), B = testing::to_double(b);
  const Shape out{2, 3, 5};
  auto f_of_a = [&](double (*op)(double, double)) {
    return [&, op](const std::vector<double>& av) {
      const std::vector<double> x = testing::expand_d(av, a.shape(), out), y = testing::expand_d(B, b.shape(), out);
      std::vector<double> z(x.size());
      for (size_t i = 0; i < z.size(); ++i) z[i] = op(x[i], y[i]);
      return z;
    };
  };
  auto f_of_b = [&](double (*op)(double, double)) {
    return [&, op](const std::vector<double>& bv) {
      const std::vector<double> x = testing::expand_d(A, a.shape(), out), y = testing::expand_d(bv, b.shape(), out);
      std::vector<double> z(x.size());
      for (size_t i = 0; i < z.size(); ++i) z[i] = op(x[i], y[i]);
      return z;
    };
  };
  double (*padd)(double, double) = [](double x, double y) { return x + y; };
  double (*psub)(double, double) = [](double x, double y) { return x - y; };
  double (*pmul)(double, double) = [](double x, double y) { return x * y; };
  const BinaryGrads ga = add_backward(a.shape(), b.shape(), r);
  EXPECT_TRUE(GradMatches(ga.da, f_of_a(padd), a, rd));
  EXPECT_TRUE(GradMatches(ga.db, f_of_b(padd), b, rd));
  const BinaryGrads gs = sub_backward(a.shape(), b.shape(), r);
  EXPECT_TRUE(GradMatches(gs.da, f_of_a(psub), a, rd));
  EXPECT_TRUE(GradMatches(gs.db, f_of_b(psub), b, rd));
  const BinaryGrads gm = mul_backward(a, b, r);
  EXPECT_TRUE(GradMatches(gm.da, f_of_a(pmul), a, rd));
  EXPECT_TRUE(GradMatches(gm.db, f_of_b(pmul), b, rd));
}

TEST(BinaryBackward, RejectWrongDyShape) {
  EXPECT_TRUE(ThrowsArg([] { add_backward({2, 3}, {3}, randn({3}, 1)); }, "[add_backward]"));
  EXPECT_TRUE(ThrowsArg([] { sub_backward({2, 3}, {4}, randn({2, 3}, 1)); }, "[sub_backward]"));
  EXPECT_TRUE(ThrowsArg([] { mul_backward(randn({2}, 1), randn({2}, 2), randn({1}, 3)); }, "[mul_backward]"));
}

}  // namespace
}  // namespace qkv
