// Positional encodings, the rotary and linear-bias families (RoPE, ALiBi): each against hand-computed values and its
// defining property, error paths, and the permutation test (attention alone is permutation-equivariant; with any
// positional encoding it is not).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "ops_testing.h"
#include "positional_testing.h"
#include "qkv/core/rng.h"
#include "qkv/core/tensor.h"
#include "qkv/nn/positional.h"
#include "qkv/ops/attention.h"

namespace qkv {
namespace {

using testing::AllClose;
using testing::kExact;
using testing::kFloatVsDouble;
using testing::randn;
using testing::ThrowsArg;
using testing::Tol;
using namespace testing::positional;

// ============================================================================ RoPE

TEST(Rope, RotatesKnownVectorByKnownAngle) {
  // D = 2: one pair of frequency 1, so position 3 rotates by 3 rad in both variants.
  for (RopeVariant var : {RopeVariant::kInterleaved, RopeVariant::kHalfSplit}) {
    const Tensor r = rope_apply(Tensor::from_vector({1, 2}, {1.0f, 0.0f}), 3, 10000.0f, var);
    EXPECT_TRUE(AllClose(r, dvec({std::cos(3.0), std::sin(3.0)}), kTableTol));
  }
  // D = 4, base 100: frequencies 1 and 100^(-1/2) = 0.1; position 2 gives angles 2 and 0.2.
  const Tensor x = Tensor::from_vector({1, 4}, {1.0f, 0.0f, 0.0f, 1.0f});
  // Interleaved pairs (0,1), (2,3): (1,0) -> (cos 2, sin 2); (0,1) -> (-sin 0.2, cos 0.2).
  EXPECT_TRUE(AllClose(rope_apply(x, 2, 100.0f, RopeVariant::kInterleaved),
                       dvec({std::cos(2.0), std::sin(2.0), -std::sin(0.2), std::cos(0.2)}), kTableTol));
  // Half-split pairs (0,2), (1,3): (x0, x2) = (1, 0) by 2 rad; (x1, x3) = (0, 1) by 0.2 rad.
  EXPECT_TRUE(AllClose(rope_apply(x, 2, 100.0f, RopeVariant::kHalfSplit),
                       dvec({std::cos(2.0), -std::sin(0.2), std::sin(2.0), std::cos(0.2)}), kTableTol));
}

TEST(Rope, PositionZeroIsIdentity) {
  const Tensor x = randn({2, 1, 6}, 100);
  EXPECT_TRUE(AllClose(rope_apply(x), x, kExact));
}

TEST(Rope, PreservesNormOfEveryPair) {
  const int64_t T = 9, D = 8;
  const Tensor x = randn({2, T, D}, 101);
  for (RopeVariant var : {RopeVariant::kInterleaved, RopeVariant::kHalfSplit}) {
    const Tensor y = rope_apply(x, 5, 10000.0f, var);
    for (int64_t b = 0; b < 2; ++b)
      for (int64_t t = 0; t < T; ++t)
        for (int64_t i = 0; i < D / 2; ++i) {
          const int64_t a = var == RopeVariant::kInterleaved ? 2 * i : i;
          const int64_t c = var == RopeVariant::kInterleaved ? 2 * i + 1 : i + D / 2;
          const double n0 = std::hypot(x.at({b, t, a}), x.at({b, t, c}));
          const double n1 = std::hypot(y.at({b, t, a}), y.at({b, t, c}));
          EXPECT_NEAR(n1, n0, kTableTol.atol + kTableTol.rtol * n0);
        }
  }
}

TEST(Rope, DotProductDependsOnlyOnRelativePosition) {
  const int64_t D = 16;
  const Tensor q = randn({1, D}, 102), k = randn({1, D}, 103);
  for (RopeVariant var : {RopeVariant::kInterleaved, RopeVariant::kHalfSplit}) {
    auto score = [&](int64_t m, int64_t n) {
      const std::vector<float> a = rope_apply(q, m, 10000.0f, var).to_vector();
      const std::vector<float> b = rope_apply(k, n, 10000.0f, var).to_vector();
      double s = 0.0;
      for (int64_t d = 0; d < D; ++d) s += double(a[d]) * double(b[d]);
      return s;
    };
    const double ref = score(5, 2);
    for (auto [m, n] : std::vector<std::pair<int64_t, int64_t>>{{3, 0}, {13, 10}, {103, 100}, {40, 37}})
      EXPECT_NEAR(score(m, n), ref, 1e-4 * (1.0 + std::fabs(ref))) << m << "," << n;
    EXPECT_GT(std::fabs(score(5, 5) - ref), kClearlyDifferent);  // a different offset does change it
  }
}

TEST(Rope, InterleavedIsHalfSplitUnderFeaturePermutation) {
  // Gathering even features then odd features turns interleaved pairs into half-split pairs.
  const int64_t T = 4, D = 6;
  const Tensor x = randn({T, D}, 104);
  Tensor gathered = Tensor::empty({T, D});
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < D / 2; ++i) {
      gathered.at({t, i}) = x.at({t, 2 * i});
      gathered.at({t, i + D / 2}) = x.at({t, 2 * i + 1});
    }
  const Tensor a = rope_apply(x, 7, 500.0f, RopeVariant::kInterleaved);
  const Tensor b = rope_apply(gathered, 7, 500.0f, RopeVariant::kHalfSplit);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < D / 2; ++i) {
      EXPECT_EQ(a.at({t, 2 * i}), b.at({t, i}));
      EXPECT_EQ(a.at({t, 2 * i + 1}), b.at({t, i + D / 2}));
    }
}

