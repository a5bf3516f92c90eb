// Tests of attention_backward_reference: float32 gradients against central finite differences of the float64
// forward oracle (attention_oracle.h), with masks, causal alignments, fully masked rows and broadcast batch dims.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "attention_oracle.h"
#include "ops_testing.h"
#include "qkv/core/rng.h"
#include "qkv/ops/attention.h"

namespace qkv {
namespace {

using testing::AllClose;
using testing::DTensor;
using testing::ThrowsArg;
using testing::Tol;

// Float32 analytic gradients against double-precision central differences (observed worst error ~1e-6
// relative, from float rounding of scores and products).
constexpr Tol kGradTol{1e-5, 1e-4};
// Central-difference step for the float64 loss: truncation h² and rounding 1e-16/h both stay below 1e-9.
constexpr double kFdStep = 1e-5;

constexpr float kInf = std::numeric_limits<float>::infinity();

Tensor randn(const Shape& shape, uint64_t seed) { return testing::randn(shape, seed); }

bool bit_equal(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape()) return false;
  const std::vector<float> x = a.to_vector(), y = b.to_vector();
  return std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0;
}

bool all_zero(const Tensor& t) {
  for (float x : t.to_vector())
    if (x != 0.0f) return false;
  return true;
}

// loss = Σ out ∘ g, with out from the float64 oracle.
double oracle_loss(const DTensor& q, const DTensor& k, const DTensor& v, const AttentionOptions& o,
                   const std::vector<double>& g) {
  const DTensor mask = o.mask.defined() ? testing::to_dtensor(o.mask) : DTensor{};
  const testing::OracleResult r = testing::attention_oracle(q, k, v, o.mask.defined() ? &mask : nullptr, o);
  double loss = 0.0;
  for (size_t i = 0; i < r.out.size(); ++i) loss += r.out[i] * g[i];
  return loss;
}

// Runs the forward, then the reference backward with d_out, and compares dq, dk, dv with finite differences.
::testing::AssertionResult MatchesFiniteDifferences(const Tensor& q, const Tensor& k, const Tensor& v,
                                                    AttentionOptions o, uint64_t seed) {
  o.return_lse = true;
  const AttentionResult f = attention_reference(q, k, v, o);
  const Tensor d_out = randn(f.out.shape(), seed);
  const AttentionGrads g = attention_backward_reference(q, k, v, f.out, f.lse, d_out, o);
  if (g.dq.shape() != q.shape() || g.dk.shape() != k.shape() || g.dv.shape() != v.shape())
    return ::testing::AssertionFailure() << "gradient shapes " << str(g.dq.shape()) << str(g.dk.shape())
                                         << str(g.dv.shape());
  const std::vector<double> gd = testing::to_double(d_out);
  const DTensor dq = testing::to_dtensor(q), dk = testing::to_dtensor(k), dv = testing::to_dtensor(v);
  auto fd = [&](const DTensor& x, int which) {
    return testing::finite_diff(
        [&](const std::vector<double>& data) {
          DTensor t{x.shape, data};
          return oracle_loss(which == 0 ? t : dq, which == 1 ? t : dk, which == 2 ? t : dv, o, gd);
        },
        x.data, kFdStep);
  };
  if (auto a = AllClose(g.dq, fd(dq, 0), kGradTol); !a) return a << " (dq)";
  if (auto a = AllClose(g.dk, fd(dk, 1), kGradTol); !a) return a << " (dk)";
  if (auto a = AllClose(g.dv, fd(dv, 2), kGradTol); !a) return a << " (dv)";
  return ::testing::AssertionSuccess();
}

TEST(AttentionBackward, GradientsMatchFiniteDifferences) {
  EXPECT_TRUE(MatchesFiniteDifferences(randn({2, 2, 4, 3}, 1), randn({2, 2, 5, 3}, 2), randn({2, 2, 5, 4}, 3),
                                       {}, 4));
}

TEST(AttentionBackward, UnbatchedAndDkDiffersFromDv) {
  EXPECT_TRUE(MatchesFiniteDifferences(randn({3, 7}, 5), randn({6, 7}, 6), randn({6, 2}, 7), {}, 8));
}

TEST(AttentionBackward, SeqLenOne) {
  EXPECT_TRUE(MatchesFiniteDifferences(randn({2, 1, 4}, 9), randn({2, 1, 4}, 10), randn({2, 1, 3}, 11), {}, 12));
}

TEST(AttentionBackward, CustomScale) {
  AttentionOptions o;
  o.scale = 1.7f;
  EXPECT_TRUE(MatchesFiniteDifferences(randn({2, 4, 3}, 13), randn({2, 5, 3}, 14), randn({2, 5, 3}, 15), o, 16));
}

TEST(AttentionBackward, MaskKinds) {
  const Tensor q = randn({2, 4, 3}, 17), k = randn({2, 6, 3}, 18), v = randn({2, 6, 2}, 19);
  Rng rng(20);
  const Tensor bits = rng.bernoulli({2, 4, 6}, 0.6f);
  for (MaskKind kind : {MaskKind::kKeep, MaskKind::kBlock}) {
    AttentionOptions o;
    o.mask = bits;
    o.mask_kind = kind;
    EXPECT_TRUE(MatchesFiniteDifferences(q, k, v, o, 21)) << static_cast<int>(kind);
  }
  AttentionOptions add;
  add.mask = rng.normal({4, 6});
  add.mask.at({1, 2}) = -kInf;
  add.mask.at({3, 0}) = -kInf;
  add.mask_kind = MaskKind::kAdditive;
  EXPECT_TRUE(MatchesFiniteDifferences(q, k, v, add, 22));
}

TEST(AttentionBackward, CausalAlignments) {
  for (Causal c : {Causal::kTopLeft, Causal::kBottomRight}) {
    for (auto [tq, tk] : {std::pair<int64_t, int64_t>{5, 5}, {3, 6}, {6, 3}}) {
      AttentionOptions o;
      o.causal = c;
      EXPECT_TRUE(MatchesFiniteDifferences(randn({2, tq, 3}, 23), randn({2, tk, 3}, 24), randn({2, tk, 2}, 25), o,
                                           26))
          << static_cast<int>(c) << " " << tq << "x" << tk;
    }
  }
}

TEST(AttentionBackward, FullyMaskedRowsGiveZeroGradients) {
  // Bottom-right with Tq > Tk: query rows 0 .. Tq-Tk-1 see no key.
  const int64_t tq = 6, tk = 2;
  const Tensor q = randn({tq, 3}, 27), k = randn({tk, 3}, 28), v = randn({tk, 4}, 29);
  AttentionOptions o;
  o.causal = Causal::kBottomRight;
  o.return_lse = true;
  const AttentionResult f = attention_reference(q, k, v, o);
  Tensor d_out = randn({tq, 4}, 30);
  AttentionGrads g = attention_backward_reference(q, k, v, f.out, f.lse, d_out, o);
  EXPECT_TRUE(all_zero(g.dq.slice(0, 0, tq - tk)));
  EXPECT_FALSE(all_zero(g.dq.slice(0, tq - tk, tq)));
  // A d_out that lives only on the fully masked rows moves nothing.
  d_out.slice(0, tq - tk, tq).fill(0.0f);
  g = attention_backward_reference(q, k, v, f.out, f.lse, d_out, o);
  EXPECT_TRUE(all_zero(g.dq) && all_zero(g.dk) && all_zero(g.dv));
  for (const Tensor* t : {&g.dq, &g.dk, &g.dv})
    for (float x : t->to_vector()) EXPECT_FALSE(std::isnan(x));
}

TEST(AttentionBackward, FullyMaskedRowByMaskGivesZeroGradient) {
  const Tensor q = randn({2, 4, 3}, 31), k = randn({2, 5, 3}, 32), v = randn({2, 5, 3}, 33);
  AttentionOptions o;
  o.mask = Tensor::zeros({2, 4, 5});
  for (int64_t j = 0; j < 5; ++j) o.mask.at({1, 2, j}) = -kInf;
  o.mask_kind = MaskKind::kAdditive;
  o.return_lse = true;
  const AttentionResult f = attention_reference(q, k, v, o);
  const AttentionGrads g = attention_backward_reference(q, k, v, f.out, f.lse, randn({2, 4, 3}, 34), o);
  for (int64_t c = 0; c < 3; ++c) EXPECT_EQ(g.dq.at({1, 2, c}), 0.0f);
  EXPECT_TRUE(MatchesFiniteDifferences(q, k, v, o, 35));
}

TEST(AttentionBackward, BroadcastLeadingDimsReduce) {
  // One k/v head shared by 3 query heads: dk, dv sum over the heads.
  const Tensor q = randn({2, 3, 4, 3}, 36), k = randn({2, 1, 5, 3}, 37), v = randn({2, 1, 5, 2}, 38);
  EXPECT_TRUE(MatchesFiniteDifferences(q, k, v, {}, 39));
  // And q without a batch against batched k/v: dq sums over the batch.
  EXPECT_TRUE(MatchesFiniteDifferences(randn({4, 3}, 40), randn({3, 5, 3}, 41), randn({5, 2}, 42), {}, 43));
  // The same numbers as expanding k/v explicitly and summing the per-head gradients.
  AttentionOptions o;
  o.return_lse = true;
  const Tensor ke = k.expand({2, 3, 5, 3}).clone(), ve = v.expand({2, 3, 5, 2}).clone();
  const AttentionResult f = attention_reference(q, k, v, o);
  const Tensor d_out = randn(f.out.shape(), 44);
  const AttentionGrads g = attention_backward_reference(q, k, v, f.out, f.lse, d_out, o);
  const AttentionGrads ge = attention_backward_reference(q, ke, ve, f.out, f.lse, d_out, o);
  std::vector<double> dk_sum(static_cast<size_t>(k.numel()), 0.0);
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t h = 0; h < 3; ++h)
      for (int64_t j = 0; j < 5; ++j)
        for (int64_t c = 0; c < 3; ++c) dk_sum[static_cast<size_t>((b * 5 + j) * 3 + c)] += ge.dk.at({b, h, j, c});
  EXPECT_TRUE(AllClose(g.dk, dk_sum, testing::kFloatVsDouble));
  EXPECT_TRUE(bit_equal(g.dq, ge.dq));
}

