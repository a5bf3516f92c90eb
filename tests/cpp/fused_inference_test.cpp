// The fused steps of post-LN encoders against their composed reference twins: the in-place inference ops
// (add_layer_norm_ vs add_layer_norm_reference, add_bias_gelu_ vs gelu_reference(add)), their tape ops
// (ad::add_layer_norm, ad::add_bias_gelu: finite differences of a float64 twin, and the unfused composition on the
// tape) and packed attention on the tape (ad::attention_varlen against per-sequence ad::attention).
#include <gtest/gtest.h>

#include <cmath>
#include <numbers>
#include <utility>
#include <vector>

#include "grad_testing.h"
#include "ops_testing.h"
#include "qkv/ops/elementwise.h"
#include "qkv/ops/functional.h"
#include "qkv/ops/layer_norm.h"

namespace qkv {
namespace {

using testing::AllClose;
using testing::randn;
using testing::ThrowsArg;
using testing::Tol;

// The fast LayerNorm keeps the reference's arithmetic (double statistics) but may sum in another order and fuse
// the affine multiply-add: a few float ulps.
constexpr Tol kFusedVsReference{2e-6, 2e-6};
// The vectorised GELU against libm's erf/tanh (activations.h documents |error| <= 2e-7 against float64).
constexpr Tol kGeluKernelVsLibm{1e-6, 1e-6};

::testing::AssertionResult FusedMatches(const Shape& shape, bool with_x, bool with_c, bool with_w, bool with_b,
                                        float offset = 0.0f) {
  const int64_t e = shape.back();
  Tensor y = add_scalar(randn(shape, 1), offset);
  const Tensor x = with_x ? randn(shape, 2, 3.0f) : Tensor();
  const Tensor c = with_c ? randn({e}, 3) : Tensor();
  const Tensor w = with_w ? randn({e}, 4) : Tensor();
  const Tensor b = with_b ? randn({e}, 5) : Tensor();
  const Tensor ref = add_layer_norm_reference(y, x, c, w, b, 1e-12f);
  add_layer_norm_(y, x, c, w, b, 1e-12f);
  return AllClose(y, ref, kFusedVsReference);
}

TEST(AddLayerNorm, MatchesReferenceOnBertWidthWithEveryTerm) {
  EXPECT_TRUE(FusedMatches({3, 17, 384}, true, true, true, true));
}

TEST(AddLayerNorm, OddWidthsRunTheScalarTail) {
  for (int64_t e : {1, 5, 8, 13, 31, 100}) EXPECT_TRUE(FusedMatches({7, e}, true, true, true, true)) << "E=" << e;
}

TEST(AddLayerNorm, EachOptionalTermMayBeAbsent) {
  EXPECT_TRUE(FusedMatches({9, 40}, false, false, false, false));
  EXPECT_TRUE(FusedMatches({9, 40}, true, false, true, false));
  EXPECT_TRUE(FusedMatches({9, 40}, false, true, false, true));
}

TEST(AddLayerNorm, OffsetRowsKeepPrecision) {
  // A mean of 1000 would cost ~6e-5 absolute if the rows were centred in float: the double centring keeps them.
  EXPECT_TRUE(FusedMatches({4, 64}, true, true, true, true, 1000.0f));
}

TEST(AddLayerNorm, ManyRowsSplitOverThreads) { EXPECT_TRUE(FusedMatches({700, 384}, true, true, true, true)); }

TEST(AddLayerNorm, StridedResidualIsRead) {
  const Tensor big = randn({6, 2, 24}, 7);
  const Tensor x = big.select(1, 1);  // (6, 24), row stride 48
  Tensor y = randn({6, 24}, 8);
  const Tensor w = randn({24}, 9);
  const Tensor ref = add_layer_norm_reference(y, x, {}, w, {}, 1e-5f);
  add_layer_norm_(y, x, {}, w, {}, 1e-5f);
  EXPECT_TRUE(AllClose(y, ref, kFusedVsReference));
  const Tensor xt = randn({24, 6}, 10).transpose(0, 1);  // last dim not contiguous: copied first
  Tensor y2 = randn({6, 24}, 11);
  const Tensor ref2 = add_layer_norm_reference(y2, xt, {}, {}, {}, 1e-5f);
  add_layer_norm_(y2, xt, {}, {}, {}, 1e-5f);
  EXPECT_TRUE(AllClose(y2, ref2, kFusedVsReference));
}

TEST(AddLayerNorm, ResidualAliasingItsOutputIsSafe) {
  Tensor y = randn({5, 32}, 12);
  const Tensor same = y;  // x is y itself: s = 2y + c
  const Tensor ref = add_layer_norm_reference(y.clone(), y.clone(), {}, {}, {}, 1e-5f);
  add_layer_norm_(y, same, {}, {}, {}, 1e-5f);
  EXPECT_TRUE(AllClose(y, ref, kFusedVsReference));
  // x = the rows of y shifted by one: read before any row is written.
  Tensor z = randn({6, 16}, 13);
  const Tensor zx = z.slice(0, 1, 6);
  Tensor zy = z.slice(0, 0, 5);
  const Tensor ref2 = add_layer_norm_reference(zy.clone(), zx.clone(), {}, {}, {}, 1e-5f);
  add_layer_norm_(zy, zx, {}, {}, {}, 1e-5f);
  EXPECT_TRUE(AllClose(zy, ref2, kFusedVsReference));
}

TEST(AddLayerNorm, ConstantRowGivesBias) {
  Tensor y = Tensor::full({2, 16}, 3.0f);
  const Tensor b = randn({16}, 14);
  add_layer_norm_(y, {}, {}, {}, b, 1e-5f);
  EXPECT_TRUE(AllClose(y.select(0, 1), b, testing::kExact));
}

TEST(AddLayerNorm, RejectsBadShapes) {
  Tensor y = randn({3, 8}, 1);
  EXPECT_TRUE(ThrowsArg([&] { add_layer_norm_(y, randn({3, 7}, 2), {}, {}, {}); }, "[add_layer_norm]"));
  EXPECT_TRUE(ThrowsArg([&] { add_layer_norm_(y, {}, randn({7}, 2), {}, {}); }, "[add_layer_norm]"));
  EXPECT_TRUE(ThrowsArg([&] { add_layer_norm_(y, {}, {}, randn({8, 1}, 2), {}); }, "[add_layer_norm]"));
  EXPECT_TRUE(ThrowsArg([&] { add_layer_norm_(y, {}, {}, {}, {}, -1.0f); }, "[add_layer_norm]"));
  Tensor yt = randn({8, 3}, 3).transpose(0, 1);
  EXPECT_TRUE(ThrowsArg([&] { add_layer_norm_(yt, {}, {}, {}, {}); }, "[add_layer_norm]"));
  Tensor undefined;
  EXPECT_TRUE(ThrowsArg([&] { add_layer_norm_(undefined, {}, {}, {}, {}); }, "[add_layer_norm]"));
  Tensor empty_e = Tensor::empty({3, 0});
  EXPECT_TRUE(ThrowsArg([&] { add_layer_norm_(empty_e, {}, {}, {}, {}); }, "[add_layer_norm]"));
  EXPECT_TRUE(ThrowsArg([&] { add_layer_norm_reference({}, {}, {}, {}, {}); }, "[add_layer_norm]"));
}

TEST(AddLayerNorm, NoRowsIsANoOp) {
  Tensor y = Tensor::empty({0, 8});
  EXPECT_NO_THROW(add_layer_norm_(y, Tensor::empty({0, 8}), {}, {}, {}));
}

TEST(AddBiasGelu, MatchesReferenceBothForms) {
  for (GeluApprox a : {GeluApprox::kNone, GeluApprox::kTanh}) {
    Tensor x = randn({37, 1536}, 20, 2.0f);
    const Tensor bias = randn({1536}, 21);
    const Tensor ref = gelu_reference(add(x, bias), a);
    add_bias_gelu_(x, bias, a);
    EXPECT_TRUE(AllClose(x, ref, kGeluKernelVsLibm)) << (a == GeluApprox::kTanh ? "tanh" : "erf");
  }
}

TEST(AddBiasGelu, WithoutBiasAndOddWidth) {
  Tensor x = randn({5, 13}, 22, 3.0f);
  const Tensor ref = gelu_reference(x);
  add_bias_gelu_(x, {});
  EXPECT_TRUE(AllClose(x, ref, kGeluKernelVsLibm));
}

TEST(AddBiasGelu, BiasViewOfItsOwnInputIsReadBeforeWritten) {
  Tensor x = randn({4, 8}, 23);
  const Tensor bias = x.select(0, 3);  // the last row, overwritten by the step
  const Tensor ref = gelu_reference(add(x, bias.clone()));
  add_bias_gelu_(x, bias);
  EXPECT_TRUE(AllClose(x, ref, kGeluKernelVsLibm));
}

TEST(AddBiasGelu, RejectsBadShapes) {
  Tensor x = randn({3, 8}, 1);
  EXPECT_TRUE(ThrowsArg([&] { add_bias_gelu_(x, randn({7}, 2)); }, "[add_bias_gelu]"));
  Tensor xt = randn({8, 3}, 3).transpose(0, 1);
  EXPECT_TRUE(ThrowsArg([&] { add_bias_gelu_(xt, {}); }, "[add_bias_gelu]"));
  Tensor undefined;
  EXPECT_TRUE(ThrowsArg([&] { add_bias_gelu_(undefined, {}); }, "[add_bias_gelu]"));
}

// --- the tape ops --------------------------------------------------------------------------------------------

using ad::Var;
using DIn = std::vector<std::vector<double>>;
// The fused tape op and the unfused composition run the same float32 arithmetic in another grouping.
constexpr Tol kFusedVsComposed{1e-5, 1e-5};

// float64 twin of layer_norm(x + (y + c), w, b): in = {y, x, c, w, b} (x, c, w, b optional per `has`).
std::vector<double> add_layer_norm_twin(const DIn& in, const bool has[4], int64_t e, double eps) {
  const std::vector<double>& y = in[0];
  size_t k = 1;
  const std::vector<double>* x = has[0] ? &in[k++] : nullptr;
  const std::vector<double>* c = has[1] ? &in[k++] : nullptr;
  const std::vector<double>* w = has[2] ? &in[k++] : nullptr;
  const std::vector<double>* b = has[3] ? &in[k++] : nullptr;
  std::vector<double> out(y.size());
  for (size_t r = 0; r < y.size() / static_cast<size_t>(e); ++r) {
    std::vector<double> s(static_cast<size_t>(e));
    double m = 0.0, v = 0.0;
    for (int64_t j = 0; j < e; ++j) {
      const size_t i = r * e + j;
      s[j] = y[i] + (c ? (*c)[j] : 0.0) + (x ? (*x)[i] : 0.0);
      m += s[j];
    }
    m /= static_cast<double>(e);
    for (int64_t j = 0; j < e; ++j) v += (s[j] - m) * (s[j] - m);
    const double rs = 1.0 / std::sqrt(v / static_cast<double>(e) + eps);
    for (int64_t j = 0; j < e; ++j)
      out[r * e + j] = (s[j] - m) * rs * (w ? (*w)[j] : 1.0) + (b ? (*b)[j] : 0.0);
  }
  return out;
}

void check_add_layer_norm_grads(const Shape& shape, const bool has[4]) {
  const int64_t e = shape.back();
  const float eps = 1e-5f;
  std::vector<Tensor> xs{randn(shape, 30)};
  if (has[0]) xs.push_back(randn(shape, 31, 2.0f));
  if (has[1]) xs.push_back(randn({e}, 32));
  if (has[2]) xs.push_back(randn({e}, 33));
  if (has[3]) xs.push_back(randn({e}, 34));
  auto pick = [&](const std::vector<Var>& v) {
    std::vector<Var> p(5);
    p[0] = v[0];
    size_t k = 1;
    for (int i = 0; i < 4; ++i)
      if (has[i]) p[i + 1] = v[k++];
    return p;
  };
  auto fused = [&](const std::vector<Var>& v) {
    const std::vector<Var> p = pick(v);
    return ad::add_layer_norm(Var(p[0]), p[1], p[2], p[3], p[4], eps);
  };
  auto composed = [&](const std::vector<Var>& v) {
    const std::vector<Var> p = pick(v);
    Var s = p[2].defined() ? ad::add(p[0], p[2]) : p[0];
    if (p[1].defined()) s = ad::add(p[1], s);
    return ad::layer_norm(s, p[3], p[4], eps);
  };
  EXPECT_TRUE(testing::GradsMatchTwin(fused, [&](const DIn& in) { return add_layer_norm_twin(in, has, e, eps); }, xs,
                                      35));
  const testing::Analytic a = testing::analytic_grads(fused, xs, 36), b = testing::analytic_grads(composed, xs, 36);
  EXPECT_TRUE(AllClose(a.out, b.out, kFusedVsComposed));
  for (size_t i = 0; i < xs.size(); ++i) EXPECT_TRUE(AllClose(a.grads[i], b.grads[i], kFusedVsComposed)) << i;
}

TEST(AddLayerNormOp, GradientsMatchFiniteDifferencesAndTheComposition) {
  const bool all[4] = {true, true, true, true};
  check_add_layer_norm_grads({2, 3, 7}, all);
  const bool residual_only[4] = {true, false, false, true};
  check_add_layer_norm_grads({5, 4}, residual_only);
  const bool bias_only[4] = {false, true, true, false};
  check_add_layer_norm_grads({1, 9}, bias_only);
}

TEST(AddLayerNormOp, WithoutATapeItWritesIntoTheConsumedBuffer) {
  Tensor y = randn({6, 24}, 40);
  const Tensor x = randn({6, 24}, 41), c = randn({24}, 42), w = randn({24}, 43), b = randn({24}, 44);
  const Tensor ref = add_layer_norm_reference(y, x, c, w, b, 1e-12f);
  const float* buffer = y.data();
  const Var out = ad::add_layer_norm(Var(std::move(y)), x, c, w, b, 1e-12f);
  EXPECT_EQ(out.value.data(), buffer);  // no new tensor, no copy
  EXPECT_TRUE(AllClose(out.value, ref, kFusedVsReference));
  // A strided y is left as it is: the result is a fresh tensor.
  const Tensor yt = randn({24, 6}, 45).transpose(0, 1), before = yt.clone();
  const Var out2 = ad::add_layer_norm(Var(yt), x, c, w, b, 1e-12f);
  EXPECT_TRUE(AllClose(out2.value, add_layer_norm_reference(before, x, c, w, b, 1e-12f), kFusedVsReference));
  EXPECT_TRUE(AllClose(yt, before, testing::kExact));
  testing::Tape tape;
  EXPECT_TRUE(ThrowsArg([&] { ad::add_layer_norm(tape.leaf(randn({3, 8}, 1)), randn({3, 7}, 2), {}, {}, {}); },
                        "[add_layer_norm]"));
  EXPECT_TRUE(ThrowsArg([&] { ad::add_layer_norm(tape.leaf(randn({3, 8}, 1)), {}, randn({7}, 2), {}, {}); },
                        "[add_layer_norm]"));
  EXPECT_TRUE(ThrowsArg([&] { ad::add_layer_norm(Var(randn({3, 8}, 1)), {}, {}, randn({7}, 2), {}); },
                        "[add_layer_norm]"));
}

double gelu64(double u, bool th) {
  if (th) return 0.5 * u * (1.0 + std::tanh(std::sqrt(2.0 / std::numbers::pi) * (u + 0.044715 * u * u * u)));
  return 0.5 * u * (1.0 + std::erf(u / std::sqrt(2.0)));
}

TEST(AddBiasGeluOp, GradientsMatchFiniteDifferencesAndTheComposition) {
  for (GeluApprox approx : {GeluApprox::kNone, GeluApprox::kTanh}) {
    const bool th = approx == GeluApprox::kTanh;
    for (bool with_bias : {true, false}) {
      std::vector<Tensor> xs{randn({3, 2, 11}, 50, 2.0f)};
      if (with_bias) xs.push_back(randn({11}, 51));
      auto fused = [&](const std::vector<Var>& v) {
        return ad::add_bias_gelu(Var(v[0]), with_bias ? v[1] : Var(), approx);
      };
      auto twin = [&](const DIn& in) {
        std::vector<double> out(in[0].size());
        for (size_t i = 0; i < out.size(); ++i) out[i] = gelu64(in[0][i] + (with_bias ? in[1][i % 11] : 0.0), th);
        return out;
      };
      EXPECT_TRUE(testing::GradsMatchTwin(fused, twin, xs, 52)) << th << with_bias;
      auto composed = [&](const std::vector<Var>& v) {
        return ad::gelu(with_bias ? ad::add(v[0], v[1]) : v[0], approx);
      };
      const testing::Analytic a = testing::analytic_grads(fused, xs, 53), b = testing::analytic_grads(composed, xs, 53);
      EXPECT_TRUE(AllClose(a.out, b.out, kFusedVsComposed));
      for (size_t i = 0; i < xs.size(); ++i) EXPECT_TRUE(AllClose(a.grads[i], b.grads[i], kFusedVsComposed)) << i;
    }
  }
}

TEST(AddBiasGeluOp, WithoutATapeItWritesIntoTheConsumedBuffer) {
  Tensor x = randn({7, 40}, 60, 2.0f);
  const Tensor bias = randn({40}, 61);
  const Tensor ref = gelu_reference(add(x, bias), GeluApprox::kTanh);
  const float* buffer = x.data();
  const Var out = ad::add_bias_gelu(Var(std::move(x)), bias, GeluApprox::kTanh);
  EXPECT_EQ(out.value.data(), buffer);
  EXPECT_TRUE(AllClose(out.value, ref, kGeluKernelVsLibm));
  testing::Tape tape;
  EXPECT_TRUE(ThrowsArg([&] { ad::add_bias_gelu(tape.leaf(randn({3, 8}, 1)), randn({7}, 2)); }, "[add_bias_gelu]"));
  EXPECT_TRUE(ThrowsArg([&] { ad::add_bias_gelu(Var(randn({3, 8}, 1)), randn({7}, 2)); }, "[add_bias_gelu]"));
}

// Packed sequences of lengths 3, 1, 0 and 5 (an empty one too) against each sequence alone through ad::attention:
// the same values and the same gradients for q, k and v; causal within each sequence as well.
TEST(AttentionVarlenOp, MatchesPerSequenceAttentionAndItsGradients) {
  const std::vector<int32_t> cu{0, 3, 4, 4, 9};
  const int64_t n = 9, h = 2, d = 4;
  const std::vector<Tensor> xs{randn({n, h, d}, 70), randn({n, h, d}, 71), randn({n, h, d}, 72)};
  for (bool causal : {false, true}) {
    AttentionOptions o;
    o.causal = causal ? Causal::kTopLeft : Causal::kNone;
    auto packed = [&](const std::vector<Var>& v) { return ad::attention_varlen(v[0], v[1], v[2], cu, cu, 5, 5, o); };
    auto per_sequence = [&](const std::vector<Var>& v) {
      std::vector<Var> outs;
      for (size_t b = 0; b + 1 < cu.size(); ++b) {
        if (cu[b + 1] == cu[b]) continue;
        auto heads = [&](const Var& t) { return ad::transpose(ad::slice(t, 0, cu[b], cu[b + 1]), 0, 1); };
        outs.push_back(ad::transpose(ad::attention(heads(v[0]), heads(v[1]), heads(v[2]), o), 0, 1));
      }
      return ad::concat(outs, 0);
    };
    const testing::Analytic a = testing::analytic_grads(packed, xs, 73), b = testing::analytic_grads(per_sequence, xs, 73);
    EXPECT_TRUE(AllClose(a.out, b.out, kFusedVsComposed)) << causal;
    for (size_t i = 0; i < xs.size(); ++i) EXPECT_TRUE(AllClose(a.grads[i], b.grads[i], kFusedVsComposed)) << i;
  }
}

}  // namespace
}  // namespace qkv
