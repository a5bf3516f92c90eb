// The fused in-place inference steps of post-LN encoders against their composed reference twins:
// add_layer_norm_ (residual + bias + LayerNorm) vs add_layer_norm_reference, add_bias_gelu_ vs gelu_reference(add).
#include <gtest/gtest.h>

#include "ops_testing.h"
#include "qkv/ops/elementwise.h"
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

}  // namespace
}  // namespace qkv
