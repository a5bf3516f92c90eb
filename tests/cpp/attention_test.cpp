// Tests of attention()/attention_reference() against the float64 oracle in attention_oracle.h: masks, causal
// alignments, broadcasting, strided inputs, scale, lse, fully masked rows, a random sweep and every error path.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "attention_oracle.h"
#include "ops_testing.h"
#include "qkv/core/rng.h"
#include "qkv/ops/attention.h"

namespace qkv {
namespace {

using testing::AllClose;
using testing::attention_oracle;
using testing::OracleResult;
using testing::ThrowsArg;
using testing::Tol;

// Float32 attention against the float64 oracle: relative error 1e-5 plus a small absolute floor.
constexpr Tol kAttnTol{1e-5, 1e-5};
// Two float32 computations of the same quantity through slightly different roundings (q·c vs scale·c).
constexpr Tol kRoundingTol{1e-5, 1e-4};

constexpr float kInf = std::numeric_limits<float>::infinity();

Tensor randn(const Shape& shape, uint64_t seed) { return testing::randn(shape, seed); }

// 0/1 tensor with P(1) = p.
Tensor bernoulli(const Shape& shape, float p, uint64_t seed) {
  Rng rng(seed);
  return rng.bernoulli(shape, p);
}

bool bit_equal(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape()) return false;
  const std::vector<float> x = a.to_vector(), y = b.to_vector();
  for (size_t i = 0; i < x.size(); ++i)
    if (std::memcmp(&x[i], &y[i], sizeof(float)) != 0) return false;
  return true;
}

bool has_nan(const Tensor& t) {
  for (float x : t.to_vector())
    if (std::isnan(x)) return true;
  return false;
}

// Runs attention_reference with weights and lse, and checks all three against the oracle.
::testing::AssertionResult MatchesOracle(const Tensor& q, const Tensor& k, const Tensor& v,
                                         AttentionOptions o) {
  o.return_weights = true;
  o.return_lse = true;
  const AttentionResult r = attention_reference(q, k, v, o);
  const OracleResult ref = attention_oracle(q, k, v, o);
  Shape out_shape = ref.batch, w_shape = ref.batch, lse_shape = ref.batch;
  out_shape.insert(out_shape.end(), {q.size(-2), v.size(-1)});
  w_shape.insert(w_shape.end(), {q.size(-2), k.size(-2)});
  lse_shape.push_back(q.size(-2));
  if (r.out.shape() != out_shape) return ::testing::AssertionFailure() << "out shape " << str(r.out.shape());
  if (r.weights.shape() != w_shape) return ::testing::AssertionFailure() << "weights " << str(r.weights.shape());
  if (r.lse.shape() != lse_shape) return ::testing::AssertionFailure() << "lse shape " << str(r.lse.shape());
  if (auto a = AllClose(r.out, ref.out, kAttnTol); !a) return a << " (out)";
  if (auto a = AllClose(r.weights, ref.weights, kAttnTol); !a) return a << " (weights)";
  if (auto a = AllClose(r.lse, ref.lse, kAttnTol); !a) return a << " (lse)";
  if (has_nan(r.out) || has_nan(r.weights) || has_nan(r.lse)) return ::testing::AssertionFailure() << "NaN";
  return ::testing::AssertionSuccess();
}

TEST(Attention, MatchesFloat64Oracle) {
  EXPECT_TRUE(MatchesOracle(randn({2, 3, 10, 16}, 1), randn({2, 3, 12, 16}, 2), randn({2, 3, 12, 16}, 3), {}));
}

TEST(Attention, WeightsRowsSumToOne) {
  AttentionOptions o;
  o.return_weights = true;
  const AttentionResult r = attention(randn({2, 4, 9, 8}, 4), randn({2, 4, 11, 8}, 5), randn({2, 4, 11, 8}, 6), o);
  ASSERT_EQ(r.weights.shape(), (Shape{2, 4, 9, 11}));
  const std::vector<float> w = r.weights.to_vector();
  for (size_t row = 0; row < w.size() / 11; ++row) {
    double s = 0.0;
    for (size_t j = 0; j < 11; ++j) {
      EXPECT_GE(w[row * 11 + j], 0.0f);
      s += w[row * 11 + j];
    }
    EXPECT_NEAR(s, 1.0, 1e-6) << "row " << row;
  }
}

TEST(Attention, ResultHasOnlyWhatWasAskedFor) {
  const AttentionResult r = attention(randn({3, 4}, 7), randn({5, 4}, 8), randn({5, 6}, 9));
  EXPECT_EQ(r.out.shape(), (Shape{3, 6}));
  EXPECT_FALSE(r.weights.defined());
  EXPECT_FALSE(r.lse.defined());
}

TEST(Attention, AttentionDispatchMatchesReference) {
  const Tensor q = randn({2, 5, 8}, 10), k = randn({2, 7, 8}, 11), v = randn({2, 7, 3}, 12);
  AttentionOptions o;
  o.causal = Causal::kBottomRight;
  EXPECT_TRUE(AllClose(attention(q, k, v, o).out, attention_reference(q, k, v, o).out, kAttnTol));
}

TEST(Attention, KeepAndBlockHaveOppositePolarity) {
  const Tensor q = randn({2, 6, 8}, 13), k = randn({2, 9, 8}, 14), v = randn({2, 9, 5}, 15);
  const Tensor m = bernoulli({2, 6, 9}, 0.6f, 16);
  AttentionOptions keep, block;
  keep.mask = block.mask = m;
  keep.mask_kind = MaskKind::kKeep;
  block.mask_kind = MaskKind::kBlock;
  keep.return_weights = block.return_weights = true;
  const AttentionResult rk = attention_reference(q, k, v, keep), rb = attention_reference(q, k, v, block);
  const std::vector<float> mv = m.to_vector(), wk = rk.weights.to_vector(), wb = rb.weights.to_vector();
  int taken_keep = 0, taken_block = 0;
  for (size_t i = 0; i < mv.size(); ++i) {
    if (mv[i] != 0.0f) {
      EXPECT_EQ(wb[i], 0.0f) << i;  // kBlock: nonzero blocks
    } else {
      EXPECT_EQ(wk[i], 0.0f) << i;  // kKeep: zero blocks
    }
    taken_keep += wk[i] > 0.0f;
    taken_block += wb[i] > 0.0f;
  }
  EXPECT_GT(taken_keep, 0);
  EXPECT_GT(taken_block, 0);
  EXPECT_FALSE(AllClose(rk.out, rb.out, kAttnTol));
  // Keep(m) is Block(1 - m), bit for bit.
  Tensor inv = Tensor::empty(m.shape());
  for (int64_t i = 0; i < m.numel(); ++i) inv.data()[i] = m.data()[i] == 0.0f ? 1.0f : 0.0f;
  block.mask = inv;
  EXPECT_TRUE(bit_equal(attention_reference(q, k, v, block).out, rk.out));
  EXPECT_TRUE(MatchesOracle(q, k, v, keep));
  block.mask = m;
  EXPECT_TRUE(MatchesOracle(q, k, v, block));
}

TEST(Attention, AdditiveMaskIsAddedToScaledScores) {
  const Tensor q = randn({2, 2, 7, 6}, 17), k = randn({2, 2, 8, 6}, 18), v = randn({2, 2, 8, 4}, 19);
  Tensor m = randn({2, 2, 7, 8}, 20);
  const Tensor blocked = bernoulli(m.shape(), 0.3f, 21);
  for (int64_t i = 0; i < m.numel(); ++i)
    if (blocked.data()[i] != 0.0f) m.data()[i] = -kInf;
  AttentionOptions o;
  o.mask = m;
  o.mask_kind = MaskKind::kAdditive;
  EXPECT_TRUE(MatchesOracle(q, k, v, o));
}

TEST(Attention, AdditiveZeroMinusInfEqualsKeepMask) {
  const Tensor q = randn({5, 4}, 22), k = randn({6, 4}, 23), v = randn({6, 3}, 24);
  const Tensor keep = bernoulli({5, 6}, 0.7f, 25);
  Tensor add = Tensor::empty({5, 6});
  for (int64_t i = 0; i < 30; ++i) add.data()[i] = keep.data()[i] != 0.0f ? 0.0f : -kInf;
  AttentionOptions a, b;
  a.mask = keep;
  a.mask_kind = MaskKind::kKeep;
  b.mask = add;
  b.mask_kind = MaskKind::kAdditive;
  EXPECT_TRUE(bit_equal(attention_reference(q, k, v, a).out, attention_reference(q, k, v, b).out));
}

TEST(Attention, MaskBroadcastShapes) {
  const int64_t B = 2, H = 3, Tq = 5, Tk = 7;
  const Tensor q = randn({B, H, Tq, 8}, 26), k = randn({B, H, Tk, 8}, 27), v = randn({B, H, Tk, 4}, 28);
  const std::vector<Shape> shapes = {{Tq, Tk}, {B, 1, 1, Tk}, {B, H, Tq, Tk}, {1, Tk}, {H, 1, Tk},
                                     {Tq, 1},  {1, H, Tq, 1}, {B, 1, Tq, Tk}, {}};
  uint64_t seed = 100;
  for (const Shape& s : shapes) {
    for (MaskKind kind : {MaskKind::kKeep, MaskKind::kBlock, MaskKind::kAdditive}) {
      AttentionOptions o;
      o.mask = kind == MaskKind::kAdditive ? randn(s, seed++) : bernoulli(s, 0.7f, seed++);
      o.mask_kind = kind;
      EXPECT_TRUE(MatchesOracle(q, k, v, o)) << "mask " << str(s) << " kind " << static_cast<int>(kind);
    }
  }
}

TEST(Attention, StridedMaskView) {
  const Tensor q = randn({2, 4, 6}, 29), k = randn({2, 5, 6}, 30), v = randn({2, 5, 6}, 31);
  AttentionOptions o;
  o.mask = randn({2, 5, 4}, 32).transpose(1, 2);  // (2, 4, 5), non-contiguous
  o.mask_kind = MaskKind::kAdditive;
  EXPECT_TRUE(MatchesOracle(q, k, v, o));
}

// Weights are zero exactly where the causal rule blocks; everything matches the oracle.
void CheckCausal(Causal causal, int64_t tq, int64_t tk) {
  const Tensor q = randn({2, tq, 8}, 33), k = randn({2, tk, 8}, 34), v = randn({2, tk, 5}, 35);
  AttentionOptions o;
  o.causal = causal;
  o.return_weights = true;
  o.return_lse = true;
  EXPECT_TRUE(MatchesOracle(q, k, v, o));
  const AttentionResult r = attention_reference(q, k, v, o);
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t i = 0; i < tq; ++i)
      for (int64_t j = 0; j < tk; ++j) {
        const bool allowed = causal == Causal::kTopLeft ? j <= i : j <= i + tk - tq;
        if (allowed) {
          EXPECT_GT(r.weights.at({b, i, j}), 0.0f) << i << "," << j;
        } else {
          EXPECT_EQ(r.weights.at({b, i, j}), 0.0f) << i << "," << j;
        }
      }
}