TEST(AttentionBackward, MaskBroadcastShapes) {
  const Tensor q = randn({2, 2, 3, 3}, 45), k = randn({2, 2, 4, 3}, 46), v = randn({2, 2, 4, 2}, 47);
  Rng rng(48);
  for (const Shape& s : std::vector<Shape>{{3, 4}, {2, 1, 1, 4}, {1, 2, 3, 1}}) {
    AttentionOptions o;
    o.mask = rng.bernoulli(s, 0.7f);
    o.mask_kind = MaskKind::kKeep;
    EXPECT_TRUE(MatchesFiniteDifferences(q, k, v, o, 49)) << str(s);
  }
}

TEST(AttentionBackward, NonContiguousInputsMatchContiguous) {
  const Tensor q = randn({2, 4, 3, 5}, 50).transpose(1, 2);  // (B, T, H, D) -> (B, H, T, D)
  const Tensor k = randn({2, 6, 3, 5}, 51).transpose(1, 2);
  const Tensor v = randn({2, 6, 3, 2}, 52).transpose(1, 2);
  AttentionOptions o;
  o.causal = Causal::kTopLeft;
  o.return_lse = true;
  const AttentionResult f = attention_reference(q, k, v, o);
  const Tensor d_out = randn({2, 6, 3, 2}, 53).transpose(1, 2).slice(2, 0, 4);  // strided d_out
  const AttentionGrads a = attention_backward_reference(q, k, v, f.out, f.lse, d_out, o);
  const AttentionGrads b =
      attention_backward_reference(q.clone(), k.clone(), v.clone(), f.out, f.lse, d_out.clone(), o);
  EXPECT_TRUE(bit_equal(a.dq, b.dq) && bit_equal(a.dk, b.dk) && bit_equal(a.dv, b.dv));
  EXPECT_TRUE(MatchesFiniteDifferences(q, k, v, o, 54));
}