TEST(Rope, StridedInputAndExplicitPositions) {
  const Tensor base = randn({2, 5, 3, 4}, 105);  // (B, T, H, D) -> (B, H, T, D) view
  const Tensor x = base.transpose(1, 2);
  ASSERT_FALSE(x.is_contiguous());
  const Tensor y = rope_apply(x, 3);
  EXPECT_EQ(y.shape(), x.shape());
  EXPECT_TRUE(y.is_contiguous());
  EXPECT_TRUE(AllClose(y, rope_apply(x.contiguous(), 3), kExact));
  EXPECT_TRUE(AllClose(y, rope_apply(x, std::vector<int64_t>{3, 4, 5, 6, 7}), kExact));
  // The input is untouched.
  EXPECT_EQ(base.to_vector(), randn({2, 5, 3, 4}, 105).to_vector());
}

TEST(Rope, OneTableRotatesEveryTensorOfItsPositions) {
  // A model's queries and keys of every layer share one table: the same bits as each call making its own.
  const std::vector<int64_t> positions{9, 0, 4, 4, 31};
  const RopeTable table = rope_table(positions, 6, 500.0f);
  EXPECT_EQ(table.rows, 5);
  EXPECT_EQ(table.dim, 6);
  for (RopeVariant variant : {RopeVariant::kHalfSplit, RopeVariant::kInterleaved}) {
    const Tensor q = randn({2, 5, 7, 6}, 106).transpose(1, 2);  // (B, T, Hq, D) read as (B, Hq, T, D)
    const Tensor k = randn({2, 5, 3, 6}, 107).transpose(1, 2);
    EXPECT_TRUE(AllClose(rope_apply(q, table, variant), rope_apply(q, positions, 500.0f, variant), kExact));
    EXPECT_TRUE(AllClose(rope_apply(k, table, variant), rope_apply(k.contiguous(), positions, 500.0f, variant),
                         kExact));
    // A last dimension that is itself strided is made contiguous first.
    const Tensor wide = randn({5, 12}, 108);
    const Tensor every_other = wide.reshape({5, 6, 2}).select(2, 1);
    ASSERT_NE(every_other.stride(-1), 1);
    EXPECT_TRUE(AllClose(rope_apply(every_other, table, variant),
                         rope_apply(every_other.contiguous(), table, variant), kExact));
  }
  // Consecutive positions: the offset form.
  EXPECT_TRUE(AllClose(rope_apply(randn({3, 4, 8}, 109), rope_table(5, 4, 8)), rope_apply(randn({3, 4, 8}, 109), 5),
                       kExact));
  // Rows of a table (a model's last queries): the table of those positions.
  const RopeTable rows = rope_table_rows(table, 2, 3);
  EXPECT_EQ(rows.rows, 3);
  EXPECT_EQ(rows.dim, 6);
  EXPECT_EQ(rows.cos, rope_table(std::vector<int64_t>{4, 4, 31}, 6, 500.0f).cos);
  EXPECT_EQ(rows.sin, rope_table(std::vector<int64_t>{4, 4, 31}, 6, 500.0f).sin);
  EXPECT_EQ(rope_table_rows(table, 5, 0).rows, 0);
  EXPECT_TRUE(ThrowsArg([&] { rope_table_rows(table, 3, 3); }, "[rope_table_rows] rows 3 .. 6 of a table of 5"));
  EXPECT_TRUE(ThrowsArg([&] { rope_table_rows(table, -1, 2); }, "[rope_table_rows]"));
  // A table of other positions or another D is refused, naming both shapes.
  EXPECT_TRUE(ThrowsArg([&] { rope_apply(Tensor::zeros({2, 4, 6}), table); }, "[rope_apply]"));
  EXPECT_TRUE(ThrowsArg([&] { rope_apply(Tensor::zeros({5, 8}), table); }, "5 positions x D 6"));
  EXPECT_TRUE(ThrowsArg([] { rope_table(std::vector<int64_t>{1, 2}, 5); }, "[rope_table]"));
  EXPECT_TRUE(ThrowsArg([] { rope_table(std::vector<int64_t>{1, -2}, 4); }, "[rope_table]"));
  EXPECT_TRUE(ThrowsArg([] { rope_table(0, 3, 4, -1.0f); }, "[rope_table]"));
  EXPECT_TRUE(ThrowsArg([] { rope_table(-1, 3, 4); }, "[rope_table]"));
}