TEST(Attention, CausalTopLeftSquare) { CheckCausal(Causal::kTopLeft, 6, 6); }
TEST(Attention, CausalTopLeftWhenTqLessThanTk) { CheckCausal(Causal::kTopLeft, 4, 9); }
TEST(Attention, CausalTopLeftWhenTqGreaterThanTk) { CheckCausal(Causal::kTopLeft, 9, 4); }
TEST(Attention, CausalBottomRightWhenTqLessThanTk) { CheckCausal(Causal::kBottomRight, 4, 9); }
TEST(Attention, CausalBottomRightWhenTqGreaterThanTk) { CheckCausal(Causal::kBottomRight, 9, 4); }

TEST(Attention, CausalBottomRightTopRowsFullyMaskedAreZeroNotNaN) {
  const int64_t tq = 7, tk = 3;  // rows i < Tq - Tk see no key
  AttentionOptions o;
  o.causal = Causal::kBottomRight;
  o.return_weights = o.return_lse = true;
  const AttentionResult r = attention_reference(randn({tq, 4}, 36), randn({tk, 4}, 37), randn({tk, 2}, 38), o);
  for (int64_t i = 0; i < tq - tk; ++i) {
    EXPECT_EQ(r.lse.at({i}), -kInf) << i;
    for (int64_t c = 0; c < 2; ++c) EXPECT_EQ(r.out.at({i, c}), 0.0f);
    for (int64_t j = 0; j < tk; ++j) EXPECT_EQ(r.weights.at({i, j}), 0.0f);
  }
  EXPECT_TRUE(std::isfinite(r.lse.at({tq - tk})));
  EXPECT_FALSE(has_nan(r.out) || has_nan(r.weights) || has_nan(r.lse));
}