TEST(AttentionBackward, UndefinedOutAndLseAreRecomputed) {
  const Tensor q = randn({2, 4, 3}, 55), k = randn({2, 5, 3}, 56), v = randn({2, 5, 2}, 57);
  AttentionOptions o;
  o.causal = Causal::kBottomRight;
  o.return_lse = true;
  const AttentionResult f = attention_reference(q, k, v, o);
  const Tensor d_out = randn({2, 4, 2}, 58);
  const AttentionGrads a = attention_backward_reference(q, k, v, f.out, f.lse, d_out, o);
  const AttentionGrads b = attention_backward_reference(q, k, v, Tensor(), Tensor(), d_out, o);
  EXPECT_TRUE(bit_equal(a.dq, b.dq) && bit_equal(a.dk, b.dk) && bit_equal(a.dv, b.dv));
}

TEST(AttentionBackward, RandomConfigSweep) {
  Rng rng(7);
  for (int cfg = 0; cfg < 20; ++cfg) {
    const int64_t tq = 1 + static_cast<int64_t>(rng.below(5)), tk = 1 + static_cast<int64_t>(rng.below(5));
    const int64_t dk = 1 + static_cast<int64_t>(rng.below(4)), dv = 1 + static_cast<int64_t>(rng.below(4));
    const int64_t b = 1 + static_cast<int64_t>(rng.below(2));
    const Tensor q = rng.normal({b, tq, dk}), k = rng.normal({rng.bernoulli(0.5f) ? b : 1, tk, dk});
    const Tensor v = rng.normal({rng.bernoulli(0.5f) ? b : 1, tk, dv});
    AttentionOptions o;
    o.causal = static_cast<Causal>(rng.below(3));
    o.mask_kind = static_cast<MaskKind>(rng.below(4));
    if (o.mask_kind == MaskKind::kAdditive) o.mask = rng.normal({tq, tk});
    else if (o.mask_kind != MaskKind::kNone) o.mask = rng.bernoulli({b, 1, tk}, 0.7f);
    if (rng.bernoulli(0.5f)) o.scale = rng.uniform(-2.0f, 2.0f);
    EXPECT_TRUE(MatchesFiniteDifferences(q, k, v, o, 100 + cfg))
        << "config " << cfg << ": q " << str(q.shape()) << " k " << str(k.shape()) << " v " << str(v.shape())
        << " kind " << static_cast<int>(o.mask_kind) << " causal " << static_cast<int>(o.causal);
  }
}