TEST(Rope, ErrorsNameTheOp) {
  EXPECT_TRUE(ThrowsArg([] { rope_apply(Tensor::zeros({2, 5})); }, "[rope_apply]"));  // odd D
  EXPECT_TRUE(ThrowsArg([] { rope_apply(Tensor::zeros({2, 0})); }, "[rope_apply]"));
  EXPECT_TRUE(ThrowsArg([] { rope_apply(Tensor::zeros({4})); }, "[rope_apply]"));
  EXPECT_TRUE(ThrowsArg([] { rope_apply(Tensor()); }, "[rope_apply]"));
  EXPECT_TRUE(ThrowsArg([] { rope_apply(Tensor::zeros({2, 4}), -1); }, "[rope_apply]"));
  EXPECT_TRUE(ThrowsArg([] { rope_apply(Tensor::zeros({2, 4}), 0, 0.0f); }, "[rope_apply]"));
  EXPECT_TRUE(ThrowsArg([] { rope_apply(Tensor::zeros({2, 4}), std::vector<int64_t>{1}); }, "[rope_apply]"));
  EXPECT_TRUE(ThrowsArg([] { rope_apply(Tensor::zeros({2, 4}), std::vector<int64_t>{1, -1}); }, "[rope_apply]"));
}

// ============================================================================ ALiBi

std::vector<double> pow2(std::initializer_list<double> exps) {
  std::vector<double> out;
  for (double e : exps) out.push_back(std::exp2(e));
  return out;
}

TEST(Alibi, SlopesForEightHeadsAreHalfToOne256th) {
  EXPECT_TRUE(AllClose(alibi_slopes(8), pow2({-1, -2, -3, -4, -5, -6, -7, -8}), kExact));
  EXPECT_TRUE(AllClose(alibi_slopes(16), pow2({-0.5, -1, -1.5, -2, -2.5, -3, -3.5, -4, -4.5, -5, -5.5, -6, -6.5,
                                               -7, -7.5, -8}), kTableTol));
  EXPECT_TRUE(AllClose(alibi_slopes(1), pow2({-8}), kExact));
}