TEST(Attention, CausalCombinesWithMask) {
  const Tensor q = randn({2, 6, 4}, 39), k = randn({2, 8, 4}, 40), v = randn({2, 8, 4}, 41);
  for (Causal c : {Causal::kTopLeft, Causal::kBottomRight}) {
    AttentionOptions o;
    o.causal = c;
    o.mask = bernoulli({2, 1, 8}, 0.6f, 42);
    o.mask_kind = MaskKind::kBlock;
    EXPECT_TRUE(MatchesOracle(q, k, v, o));
  }
}

using AttentionFn = AttentionResult (*)(const Tensor&, const Tensor&, const Tensor&, const AttentionOptions&);

// Perturbing k/v rows j >= t leaves every output row that cannot see them bit-identical.
// Checked on attention_reference and on attention() (whichever path it dispatches to).
void CheckNoLeak(Causal causal, int64_t tq, int64_t tk) {
  const Tensor q = randn({2, 2, tq, 8}, 43), k = randn({2, 2, tk, 8}, 44), v = randn({2, 2, tk, 6}, 45);
  AttentionOptions o;
  o.causal = causal;
  for (AttentionFn fn : {&attention_reference, &attention}) {
    const Tensor base = fn(q, k, v, o).out;
    for (int64_t t = 1; t < tk; ++t) {
      Tensor k2 = k.clone(), v2 = v.clone();
      k2.slice(2, t, tk).copy_from(randn({2, 2, tk - t, 8}, 46 + t));
      v2.slice(2, t, tk).copy_from(randn({2, 2, tk - t, 6}, 47 + t));
      const Tensor pert = fn(q, k2, v2, o).out;
      // Query row i sees keys j < end(i); rows with end(i) <= t are unaffected.
      int64_t checked = 0;
      for (int64_t i = 0; i < tq; ++i) {
        const int64_t end = causal == Causal::kTopLeft ? i + 1 : i + 1 + tk - tq;
        if (end > t) continue;
        ++checked;
        EXPECT_TRUE(bit_equal(base.slice(2, i, i + 1), pert.slice(2, i, i + 1))) << "row " << i << " t " << t;
      }
      if (checked < tq) {
        EXPECT_FALSE(bit_equal(base, pert)) << "perturbation had no effect at t " << t;
      }
    }
  }
}