// ---- error paths ----

TEST(AttentionBackwardErrors, DOutShapeMismatch) {
  const Tensor q = randn({2, 4, 3}, 1), k = randn({2, 5, 3}, 2), v = randn({2, 5, 2}, 3);
  EXPECT_THROW(attention_backward_reference(q, k, v, Tensor(), Tensor(), randn({2, 4, 3}, 4)),
               std::invalid_argument);
  EXPECT_TRUE(ThrowsArg([&] { attention_backward_reference(q, k, v, Tensor(), Tensor(), randn({2, 4, 3}, 4)); },
                        "[attention_backward] d_out (2, 4, 3)"));
  EXPECT_TRUE(ThrowsArg([&] { attention_backward_reference(q, k, v, Tensor(), Tensor(), Tensor()); },
                        "[attention_backward] d_out"));
}

TEST(AttentionBackwardErrors, OutAndLseShapeMismatch) {
  const Tensor q = randn({2, 4, 3}, 1), k = randn({2, 5, 3}, 2), v = randn({2, 5, 2}, 3);
  const Tensor d_out = randn({2, 4, 2}, 4);
  EXPECT_THROW(attention_backward_reference(q, k, v, randn({4, 2}, 5), Tensor(), d_out), std::invalid_argument);
  EXPECT_TRUE(ThrowsArg([&] { attention_backward_reference(q, k, v, randn({4, 2}, 5), Tensor(), d_out); },
                        "[attention_backward] out (4, 2)"));
  EXPECT_TRUE(ThrowsArg([&] { attention_backward_reference(q, k, v, Tensor(), randn({2, 5}, 6), d_out); },
                        "[attention_backward] lse (2, 5)"));
}

TEST(AttentionBackwardErrors, InputsValidatedLikeForward) {
  const Tensor d_out = randn({2, 4, 2}, 4);
  EXPECT_TRUE(ThrowsArg(
      [&] { attention_backward_reference(randn({2, 4, 3}, 1), randn({2, 5, 4}, 2), randn({2, 5, 2}, 3), Tensor(),
                                         Tensor(), d_out); },
      "[attention_backward] q (2, 4, 3) and k (2, 5, 4) must have the same last dimension"));
  AttentionOptions o;
  o.mask_kind = MaskKind::kKeep;
  EXPECT_TRUE(ThrowsArg(
      [&] { attention_backward_reference(randn({2, 4, 3}, 1), randn({2, 5, 3}, 2), randn({2, 5, 2}, 3), Tensor(),
                                         Tensor(), d_out, o); },
      "[attention_backward] mask_kind kKeep needs a mask"));
}

}  // namespace
}  // namespace qkv