TEST(Alibi, NonPowerOfTwoHeadsFollowTheRecipe) {
  // H = 12: the 8 slopes of 8, then slopes 0, 2, 4, 6 of 16 (2^-0.5, 2^-1.5, ...).
  EXPECT_TRUE(AllClose(alibi_slopes(12), pow2({-1, -2, -3, -4, -5, -6, -7, -8, -0.5, -1.5, -2.5, -3.5}), kTableTol));
  // H = 6: the 4 slopes of 4 (2^-2, 2^-4, 2^-6, 2^-8), then slopes 0, 2 of 8 (2^-1, 2^-3).
  EXPECT_TRUE(AllClose(alibi_slopes(6), pow2({-2, -4, -6, -8, -1, -3}), kExact));
  // H = 3: slopes of 2 (2^-4, 2^-8), then slope 0 of 4 (2^-2).
  EXPECT_TRUE(AllClose(alibi_slopes(3), pow2({-4, -8, -2}), kExact));
}

TEST(Alibi, CausalBiasIsMinusSlopeTimesDistanceAndBlocksTheFuture) {
  const Tensor b = alibi_bias(2, 4, 4, AlibiMode::kCausal);
  ASSERT_EQ(b.shape(), Shape({1, 2, 4, 4}));
  const double s[2] = {1.0 / 16, 1.0 / 256};
  for (int64_t h = 0; h < 2; ++h)
    for (int64_t i = 0; i < 4; ++i)
      for (int64_t j = 0; j < 4; ++j) {
        if (j > i) EXPECT_EQ(b.at({0, h, i, j}), -kInf);
        else EXPECT_NEAR(b.at({0, h, i, j}), -s[h] * (i - j), 1e-7);
      }
}

TEST(Alibi, SymmetricBiasUsesAbsoluteDistance) {
  const Tensor b = alibi_bias(4, 3, 5, AlibiMode::kSymmetric);
  ASSERT_EQ(b.shape(), Shape({1, 4, 3, 5}));
  const Tensor s = alibi_slopes(4);
  for (int64_t h = 0; h < 4; ++h)
    for (int64_t i = 0; i < 3; ++i)
      for (int64_t j = 0; j < 5; ++j)
        EXPECT_FLOAT_EQ(b.at({0, h, i, j}), -s.at({h}) * static_cast<float>(std::abs(i - j)));
}

TEST(Alibi, QueryOffsetEqualsLastRowsOfFullBias) {
  const Tensor full = alibi_bias(3, 6, 6, AlibiMode::kCausal);
  EXPECT_TRUE(AllClose(alibi_bias(3, 2, 6, AlibiMode::kCausal, 4), full.slice(2, 4, 6).contiguous(), kExact));
  // A query before every key (offset -1, row 0) is fully masked; attention maps that row to 0.
  const Tensor early = alibi_bias(1, 2, 3, AlibiMode::kCausal, -1);
  for (int64_t j = 0; j < 3; ++j) EXPECT_EQ(early.at({0, 0, 0, j}), -kInf);
}

TEST(Alibi, MatchesReferenceKeyPositionFormUnderCausalMask) {
  // The reference adds slope·j (key position) next to a causal mask; per query row that differs from
  // -slope·(i - j) by the constant slope·i, which softmax ignores. Attention outputs must agree.
  const int64_t H = 4, T = 6, D = 3;
  const Tensor x = randn({1, H, T, D}, 110);
  AttentionOptions ours;
  ours.mask = alibi_bias(H, T, T, AlibiMode::kCausal);
  ours.mask_kind = MaskKind::kAdditive;
  Tensor keypos = Tensor::empty({1, H, 1, T});
  const Tensor s = alibi_slopes(H);
  for (int64_t h = 0; h < H; ++h)
    for (int64_t j = 0; j < T; ++j) keypos.at({0, h, 0, j}) = s.at({h}) * static_cast<float>(j);
  AttentionOptions ref;
  ref.mask = keypos;
  ref.mask_kind = MaskKind::kAdditive;
  ref.causal = Causal::kTopLeft;
  EXPECT_TRUE(AllClose(attention(x, x, x, ours).out, attention(x, x, x, ref).out, kPathTol));
}