TEST(Attention, CausalTopLeftDoesNotLeakFuture) { CheckNoLeak(Causal::kTopLeft, 9, 9); }
TEST(Attention, CausalBottomRightDoesNotLeakFuture) { CheckNoLeak(Causal::kBottomRight, 5, 9); }

TEST(Attention, FullyMaskedRowIsZeroNotNaN) {
  const Tensor q = randn({2, 4, 6}, 50), k = randn({2, 5, 6}, 51), v = randn({2, 5, 3}, 52);
  Tensor keep = Tensor::ones({2, 4, 5});
  for (int64_t j = 0; j < 5; ++j) keep.at({1, 2, j}) = 0.0f;  // row (1, 2) blocks every key
  Tensor add = Tensor::zeros({2, 4, 5});
  for (int64_t j = 0; j < 5; ++j) add.at({0, 3, j}) = -kInf;   // row (0, 3) all -inf
  Tensor block = Tensor::zeros({2, 4, 5});
  for (int64_t j = 0; j < 5; ++j) block.at({1, 0, j}) = 1.0f;  // row (1, 0) blocked
  const std::vector<std::pair<MaskKind, Tensor>> cases = {
      {MaskKind::kKeep, keep}, {MaskKind::kAdditive, add}, {MaskKind::kBlock, block}};
  const std::vector<std::pair<int64_t, int64_t>> rows = {{1, 2}, {0, 3}, {1, 0}};
  for (size_t c = 0; c < cases.size(); ++c) {
    AttentionOptions o;
    o.mask_kind = cases[c].first;
    o.mask = cases[c].second;
    o.return_weights = o.return_lse = true;
    const AttentionResult r = attention(q, k, v, o);
    const auto [b, i] = rows[c];
    EXPECT_EQ(r.lse.at({b, i}), -kInf);
    for (int64_t d = 0; d < 3; ++d) EXPECT_EQ(r.out.at({b, i, d}), 0.0f);
    for (int64_t j = 0; j < 5; ++j) EXPECT_EQ(r.weights.at({b, i, j}), 0.0f);
    EXPECT_FALSE(has_nan(r.out) || has_nan(r.weights) || has_nan(r.lse));
    EXPECT_TRUE(MatchesOracle(q, k, v, o));
  }
}

TEST(Attention, FullyMaskedRowStaysZeroWhenValuesHoldInf) {
  Tensor v = randn({3, 2}, 53);
  v.at({1, 0}) = kInf;
  AttentionOptions o;
  o.mask = Tensor::from_vector({2, 3}, {1, 0, 1, 0, 0, 0});
  o.mask_kind = MaskKind::kKeep;
  const Tensor out = attention_reference(randn({2, 4}, 54), randn({3, 4}, 55), v, o).out;
  EXPECT_EQ(out.at({1, 0}), 0.0f);
  EXPECT_EQ(out.at({1, 1}), 0.0f);
}

TEST(Attention, SeqLenOne) {
  const Tensor q = randn({3, 1, 5}, 56), k = randn({3, 1, 5}, 57), v = randn({3, 1, 4}, 58);
  AttentionOptions o;
  o.return_weights = o.return_lse = true;
  o.causal = Causal::kTopLeft;
  const AttentionResult r = attention(q, k, v, o);
  EXPECT_TRUE(bit_equal(r.out, v));  // the single weight is exactly 1
  for (float w : r.weights.to_vector()) EXPECT_EQ(w, 1.0f);
  EXPECT_TRUE(MatchesOracle(q, k, v, o));
}

TEST(Attention, OddSizes) {
  for (int64_t tq : {1, 3, 7}) {
    for (int64_t tk : {1, 5, 13}) {
      const Tensor q = randn({3, tq, 3}, 59 + tq), k = randn({3, tk, 3}, 60 + tk), v = randn({3, tk, 5}, 61);
      EXPECT_TRUE(MatchesOracle(q, k, v, {})) << tq << "x" << tk;
    }
  }
}

TEST(Attention, DkDiffersFromDv) {
  EXPECT_TRUE(MatchesOracle(randn({2, 6, 16}, 62), randn({2, 9, 16}, 63), randn({2, 9, 3}, 64), {}));
  EXPECT_TRUE(MatchesOracle(randn({2, 6, 2}, 65), randn({2, 9, 2}, 66), randn({2, 9, 33}, 67), {}));
}

TEST(Attention, UnbatchedRankTwo) {
  EXPECT_TRUE(MatchesOracle(randn({5, 8}, 68), randn({6, 8}, 69), randn({6, 7}, 70), {}));
}

TEST(Attention, BroadcastLeadingDims) {
  // One k/v head shared by every query head, and a q without batch against batched k/v.
  EXPECT_TRUE(MatchesOracle(randn({2, 4, 5, 8}, 71), randn({2, 1, 6, 8}, 72), randn({2, 1, 6, 3}, 73), {}));
  EXPECT_TRUE(MatchesOracle(randn({5, 8}, 74), randn({3, 6, 8}, 75), randn({6, 3}, 76), {}));
  EXPECT_TRUE(MatchesOracle(randn({3, 1, 5, 8}, 77), randn({4, 6, 8}, 78), randn({1, 4, 6, 2}, 79), {}));
}

TEST(Attention, EmptyBatchGivesEmptyOutput) {
  AttentionOptions o;
  o.return_weights = o.return_lse = true;
  const AttentionResult r = attention(randn({0, 4, 8}, 80), randn({0, 5, 8}, 81), randn({0, 5, 3}, 82), o);
  EXPECT_EQ(r.out.shape(), (Shape{0, 4, 3}));
  EXPECT_EQ(r.weights.shape(), (Shape{0, 4, 5}));
  EXPECT_EQ(r.lse.shape(), (Shape{0, 4}));
}

TEST(Attention, NonContiguousInputsMatchContiguous) {
  // Projections laid out (B, T, H, D), viewed as (B, H, T, D).
  const int64_t B = 2, H = 3, Tq = 5, Tk = 7, D = 8;
  const Tensor q = randn({B, Tq, H, D}, 83).transpose(1, 2);
  const Tensor k = randn({B, Tk, H, D}, 84).transpose(1, 2);
  const Tensor v = randn({B, Tk, H, D}, 85).transpose(1, 2);
  ASSERT_FALSE(q.is_contiguous());
  AttentionOptions o;
  o.causal = Causal::kBottomRight;
  o.return_weights = o.return_lse = true;
  const AttentionResult a = attention(q, k, v, o), b = attention(q.clone(), k.clone(), v.clone(), o);
  EXPECT_TRUE(bit_equal(a.out, b.out));
  EXPECT_TRUE(bit_equal(a.weights, b.weights));
  EXPECT_TRUE(bit_equal(a.lse, b.lse));
  EXPECT_TRUE(MatchesOracle(q, k, v, o));
}