TEST(Alibi, ErrorsNameTheOp) {
  EXPECT_TRUE(ThrowsArg([] { alibi_slopes(0); }, "[alibi_slopes]"));
  EXPECT_TRUE(ThrowsArg([] { alibi_bias(0, 2, 2, AlibiMode::kCausal); }, "[alibi_bias]"));
  EXPECT_TRUE(ThrowsArg([] { alibi_bias(2, -1, 2, AlibiMode::kSymmetric); }, "[alibi_bias]"));
  EXPECT_TRUE(ThrowsArg([] { alibi_bias(2, 2, -1, AlibiMode::kSymmetric); }, "[alibi_bias]"));
}

// ============================================================================ permutation test

// Self-attention with q = k = v = x over (1, H, T, D); P permutes the T axis.
constexpr int64_t kH = 4, kT = 6, kD = 8;
const std::vector<int64_t> kPerm = {3, 0, 5, 1, 4, 2};  // no fixed points, not an involution

Tensor permute_rows(const Tensor& x) {
  Tensor out = Tensor::empty(x.shape());
  for (int64_t t = 0; t < x.size(2); ++t) out.slice(2, t, t + 1).copy_from(x.slice(2, kPerm[t], kPerm[t] + 1));
  return out;
}

// max |f(Px) - P f(x)|
template <typename F>
double equivariance_gap(F&& f) {
  const Tensor x = randn({1, kH, kT, kD}, 120);
  return max_abs_diff(f(permute_rows(x)), permute_rows(f(x)));
}

Tensor self_attention(const Tensor& x, const Tensor& bias = Tensor()) {
  AttentionOptions o;
  if (bias.defined()) {
    o.mask = bias;
    o.mask_kind = MaskKind::kAdditive;
  }
  return attention(x, x, x, o).out;
}

TEST(Permutation, NoPositionalEncodingIsEquivariant) {
  EXPECT_LT(equivariance_gap([](const Tensor& x) { return self_attention(x); }), kEquivTol);
}

TEST(Permutation, SinusoidalBreaksEquivariance) {
  const double gap = equivariance_gap([](const Tensor& x) { return self_attention(add_sinusoidal(x)); });
  EXPECT_GT(gap, kClearlyDifferent);
}

TEST(Permutation, LearnedBreaksEquivariance) {
  Rng rng(121);
  nn::LearnedPositionalEmbedding pe(16, kD, rng);
  EXPECT_GT(equivariance_gap([&](const Tensor& x) { return self_attention(pe.forward(x)); }), kClearlyDifferent);
}

TEST(Permutation, ShawBreaksEquivariance) {
  Rng rng(122);
  nn::ShawRelativePosition rel(2, kD, rng);
  EXPECT_GT(equivariance_gap([&](const Tensor& x) { return rel.forward(x, x, x).out; }), kClearlyDifferent);
}

TEST(Permutation, T5BiasBreaksEquivariance) {
  Rng rng(123);
  nn::T5RelativeBias t5(32, 128, kH, true, rng);
  EXPECT_GT(equivariance_gap([&](const Tensor& x) { return self_attention(x, t5.forward(kT, kT)); }),
            kClearlyDifferent);
}

TEST(Permutation, RopeBreaksEquivariance) {
  for (RopeVariant var : {RopeVariant::kInterleaved, RopeVariant::kHalfSplit}) {
    const double gap = equivariance_gap([&](const Tensor& x) {
      const Tensor r = rope_apply(x, 0, 10000.0f, var);
      return attention(r, r, x).out;
    });
    EXPECT_GT(gap, kClearlyDifferent);
  }
}

TEST(Permutation, AlibiBreaksEquivariance) {
  EXPECT_GT(equivariance_gap([](const Tensor& x) {
              return self_attention(x, alibi_bias(kH, kT, kT, AlibiMode::kSymmetric));
            }),
            kClearlyDifferent);
}

}  // namespace
}  // namespace qkv