TEST(Attention, StridedLastDimension) {
  const Tensor q = randn({2, 5, 16}, 86).slice(2, 0, 16, 2);  // last-dim stride 2
  const Tensor k = randn({2, 6, 24}, 87).slice(2, 1, 24, 3);
  const Tensor v = randn({2, 3, 6}, 88).transpose(1, 2);     // (2, 6, 3), last-dim stride 6
  ASSERT_EQ(q.size(-1), 8);
  ASSERT_EQ(k.size(-1), 8);
  EXPECT_TRUE(
      bit_equal(attention_reference(q, k, v).out, attention_reference(q.clone(), k.clone(), v.clone()).out));
  EXPECT_TRUE(MatchesOracle(q, k, v, {}));
}

TEST(Attention, ExpandedInputs) {
  const Tensor q = randn({1, 5, 4}, 89).expand({3, 5, 4});  // stride 0 batch
  const Tensor k = randn({6, 4}, 90).expand({3, 6, 4});
  const Tensor v = randn({3, 6, 2}, 91);
  EXPECT_TRUE(MatchesOracle(q, k, v, {}));
}

TEST(Attention, DefaultScaleIsOneOverSqrtDk) {
  const Tensor q = randn({4, 9}, 92), k = randn({6, 9}, 93), v = randn({6, 2}, 94);
  AttentionOptions third;
  third.scale = 1.0f / 3.0f;
  EXPECT_TRUE(AllClose(attention_reference(q, k, v).out, attention_reference(q, k, v, third).out, kAttnTol));
  EXPECT_FLOAT_EQ(attention_scale({}, 9), 1.0f / 3.0f);
  EXPECT_FLOAT_EQ(attention_scale(third, 100), 1.0f / 3.0f);
}

TEST(Attention, ScaleOneIsUnscaled) {
  const Tensor q = randn({4, 16}, 95), k = randn({6, 16}, 96), v = randn({6, 2}, 97);
  AttentionOptions one;
  one.scale = 1.0f;
  EXPECT_TRUE(MatchesOracle(q, k, v, one));
  // Unscaled scores are 4x the default ones here, so the results differ.
  EXPECT_FALSE(AllClose(attention_reference(q, k, v, one).out, attention_reference(q, k, v).out, kAttnTol));
}

TEST(Attention, ScalingQByCEqualsScaleTimesC) {
  const Tensor q = randn({2, 5, 8}, 98), k = randn({2, 7, 8}, 99), v = randn({2, 7, 3}, 100);
  for (float c : {0.25f, 2.0f, -1.5f}) {
    Tensor qc = q.clone();
    for (int64_t i = 0; i < qc.numel(); ++i) qc.data()[i] *= c;
    AttentionOptions scaled;
    scaled.scale = c / std::sqrt(8.0f);
    EXPECT_TRUE(AllClose(attention_reference(qc, k, v).out,
                         testing::to_double(attention_reference(q, k, v, scaled).out), kRoundingTol))
        << "c " << c;
  }
  AttentionOptions zero;  // scale 0: uniform weights, out = mean of v
  zero.scale = 0.0f;
  zero.return_weights = true;
  const AttentionResult r = attention_reference(q, k, v, zero);
  for (float w : r.weights.to_vector()) EXPECT_FLOAT_EQ(w, 1.0f / 7.0f);
}

TEST(Attention, LseMatchesLogSumExp) {
  const Tensor q = randn({3, 6, 8}, 101), k = randn({3, 10, 8}, 102), v = randn({3, 10, 4}, 103);
  AttentionOptions o;
  o.return_lse = true;
  o.scale = 3.0f;  // large scores: a naive exp would overflow the float sum
  const AttentionResult r = attention_reference(q, k, v, o);
  ASSERT_EQ(r.lse.shape(), (Shape{3, 6}));
  const testing::DTensor dq = testing::to_dtensor(q), dk = testing::to_dtensor(k);
  std::vector<double> ref;
  for (int64_t b = 0; b < 3; ++b)
    for (int64_t i = 0; i < 6; ++i) {
      double s = 0.0;
      for (int64_t j = 0; j < 10; ++j) {
        double dot = 0.0;
        for (int64_t c = 0; c < 8; ++c) dot += dq.data[(b * 6 + i) * 8 + c] * dk.data[(b * 10 + j) * 8 + c];
        s += std::exp(3.0 * dot);
      }
      ref.push_back(std::log(s));
    }
  EXPECT_TRUE(AllClose(r.lse, ref, kAttnTol));
}

TEST(Attention, RandomConfigSweep) {
  Rng rng(2024);
  for (int cfg = 0; cfg < 100; ++cfg) {
    const int64_t tq = 1 + static_cast<int64_t>(rng.below(12)), tk = 1 + static_cast<int64_t>(rng.below(12));
    const int64_t dk = 1 + static_cast<int64_t>(rng.below(9)), dv = 1 + static_cast<int64_t>(rng.below(9));
    const int64_t nlead = static_cast<int64_t>(rng.below(3));
    Shape lead;
    for (int64_t d = 0; d < nlead; ++d) lead.push_back(1 + static_cast<int64_t>(rng.below(3)));
    // Each operand drops some leading dims or sets them to 1 (broadcast).
    auto operand_lead = [&]() {
      Shape s = lead;
      if (!s.empty() && rng.bernoulli(0.3f)) s.erase(s.begin());
      for (auto& d : s)
        if (rng.bernoulli(0.25f)) d = 1;
      return s;
    };
    auto with = [](Shape s, int64_t a, int64_t b) {
      s.push_back(a);
      s.push_back(b);
      return s;
    };
    Tensor q = rng.normal(with(operand_lead(), tq, dk));
    Tensor k = rng.normal(with(operand_lead(), tk, dk));
    Tensor v = rng.normal(with(operand_lead(), tk, dv));
    if (rng.bernoulli(0.3f)) k = rng.normal(with(Shape(k.shape().begin(), k.shape().end() - 2), dk, tk))
                                     .transpose(-1, -2);  // column-major view
    AttentionOptions o;
    o.causal = static_cast<Causal>(rng.below(3));
    o.mask_kind = static_cast<MaskKind>(rng.below(4));
    if (o.mask_kind != MaskKind::kNone) {
      // Broadcastable to (batch..., Tq, Tk): some leading dims dropped or 1.
      const Shape batch = broadcast_shapes(
          broadcast_shapes(testing::lead_of(q.shape()), testing::lead_of(k.shape()), "sweep"),
          testing::lead_of(v.shape()), "sweep");
      Shape ms = batch;
      for (auto& d : ms)
        if (rng.bernoulli(0.4f)) d = 1;
      if (!ms.empty() && rng.bernoulli(0.3f)) ms.erase(ms.begin());
      ms.push_back(rng.bernoulli(0.5f) ? tq : 1);
      ms.push_back(tk);
      o.mask = o.mask_kind == MaskKind::kAdditive ? rng.normal(ms) : rng.bernoulli(ms, 0.7f);
    }
    if (rng.bernoulli(0.5f)) o.scale = rng.uniform(-2.0f, 2.0f);
    EXPECT_TRUE(MatchesOracle(q, k, v, o))
        << "config " << cfg << ": q " << str(q.shape()) << " k " << str(k.shape()) << " v " << str(v.shape())
        << " mask " << (o.mask.defined() ? str(o.mask.shape()) : "-") << " kind " << static_cast<int>(o.mask_kind)
        << " causal " << static_cast<int>(o.causal);
  }
}

// ---- error paths: std::invalid_argument, message names the op and the shapes ----

void ExpectAttentionError(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& o,
                          const std::vector<std::string>& needles) {
  EXPECT_THROW(attention(q, k, v, o), std::invalid_argument);
  EXPECT_THROW(attention_check(q, k, v, o, "attention"), std::invalid_argument);
  for (const std::string& n : needles) {
    EXPECT_TRUE(ThrowsArg([&] { attention(q, k, v, o); }, n));
    EXPECT_TRUE(ThrowsArg([&] { attention_reference(q, k, v, o); }, n));
  }
}

TEST(AttentionErrors, RankBelowTwo) {
  ExpectAttentionError(Tensor::ones({4}), randn({3, 4}, 1), randn({3, 2}, 2), {},
                       {"[attention]", "q (4,)", "rank"});
  ExpectAttentionError(randn({2, 4}, 1), Tensor::ones({4}), randn({3, 2}, 2), {},
                       {"[attention]", "k (4,)", "rank"});
  ExpectAttentionError(randn({2, 4}, 1), randn({3, 4}, 2), Tensor::ones({3}), {},
                       {"[attention]", "v (3,)", "rank"});
}

TEST(AttentionErrors, UndefinedInput) {
  ExpectAttentionError(Tensor(), randn({3, 4}, 1), randn({3, 2}, 2), {}, {"[attention]", "defined"});
}

TEST(AttentionErrors, HeadDimMismatch) {
  ExpectAttentionError(randn({2, 4, 10, 16}, 1), randn({2, 4, 12, 8}, 2), randn({2, 4, 12, 8}, 3), {},
                       {"[attention] q (2, 4, 10, 16) and k (2, 4, 12, 8) must have the same last dimension"});
}

TEST(AttentionErrors, KeyValueLengthMismatch) {
  ExpectAttentionError(randn({2, 10, 8}, 1), randn({2, 12, 8}, 2), randn({2, 11, 8}, 3), {},
                       {"[attention]", "k (2, 12, 8)", "v (2, 11, 8)"});
}

TEST(AttentionErrors, BatchDimsDoNotBroadcast) {
  ExpectAttentionError(randn({2, 3, 4, 8}, 1), randn({2, 2, 5, 8}, 2), randn({2, 2, 5, 8}, 3), {},
                       {"[attention]", "(2, 3, 4, 8)", "(2, 2, 5, 8)", "broadcast"});
  ExpectAttentionError(randn({3, 4, 8}, 1), randn({3, 5, 8}, 2), randn({2, 5, 8}, 3), {},
                       {"[attention]", "v (2, 5, 8)"});
}

TEST(AttentionErrors, EmptySizes) {
  ExpectAttentionError(randn({0, 8}, 1), randn({5, 8}, 2), randn({5, 3}, 3), {}, {"[attention]", "(0, 8)"});
  ExpectAttentionError(randn({4, 8}, 1), randn({0, 8}, 2), randn({0, 3}, 3), {}, {"[attention]", "(0, 8)"});
  ExpectAttentionError(randn({4, 0}, 1), randn({5, 0}, 2), randn({5, 3}, 3), {}, {"[attention]", "(4, 0)"});
  ExpectAttentionError(randn({4, 8}, 1), randn({5, 8}, 2), randn({5, 0}, 3), {}, {"[attention]", "(5, 0)"});
}

TEST(AttentionErrors, MaskWithKindNone) {
  AttentionOptions o;
  o.mask = Tensor::ones({4, 5});
  ExpectAttentionError(randn({4, 8}, 1), randn({5, 8}, 2), randn({5, 3}, 3), o,
                       {"[attention]", "mask (4, 5)", "kNone"});
}

TEST(AttentionErrors, KindWithoutMask) {
  for (MaskKind kind : {MaskKind::kKeep, MaskKind::kBlock, MaskKind::kAdditive}) {
    AttentionOptions o;
    o.mask_kind = kind;
    ExpectAttentionError(randn({4, 8}, 1), randn({5, 8}, 2), randn({5, 3}, 3), o,
                         {"[attention]", "needs a mask"});
  }
}

TEST(AttentionErrors, MaskDoesNotBroadcast) {
  const std::vector<Shape> bad = {{4, 6}, {3, 5}, {3, 2, 4, 5}, {6}, {2, 1, 1, 4, 5}};
  for (const Shape& s : bad) {
    AttentionOptions o;
    o.mask = Tensor::ones(s);
    o.mask_kind = MaskKind::kKeep;
    ExpectAttentionError(randn({2, 3, 4, 8}, 1), randn({2, 3, 5, 8}, 2), randn({2, 3, 5, 3}, 3), o,
                         {"[attention]", "mask " + str(s), "(2, 3, 4, 5)"});
  }
}

TEST(AttentionErrors, NonFiniteScale) {
  for (float s : {kInf, -kInf, std::numeric_limits<float>::quiet_NaN()}) {
    AttentionOptions o;
    o.scale = s;
    ExpectAttentionError(randn({4, 8}, 1), randn({5, 8}, 2), randn({5, 3}, 3), o,
                         {"[attention]", "scale", "finite"});
    EXPECT_TRUE(ThrowsArg([&] { attention_scale(o, 8); }, "[attention]"));
  }
}

}  // namespace
}  // namespace qkv
